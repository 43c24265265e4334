"""keras-io's transfer learning and fine-tuning (tests/tf2/fine_tune_programs.py): ``parallax.fit`` with the base
frozen, then again after the base is unfrozen and the model compiled anew, in the same job's processes (MPI on 2
processes), against ``model.fit`` twice on one device: both stages' Histories (their validation too) and every
weight, Keras 3 and tf_keras. The validation of the second stage read metrics its first compile had made (0 for
every ``val_`` log) until 2026-12-07."""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest

from tests.multiprocess.harness import ROOT, ScriptJobs
from tests.tf2.fine_tune_programs import FLAVORS

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "fine_tune_script.py")


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return ScriptJobs(tmp_path_factory, SCRIPT, {"MPI-2": ("localhost: cpu:0,cpu:1\n", ["--run_option", "MPI"])},
                      list(FLAVORS))


@functools.cache
def reference(flavor: str):
    from tests.tf2.fine_tune_programs import single_device

    return single_device(flavor)


@pytest.mark.xdist_group("fine-tune")
@pytest.mark.parametrize("flavor", FLAVORS)
def test_fit_again_after_a_new_compile_trains_and_validates_as_model_fit(jobs, flavor):
    weights, histories = reference(flavor)
    for rank in (0, 1):
        with np.load(os.path.join(jobs.case("MPI-2", flavor), f"rank_{rank}.npz")) as got:
            got_histories = json.loads(str(got["histories"]))
            for stage, (want, have) in enumerate(zip(histories, got_histories, strict=True)):
                assert sorted(have) == sorted(want)
                for key, values in want.items():
                    np.testing.assert_allclose(have[key], values, rtol=1e-5, err_msg=f"rank {rank} stage {stage} {key}")
            for i, value in enumerate(weights):
                np.testing.assert_allclose(got[f"v{i}"], value, rtol=1e-5, atol=1e-6, err_msg=f"rank {rank} weight {i}")
