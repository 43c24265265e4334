"""Mixed precision in TensorFlow 2 steps (tests/tf2/programs.py's ``MIXED`` cases) trained by ``parallel_run`` in
every mode, against eager training of the same step on one device with the union batch: Keras 3's
``LossScaleOptimizer`` (dynamic; its inner optimizer also clipping by the global norm, inside the loss scale's
cond) and tf_keras' (dynamic, and fixed: ``dynamic=False``), the ``mixed_float16`` policy with and without loss
scaling (Keras 3's; tf_keras', with), and ``mixed_bfloat16``. Every trained variable, the optimizer's state (its
slots, iteration, the loss scale and its counter) and every step's loss (the mean of the replicas') are compared.

In the ``*-overflow`` cases the second step's batch has one huge label in its last row, which is in the last
replica's part only: that replica's scaled gradient overflows, so the sum of the replicas' gradients does, and
every replica skips the step and halves the loss scale, as one device does on the union batch (its loss is inf).

Tolerances. float32 compute: rtol 1e-5 (as the other TF2 steps). float16 / bfloat16 compute: each replica runs
its part of the batch in the policy's type where one device runs the whole batch, so the sums over examples are
rounded differently, by a few units of that type's roundoff (float16: 2**-11 = 4.9e-4, bfloat16: 2**-8 = 3.9e-3);
the gradients reach the float32 variables with that relative error. Variables and losses: rtol and atol of about
two to four units: 2e-3 / 1e-3 (float16), 1e-2 (bfloat16), losses rtol 2e-3 / 1e-2. Measured (2 and 3 processes,
2 replicas, 4 Adam steps): at most 3.6e-4 (float16) and 3.2e-3 (bfloat16) on the variables, 2.1e-4 and 5.1e-4
relative on the losses; 1.2e-7 in float32. The overflow decision itself is exact.
"""

from __future__ import annotations

import functools
import importlib.util
import os

import numpy as np
import pytest

from tests.multiprocess.harness import LAYOUTS, ROOT, ScriptJobs
from tests.requirements import unavailable
from tests.tf2.programs import DYNAMIC_SCALE, MIXED, OVERFLOW, POLICIES, eager_with_state

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "step_script.py")
STEPS = 4
# group: (resource file, run option, processes that write results, replicas each); micro-batches: MPI-2's layout
# (AUTO-2, PS-3, HYBRID-2 and MPI-3 repeated MPI-2's and PS-2's mechanisms, the loss scale agreed over the
# workers and the gradients pushed to servers: out, for CI's time on a 2-core machine; parallax.fit's mixed
# precision runs in MPI-2 and 2 local replicas: tests/multiprocess/test_keras_fit.py). MPI-2 without micro-batches
# until 2026-12-04: the micro-batches' job all-reduces the same scaled gradients (once, after the last micro-batch),
# parallax.fit's and the optimizer matrix's loss scales run in MPI-2 without them.
GROUPS = {**{g: LAYOUTS[g] for g in ("PS-2", "local-2-replicas")}, "MPI-2-micro-batches": LAYOUTS["MPI-2"]}
CONFIG = {"MPI-2-micro-batches": '{"micro_batches": 3}'}  # more Config fields of a group (JSON)
#: (rtol, atol) of the variables, rtol of the losses, by the type the case computes in (see the module docstring)
TOLERANCE = {"mixed_float16": (2e-3, 1e-3, 2e-3), "mixed_bfloat16": (1e-2, 1e-2, 1e-2), None: (1e-5, 1e-6, 1e-5)}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    if importlib.util.find_spec("tf_keras") is None:
        unavailable("tf_keras is not installed (the tf_keras cases need it)",
                    "`make test` installs it (pip install --no-deps tf_keras)")
    groups = {group: (text, ["--run_option", option, "--steps", str(STEPS), "--config", CONFIG.get(group, "{}")])
              for group, (text, option, _, _) in GROUPS.items()}
    # one job per group and layout: HYBRID and AUTO run the dynamic loss scale's cases as MPI (one process fewer)
    scaled = [c for c in MIXED if c in DYNAMIC_SCALE]
    return {True: ScriptJobs(tmp_path_factory, SCRIPT, groups, scaled),
            False: ScriptJobs(tmp_path_factory, SCRIPT, groups, [c for c in MIXED if c not in scaled])}


@functools.cache
def reference(case: str):
    return eager_with_state(case, STEPS)


def _cases():
    """Every case in every layout (HYBRID runs a dynamically scaled step as MPI)."""
    for group in GROUPS:
        for case in MIXED:
            yield pytest.param(group, case, id=f"{case}-{group}", marks=pytest.mark.xdist_group(f"tf2-mixed-{group}"))


@pytest.mark.parametrize("group, case", list(_cases()))
def test_a_mixed_precision_step_trains_as_eager_training_on_one_device(jobs, group, case):
    out = jobs[case in DYNAMIC_SCALE].case(group, case)
    losses, values, state = reference(case)
    rtol, atol, loss_rtol = TOLERANCE[POLICIES.get(case)]
    _, _, processes, replicas = GROUPS[group]
    seen = []
    for rank in range(processes):
        with np.load(os.path.join(out, f"rank_{rank}.npz")) as got:
            for i, value in enumerate(values):
                np.testing.assert_allclose(got[f"v{i}"], value, rtol=rtol, atol=atol,
                                           err_msg=f"{group} {case} rank {rank}: variable {i}")
            for i, value in enumerate(state):
                np.testing.assert_allclose(got[f"o{i}"], value, rtol=rtol, atol=atol,
                                           err_msg=f"{group} {case} rank {rank}: optimizer variable {i}")
            assert got["losses"].shape == (STEPS, replicas)
            seen.append(got["losses"])
    mean = np.concatenate(seen, axis=1).mean(axis=1)
    np.testing.assert_allclose(mean, losses, rtol=loss_rtol,
                               err_msg=f"{group} {case}: the mean of the replicas' losses")
    if case in OVERFLOW:  # skipped by all: the scale (2**15 at first) halved once, as on one device
        assert any(v.size == 1 and float(v.ravel()[0]) == 2.0**14 for v in state), "one device halved its loss scale"
        assert np.isinf(losses[1]) and np.all(np.isfinite(np.delete(losses, 1)))
        every = np.concatenate(seen, axis=1)
        assert np.isinf(every[1, -1]) and np.all(np.isfinite(every[1, :-1])), "only the last replica overflows"
