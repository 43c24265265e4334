"""TensorFlow 2 training steps (a ``tf.function`` with a ``GradientTape``, tests/tf2/programs.py) trained by
``parallel_run`` in every mode, on 2 processes and with 2 replicas in one process (on 3: test_tf2_idioms.py),
against eager training of the same step on one device with the union batch: every trained variable (written
back into the program's own variables), and every step's loss (the mean of the replicas' losses)."""

from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np
import pytest

from tests.multiprocess.harness import LAYOUTS, ROOT, ScriptJobs
from tests.requirements import unavailable
from tests.tf2.programs import MORE_OPTIMIZERS, PLAIN, eager

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "step_script.py")
STEPS = 4
# group: (resource file, run option, processes that write results, replicas each)
# (HYBRID-3 repeated HYBRID-2's and MPI-3's mechanisms, MPI-3 what tests/multiprocess/test_tf2_idioms.py's
# steps on 3 processes run in every form, and AUTO-2 one of the layouts here (AUTO's choice for TF2 steps:
# test_tf2_idioms.py, test_tf2_keras_programs.py): out, for CI's time)
GROUPS = {g: LAYOUTS[g] for g in ("MPI-2", "PS-2", "HYBRID-2", "local-2-replicas")}
CORE = "MPI-2"  # make test's job (tests/conftest.py); the other layouts in make test-extended
# the other optimizers: every update on a server (PS; HYBRID's sparse updates there, the same ops, out for CI's
# time, 2026-12-04: 84 s)
OPTIMIZER_GROUPS = ("PS-2",)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    if importlib.util.find_spec("tf_keras") is None:
        unavailable("tf_keras is not installed (the tf_keras cases need it)",
                    "`make test` installs it (pip install --no-deps tf_keras)")
    return ScriptJobs(tmp_path_factory, SCRIPT, {group: (text, ["--run_option", option, "--steps", str(STEPS)])
                                                 for group, (text, option, _, _) in GROUPS.items()}, list(PLAIN))


@pytest.fixture(scope="module")
def optimizer_jobs(tmp_path_factory):
    return ScriptJobs(tmp_path_factory, SCRIPT, {group: (GROUPS[group][0], ["--run_option", GROUPS[group][1], "--steps",
                                                                            str(STEPS)]) for group in OPTIMIZER_GROUPS},
                      list(MORE_OPTIMIZERS))


@functools.cache
def reference(case: str):
    return eager(case, STEPS)


@pytest.mark.parametrize("case", list(PLAIN))
@pytest.mark.parametrize("group", [pytest.param(g, marks=[pytest.mark.xdist_group(f"tf2-{g}")]
                                                + [pytest.mark.core] * (g == CORE))
                                   for g in GROUPS])
def test_a_tf_function_step_trains_as_eager_training_on_one_device(jobs, group, case):
    check_against_eager(jobs.case(group, case), group, case)


@pytest.mark.parametrize("case", list(MORE_OPTIMIZERS))
@pytest.mark.parametrize("group", [pytest.param(g, marks=[pytest.mark.xdist_group(f"tf2-optimizers-{g}")])
                                   for g in OPTIMIZER_GROUPS])
def test_a_step_with_any_optimizer_trains_as_eager_training_on_one_device(optimizer_jobs, group, case):
    check_against_eager(optimizer_jobs.case(group, case), group, case)


def check_against_eager(out: str, group: str, case: str, expected: tuple | None = None) -> None:
    """Every trained variable on every process (and every optimizer variable, when ``expected`` holds them as
    its third item: ``(losses, variables, optimizer variables)``, else this module's reference), and the mean
    of the replicas' losses each step."""
    losses, values, *state = expected if expected is not None else reference(case)
    _, _, processes, replicas = LAYOUTS[group]
    seen = []
    for rank in range(processes):
        with np.load(os.path.join(out, f"rank_{rank}.npz")) as got:
            for i, value in enumerate(values):
                np.testing.assert_allclose(got[f"v{i}"], value, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{group} {case} rank {rank}: variable {i}")
            for i, value in enumerate(state[0] if state else []):
                np.testing.assert_allclose(got[f"o{i}"], value, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{group} {case} rank {rank}: optimizer variable {i}")
            assert got["losses"].shape == (len(losses), replicas)  # one row a step
            seen.append(got["losses"])
    np.testing.assert_allclose(np.concatenate(seen, axis=1).mean(axis=1), losses, rtol=1e-5,
                               err_msg=f"{group} {case}: the mean of the replicas' losses")


# ZeRO (with the optimizers whose updates it shards: Keras 3's are refused, tests/unit/rewrite/test_zero.py) and
# pipeline stages with micro-batches: group -> (resource file, options, cases)
MECHANISMS = {
    "MPI-2-zero1": ("localhost: cpu:0,cpu:1\n", ["--run_option", "MPI", "--config", '{"zero_stage": 1}'],
                    ["module-v1-adam", "tfkeras-legacy-adam"]),
    "MPI-2-pipeline": ("localhost: cpu:0,cpu:1,cpu:2,cpu:3\n",
                       ["--run_option", "MPI", "--config", '{"pipeline_stages": 2, "micro_batches": 3}'],
                       ["keras3-adam", "module-v1-adam", "keras3-draws"]),
}


@pytest.fixture(scope="module")
def mechanism_jobs(tmp_path_factory):
    return {group: ScriptJobs(tmp_path_factory, SCRIPT, {group: (text, [*options, "--steps", str(STEPS)])}, cases)
            for group, (text, options, cases) in MECHANISMS.items()}


@pytest.mark.parametrize("group, case", [pytest.param(g, c, marks=pytest.mark.xdist_group(f"tf2-{g}"), id=f"{c}-{g}")
                                         for g, (_, _, cases) in MECHANISMS.items() for c in cases])
def test_a_tf_function_step_with_zero_or_pipeline_stages_trains_as_eager_training(mechanism_jobs, group, case):
    out = mechanism_jobs[group].case(group, case)
    _, values = reference(case)
    ranks = sorted(f for f in os.listdir(out) if f.startswith("rank_"))
    assert len(ranks) == 2, ranks
    for rank in ranks:
        with np.load(os.path.join(out, rank)) as got:
            for i, value in enumerate(values):
                np.testing.assert_allclose(got[f"v{i}"], value, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{group} {case} {rank}: variable {i}")
