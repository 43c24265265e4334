"""Checkpoints under single-device names: save in one mode, restore in plain TensorFlow and in
another mode; a killed job resumes from the last saved global step. User hooks in every mode."""

from __future__ import annotations

import glob
import json
import re

import numpy as np
import pytest
import tensorflow as tf

from tests.models import BUILDERS, DATA, build_sequence, train_single_device, variable_values
from tests.multiprocess.harness import run_script
from tests.multiprocess.test_mpi_mode import BATCH, check_ranks_match, resources

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def restore_single_device(model_name: str, ckpt_dir: str) -> dict[str, np.ndarray]:
    """Restore into the plain single-device graph (the sequence model without partitions)."""
    model = build_sequence("adam", partitions=None) if model_name == "sequence" else BUILDERS[model_name]("adam")
    with model.graph.as_default(), tf.compat.v1.Session(graph=model.graph) as sess:
        tf.compat.v1.train.Saver().restore(sess, tf.train.latest_checkpoint(ckpt_dir))
        return variable_values(sess, model.graph)


@pytest.mark.parametrize("model", ["sequence"])  # partitioned variables and an embedding (alone: CI's time)
def test_mpi_checkpoint_restores_into_plain_tensorflow_and_into_ps_mode(tmp_path, model):
    ckpt = str(tmp_path / "ckpt")
    run = run_script(tmp_path / "mpi", resources(2), "--model", model, "--average_sparse", "--steps", "4",
                     "--ckpt_dir", ckpt, "--save_steps", "2")
    assert run.returncode == 0, run.output[-4000:]
    trained = run.rank_values(0)
    names = {name for name, _ in tf.train.list_variables(ckpt)}
    assert names == {n for n in trained if "/part_" not in n} | ({"embedding", "embedding/Adam", "embedding/Adam_1"}
                                                                 if model == "sequence" else set())
    restored = restore_single_device(model, ckpt)  # partitions joined: the plain graph is unpartitioned
    for name, value in restored.items():
        parts = [trained[f"{name}/part_{i}"] for i in range(2)] if f"{name}/part_0" in trained else \
            [trained[name.replace("embedding/", f"embedding/part_{i}/")] for i in range(2)] \
            if name.startswith("embedding/") and "embedding/part_0/Adam" in trained else [trained[name]]
        np.testing.assert_allclose(value, np.concatenate(parts) if len(parts) > 1 else parts[0], rtol=1e-6,
                                   err_msg=name)
    assert restored["global_step"] == 4
    # another mode, another number of workers: PS with one worker of three replicas, and 3 HYBRID ranks
    again = run_script(tmp_path / "ps", "localhost: cpu:0,cpu:1,cpu:2\n", "--run_option", "PS",
                       "--model", model, "--average_sparse", "--steps", "0", "--ckpt_dir", ckpt)
    assert "worker 0 starts at global step 4" in again.output
    check_ranks_match(again, trained, 1)
    hybrid = run_script(tmp_path / "hybrid", resources(3), "--run_option", "HYBRID", "--model", model,
                        "--average_sparse", "--steps", "0", "--ckpt_dir", ckpt)
    check_ranks_match(hybrid, trained, 3)


@pytest.mark.parametrize("run_option", ["MPI", pytest.param("HYBRID", marks=pytest.mark.core)])
def test_a_killed_job_resumes_from_the_last_saved_step_and_ends_as_if_never_stopped(tmp_path, run_option):
    """Killed during step 8 of 9 (checkpoints every 3 steps), the job restarts from the checkpoint of step 6
    and trains the batches of steps 7 to 9: the checkpoint holds single-device training's values after 6
    steps, and every variable of the resumed job (Adam's slots and powers too) ends as uninterrupted
    single-device training of the same 9 batches does."""
    ckpt = str(tmp_path / "ckpt")
    common = ["--run_option", run_option, "--model", "embedding", "--average_sparse", "--batch", str(BATCH),
              "--ckpt_dir", ckpt, "--save_steps", "3"]
    killed = run_script(tmp_path / "first", resources(2), *common, "--steps", "9", "--kill_rank", "1",
                        "--kill_step", "7")
    assert killed.returncode != 0
    saved = int(re.search(r"model\.ckpt-(\d+)", tf.train.latest_checkpoint(ckpt)).group(1))
    assert saved == 6, killed.output[-4000:]  # saves at 3 and 6; killed during step 8
    batches = DATA["embedding"](9, BATCH)
    at_6 = train_single_device(BUILDERS["embedding"]("adam"), batches[:6])
    for name, value in restore_single_device("embedding", ckpt).items():
        np.testing.assert_allclose(value, at_6[name], rtol=1e-5, atol=1e-6, err_msg=f"checkpoint 6: {name}")
    resumed = run_script(tmp_path / "second", resources(2), *common, "--steps", "3", "--data_from_global_step")
    assert resumed.returncode == 0, resumed.output[-4000:]
    assert "worker 0 starts at global step 6" in resumed.output
    assert "worker 1 starts at global step 6" in resumed.output
    uninterrupted = train_single_device(BUILDERS["embedding"]("adam"), batches)
    assert uninterrupted["global_step"] == 9
    check_ranks_match(resumed, uninterrupted, 2)


OBSERVED = {"MPI": resources(2), "PS": "localhost: cpu:0\nlocalhost: cpu:1\n", "HYBRID": resources(2)}


@pytest.fixture(scope="module")
def observed(tmp_path_factory):
    """One job per mode with the user's hook, ``sess_config`` and profiling at once, which the hook and the
    profile tests both read: ``observed(run_option)`` is ``(the job's directory, its Run)``."""
    runs = {}

    def run(run_option: str):
        if run_option not in runs:
            tmp = tmp_path_factory.mktemp(f"observed-{run_option}")
            runs[run_option] = tmp, run_script(
                tmp, OBSERVED[run_option], "--run_option", run_option, "--model", "embedding", "--steps", "4",
                "--count_hook", "--sess_threads", "3", "--profile_dir", str(tmp / "prof"), "--profile_steps", "2")
        return runs[run_option]

    return run


@pytest.mark.parametrize("run_option", [pytest.param(m, marks=pytest.mark.xdist_group(f"observed-{m}"))
                                        for m in OBSERVED])
def test_user_hooks_and_sess_config_in_every_worker(observed, run_option):
    tmp_path, run = observed(run_option)
    assert run.returncode == 0, run.output[-4000:]
    reports = [open(p).read().split() for p in glob.glob(str(tmp_path / "out" / "hook_*.txt"))]
    assert len(reports) == 2  # one per worker process
    assert all(int(runs) >= 4 for runs, _ in reports)  # the hook saw every step
    assert all(threads == "3" for _, threads in reports)  # the session was made with the user's sess_config


@pytest.mark.parametrize("run_option", [pytest.param(m, marks=pytest.mark.xdist_group(f"observed-{m}"))
                                        for m in ("MPI", "HYBRID")])
def test_every_worker_profiles_its_steps(observed, run_option):
    tmp_path, run = observed(run_option)
    prof = tmp_path / "prof"
    assert run.returncode == 0, run.output[-4000:]
    for worker in (0, 1):
        trace = json.loads((prof / f"worker_{worker}" / "timeline_step_2.json").read_text())
        assert trace["traceEvents"]
        summary = (prof / f"worker_{worker}" / "summary_step_2.txt").read_text()
        communication = float(re.search(r"communication: ([\d.]+) ms", summary).group(1))
        assert communication > 0  # the all-reduce / server ops are counted as communication
