"""Keras 3's optimizers, plain and inside a ``LossScaleOptimizer`` (tests/tf2/optimizer_matrix.py), trained by
``parallel_run`` on 2 processes for 3 steps against eager training of the same step on one device with the union
batch: every trained variable and optimizer variable on every process (rtol 1e-5, float32), and every step's loss
(the mean of the workers'). Every case in MPI; in PS a few loss-scaled ones whose updates differ most (clipping by
the global norm, a trainable variable the optimizer writes itself, gradients accumulated, moving averages of the
weights read beside the updates). Each layout is one job, one ``parallel_run`` a case
(tests/tf2/optimizer_matrix_script.py); what Parallax refuses it refuses in every process, with the reason, and the
job goes on."""

from __future__ import annotations

import functools
import os
import re

import pytest

from tests.multiprocess.harness import LAYOUTS, ROOT, ScriptJobs
from tests.multiprocess.test_tf2_steps import check_against_eager
from tests.tf2.optimizer_matrix import CASES, REFUSED, eager

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "optimizer_matrix_script.py")
STEPS = 3
PS_CASES = ("lso-rmsprop-centered-global-clipnorm", "lso-nadam", "lso-adam-accumulating", "lso-adam-ema")
#: group -> its cases (the refused ones first: the launching process refuses them, then the workers do)
GROUP_CASES = {"MPI-2": [*REFUSED, *CASES], "PS-2": [next(iter(REFUSED)), *PS_CASES]}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return {group: ScriptJobs(tmp_path_factory, SCRIPT,
                              {group: (LAYOUTS[group][0], ["--run_option", LAYOUTS[group][1], "--steps", str(STEPS)])},
                              cases)
            for group, cases in GROUP_CASES.items()}


@functools.cache
def reference(case: str):
    return eager(case, STEPS)


def _cases():
    for group, cases in GROUP_CASES.items():
        for case in cases:
            yield pytest.param(group, case, id=f"{case}-{group}", marks=pytest.mark.xdist_group(f"tf2-matrix-{group}"))


@pytest.mark.parametrize("group, case", list(_cases()))
def test_a_keras_3_optimizer_trains_as_on_one_device_or_is_refused_saying_why(jobs, group, case):
    out = jobs[group].case(group, case)
    if case in REFUSED:
        with open(os.path.join(out, "refused.txt")) as f:
            assert re.search(REFUSED[case], f.read()), case
        assert not [f for f in os.listdir(out) if f.startswith("rank_")], "a refused case trained"
        return
    check_against_eager(out, group, case, reference(case))
