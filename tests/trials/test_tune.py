"""parallax tune on a script as users write one: trials of the ranked layouts, a table and a plot, the fastest
stored, and the next plain run trains with it, equal to single-device training."""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest

from tests.multiprocess.harness import leftover_processes, run_command
from tests.trials.programs import batches, build

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tune_script.py")
PARALLAX = os.path.join(os.path.dirname(sys.executable), "parallax")
STEPS = 9


def single_device_w(steps: int, replicas: int) -> np.ndarray:
    import tensorflow as tf

    graph, t = build(0.1)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(steps):
            x, y = batches(step, replicas)
            sess.run(t["train_op"], feed_dict={t["x"]: x, t["y"]: y})
        return sess.run(t["w"]).ravel()


def tune(tmp_path, *options: str):
    (tmp_path / "res").write_text("localhost: cpu:0,cpu:1\n")
    env = {"PARALLAX_CACHE_DIR": str(tmp_path / "cache"), "PARALLAX_USE_TUNED": "1"}  # the suite turns it off
    return env, run_command(tmp_path, [PARALLAX, "tune", SCRIPT, "res", "--steps", "1,3", "-o", "tuned", *options,
                                       "--", "res", "--steps", "12"], timeout=400, env=env)


# (the trial runner's Dask backend runs whole jobs in tests/trials/test_sweep.py: here local processes alone, for
# CI's time)
@pytest.mark.parametrize("backend", ["local"])
def test_tune_measures_layouts_keeps_the_fastest_and_the_next_run_uses_it(tmp_path, backend):
    env, run = tune(tmp_path, "--trials", "3", "--space", "run_option=MPI,PS", "--space", "fusion_bytes=0,67108864",
                    "--space", "zero_stage=0", "--space", "pipeline_stages=1", "--backend", backend)
    assert run.returncode == 0, run.output[-5000:]
    results = json.loads((tmp_path / "tuned" / "results.json").read_text())
    trials = results["trials"]
    assert len(trials) == 3 and all(t["status"] == "ok" and t["step_ms"] > 0 for t in trials)
    # the cheapest layout of each kind first: one process (PS, both replicas in it), then MPI's two processes;
    # then the one the measurements and the model together rank next
    assert {t["layout"] for t in trials[:2]} == {"local", "MPI"} and [t["model_order"] for t in trials[:2]] == [1, 2]
    best = results["best"]
    assert best["step_ms"] == min(t["step_ms"] for t in trials)
    assert f"* {best['trial'].rsplit('-', 1)[-1]}" in run.output  # the table marks it
    assert "fastest: " in run.output and "the cost model's #" in run.output
    assert (tmp_path / "tuned" / "tune.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "tuned" / "results.csv").read_text().count("\n") == 4
    stored = json.loads((tmp_path / "cache" / "tuned.json").read_text())
    (entry,) = stored.values()
    assert entry["choice"]["run_option"] in ("MPI", "PS") and entry["model_rank"] == best["model_order"]
    # the launched ranks apply the stored choice too (it reached none from 2026-12-03 to 12-04, unseen while the
    # one-process layout won): whichever won, the next run is MPI's two processes
    if entry["choice"]["run_option"] != "MPI":
        entry["choice"] = {"run_option": "MPI", "fusion_bytes": 67108864, "backend": "mpi"}
        (tmp_path / "cache" / "tuned.json").write_text(json.dumps(stored))

    (tmp_path / "out").mkdir()
    again = run_command(tmp_path, [sys.executable, SCRIPT, "res", "--steps", str(STEPS), "--out", "out"], env=env)
    assert again.returncode == 0, again.output[-4000:]
    # the config left to Parallax: the tuned run option replaces its default (None), said with both values
    assert re.search(r"Parallax: using the layout parallax tune found for this graph and resources \(\S+tuned\.json "
                     r"\([0-9a-f]{12}\); PARALLAX_USE_TUNED=0 ignores it\): it replaces \d of the script's settings: "
                     r"Config\.run_option None -> 'MPI'", again.output), again.output[-4000:]
    written = [json.loads(p.read_text()) for p in sorted((tmp_path / "out").glob("w_*.json"))]
    assert len(written) == 2
    expected = single_device_w(STEPS, 2)
    for w in written:
        np.testing.assert_allclose(w["w"], expected, rtol=1e-5, atol=1e-6)
    assert not leftover_processes(tmp_path)


@pytest.mark.core
def test_a_script_that_cannot_plan_is_reported_with_its_output(tmp_path):
    (tmp_path / "res").write_text("localhost: cpu:0,cpu:1\n")
    run = run_command(tmp_path, [PARALLAX, "tune", SCRIPT, "res", "-o", "tuned", "--", "--steps", "3"])
    assert run.returncode == 1
    assert "did not plan its layouts: exited with 2" in run.output
    assert "the following arguments are required: resource_info" in run.output  # the script's own words


def test_a_tuned_partition_count_rebuilds_the_graph_and_trains_equal_to_single_device(tmp_path):
    """The tune keeps a partition count; the next plain run builds its graph again with it (the script runs
    once more in its process) and trains equal to one device with that many partitions."""
    from tests.models import DATA, build_sequence, train_single_device
    from tests.multiprocess.harness import SCRIPT as TRAIN_SCRIPT
    from tests.multiprocess.test_mpi_mode import check_ranks_match

    (tmp_path / "res").write_text("localhost: cpu:0,cpu:1\n")
    env = {"PARALLAX_CACHE_DIR": str(tmp_path / "cache"), "PARALLAX_USE_TUNED": "1"}
    script_args = ["--resource_info", "res", "--model", "sequence", "--average_sparse", "--batch", "12"]
    run = run_command(tmp_path, [PARALLAX, "tune", TRAIN_SCRIPT, "res", "--trials", "1", "--steps", "1,2",
                                 "--space", "run_option=MPI", "--space", "partitions=4", "--space", "backend=mpi",
                                 "--space", "fusion_bytes=67108864", "--space", "zero_stage=0", "--space",
                                 "pipeline_stages=1", "-o", "tuned", "--", *script_args, "--steps", "8",
                                 "--out", "trial_out"], timeout=400, env=env)
    assert run.returncode == 0, run.output[-4000:]
    again = run_command(tmp_path, [sys.executable, TRAIN_SCRIPT, *script_args, "--steps", "6", "--out", "out"],
                        out_dir=tmp_path / "out", env=env)
    assert again.returncode == 0, again.output[-4000:]
    # the script sets run_option MPI and fusion_bytes 64 MiB itself, its sequence model 2 partitions
    assert re.search(r"using the layout parallax tune found for this graph and resources \(.*\): it replaces 2 of "
                     r"the script's settings: MPIConfig\.backend 'auto' -> 'mpi', get_partitioner's partition count "
                     r"2 -> 4\n",
                     again.output), again.output[-4000:]
    check_ranks_match(again, train_single_device(build_sequence("adam", partitions=4), DATA["sequence"](6, 12)), 2)
