"""Sharded optimizer states (``zero_stage``, ZeRO stages 1 and 2) across real processes.

Every case trains a few steps on worker processes that each keep and update their part of
every dense variable's slots, and is compared, variable by variable, with single-device
training on the union batch: the variables on every worker, and the slots through the
checkpoint the job saves (the workers' parts gathered, under the single-device names),
restored into the plain single-device graph. A checkpoint restores into a ZeRO job of another
worker count, which then trains on as one device would.
"""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from parallax.analysis import analyse_graph
from tests.models import train_single_device
from tests.multiprocess.harness import SharedJobs, run_script
from tests.multiprocess.test_mpi_mode import BATCH, STEPS, check_ranks_match, resources
from tests.multiprocess.train_script import BUILDERS, DATA

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

# case: (model, optimizer, zero stage, clip by global norm)
CASES = {
    "adam-1": ("mlp", "adam", 1, None),
    "adam-2": ("mlp", "adam", 2, None),
    "momentum-2-clipped": ("mlp", "momentum", 2, 0.05),
    "adagrad-1-clipped": ("mlp", "adagrad", 1, 0.05),
    "rmsprop-2": ("mlp", "rmsprop", 2, None),
    "ref-variables-adam-2": ("mlp_ref", "adam", 2, None),
    "embedding-adam-2": ("embedding", "adam", 2, None),
    "idioms-1": ("everything", "adagrad", 1, None),
    "two-optimizers-2": ("two_optimizers", "adam", 2, None),
    "sgd-1": ("mlp", "gd", 1, None),  # plain SGD has no slots: nothing to shard, it trains as MPI
}


def options(case: str) -> list[str]:
    model, optimizer, stage, clip = CASES[case]
    return ["--model", model, "--optimizer", optimizer, "--zero_stage", str(stage)] + \
        (["--clip", str(clip)] if clip else [])


# every case saves its checkpoint after its last step into <case>/ckpt
COMMON = ["--steps", str(STEPS), "--batch", str(BATCH), "--average_sparse", "--ckpt_dir", "out",
          "--save_steps", str(STEPS)]
GROUPS = {
    # two workers: every case; three: parts padded (the variables' sizes are not multiples of 3)
    "MPI-2": (resources(2), COMMON + ["--run_option", "MPI"], {c: options(c) for c in CASES}),
    "MPI-3": (resources(3), COMMON + ["--run_option", "MPI"],
              {c: options(c) for c in ("adam-2", "momentum-2-clipped", "adagrad-1-clipped", "idioms-1")}),
    # HYBRID: the sparse variables on a server, the dense ones all-reduced and sharded
    "HYBRID-3": (resources(3), COMMON + ["--run_option", "HYBRID"],
                 {c: options(c) for c in ("embedding-adam-2", "idioms-1")}),
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return SharedJobs(tmp_path_factory, GROUPS)


def build(case: str):
    model_name, optimizer, _, clip = CASES[case]
    return BUILDERS[model_name](optimizer, clip=clip) if clip else BUILDERS[model_name](optimizer)


def single_device(case: str, steps: int = STEPS) -> dict[str, np.ndarray]:
    """Single-device values of every variable, the optimizer slots included."""
    return train_single_device(build(case), DATA[CASES[case][0]](steps, BATCH))


def expected(case: str) -> dict[str, np.ndarray]:
    """Single-device values of every variable but the optimizer slots (which no worker holds whole)."""
    slots = {v.name for v in analyse_graph(build(case).graph).variables if v.slot_of}
    return {k: v for k, v in single_device(case).items() if k not in slots}


def restored(case: str, ckpt_dir: str) -> dict[str, np.ndarray]:
    """The latest checkpoint of ``ckpt_dir`` restored into the plain single-device graph."""
    from tests.models import variable_values

    model = build(case)
    with model.graph.as_default(), tf.compat.v1.Session(graph=model.graph) as sess:
        tf.compat.v1.train.Saver().restore(sess, tf.train.latest_checkpoint(ckpt_dir))
        return variable_values(sess, model.graph)


def check_checkpoint(ckpt_dir: str, case: str, reference: dict[str, np.ndarray]) -> None:
    """Every variable of the checkpoint, slots included, equals ``reference``."""
    got = restored(case, ckpt_dir)
    assert sorted(got) == sorted(reference)
    for name, value in reference.items():
        np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=f"{case} checkpoint: {name}")


def grouped(group: str, case: str):
    return pytest.param(group, case, id=f"{group}-{case}", marks=pytest.mark.xdist_group(f"zero-{group}"))


@pytest.mark.parametrize("group, case", [grouped(g, c) for g in GROUPS for c in GROUPS[g][2]])
def test_sharded_optimizer_states_train_and_save_as_one_device(jobs, group, case):
    run = jobs.case(group, case)
    check_ranks_match(run, expected(case), int(GROUPS[group][0].count("cpu:")))
    check_checkpoint(os.path.join(run.out_dir, "ckpt"), case, single_device(case))


@pytest.mark.parametrize("case, first, then", [
    ("adam-1", 2, 3), ("momentum-2-clipped", 3, 2)],
    ids=["adam-stage-1-from-2-to-3-workers", "momentum-stage-2-from-3-to-2-workers"])
def test_a_zero_checkpoint_resumes_on_another_worker_count_as_one_device_would(tmp_path, case, first, then):
    """Saved by ``first`` workers after 3 steps, restored by ``then`` (each takes its part of every slot),
    trained 3 more steps on the batches of those global steps: every variable, and every slot in the
    second job's checkpoint, equals uninterrupted single-device training of the 6 batches."""
    ckpt = str(tmp_path / "ckpt")
    common = [*options(case), "--batch", str(BATCH), "--average_sparse", "--ckpt_dir", ckpt, "--save_steps", "3",
              "--run_option", "MPI"]
    saved = run_script(tmp_path / "first", resources(first), *common, "--steps", "3")
    assert saved.returncode == 0, saved.output[-4000:]
    check_checkpoint(ckpt, case, single_device(case, 3))
    resumed = run_script(tmp_path / "second", resources(then), *common, "--steps", "3", "--data_from_global_step")
    assert resumed.returncode == 0, resumed.output[-4000:]
    assert "worker 0 starts at global step 3" in resumed.output
    uninterrupted = single_device(case, 6)
    slots = {v.name for v in analyse_graph(build(case).graph).variables if v.slot_of}
    check_ranks_match(resumed, {k: v for k, v in uninterrupted.items() if k not in slots}, then)
    check_checkpoint(ckpt, case, uninterrupted)
