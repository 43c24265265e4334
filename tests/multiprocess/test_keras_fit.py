"""``parallax.fit`` (parallax/tf2/fit.py) as a Keras user calls it, against ``model.fit`` on one device with the
same batches: every epoch's logs (loss, metric, validation) and every trained weight, on every worker, in
every mode on 2 processes and with 2 replicas in one process; for arrays in order, shuffled with a seed, and
a ``tf.data.Dataset``; the ``ModelCheckpoint`` callback writes on worker 0."""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest

from tests.multiprocess.harness import ROOT, ScriptJobs
from tests.tf2.fit_programs import MIXED

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "fit_script.py")
CASES = ["ordered", "shuffled", "dataset"]
# group: (resource file, run option, workers, replicas each)
GROUPS = {
    "MPI-2": ("localhost: cpu:0,cpu:1\n", "MPI", 2),
    "PS-2": ("localhost: cpu:0\nlocalhost: cpu:1\n", "PS", 2),
    "HYBRID-2": ("localhost: cpu:0,cpu:1\n", "HYBRID", 2),
    "local-2-replicas": ("localhost: cpu:0,cpu:1\n", "PS", 1),
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return ScriptJobs(tmp_path_factory, SCRIPT, {g: (text, ["--run_option", option])
                                                 for g, (text, option, _) in GROUPS.items()}, CASES)


@functools.cache
def reference(case: str):
    from tests.tf2.fit_programs import single_device

    return single_device(case)


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("group", [pytest.param(g, marks=pytest.mark.xdist_group(f"fit-{g}")) for g in GROUPS])
def test_parallax_fit_equals_model_fit_on_one_device(jobs, group, case):
    out = jobs.case(group, case)
    history, weights = reference(case)
    workers = GROUPS[group][2]
    for worker in range(workers):
        with open(os.path.join(out, f"rank_{worker}.json")) as f:
            got = json.load(f)["history"]
        assert sorted(got) == sorted(history) == ["loss", "mae", "val_loss", "val_mae"]
        for key, values in history.items():
            np.testing.assert_allclose(got[key], values, rtol=1e-5, err_msg=f"{group} {case} worker {worker}: {key}")
        with np.load(os.path.join(out, f"rank_{worker}.npz")) as got_weights:
            for i, value in enumerate(weights):
                np.testing.assert_allclose(got_weights[f"v{i}"], value, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{group} {case} worker {worker}: weight {i}")
    assert os.path.exists(os.path.join(out, "model.weights.h5"))  # the chief's ModelCheckpoint


@pytest.fixture(scope="module")
def mixed_jobs(tmp_path_factory):
    # jobs of their own: HYBRID runs a dynamic loss scale's step as MPI, a layout other than the other cases'
    return ScriptJobs(tmp_path_factory, SCRIPT, {g: (text, ["--run_option", option])
                                                 for g, (text, option, _) in GROUPS.items()}, list(MIXED))


@pytest.mark.parametrize("case", MIXED)
@pytest.mark.parametrize("group", [pytest.param(g, marks=[pytest.mark.xdist_group(f"fit-mixed-{g}")]
                                                + ([pytest.mark.extended] if g != "MPI-2" else []))
                                   for g in GROUPS])
def test_parallax_fit_with_mixed_precision_and_loss_scaling_equals_model_fit_on_one_device(mixed_jobs, group, case):
    """float16 compute: a few units of float16's roundoff (2**-11) apart, as the TF2 steps' (see
    tests/multiprocess/test_tf2_mixed_precision.py); measured 1.3e-4 on the weights, 1e-4 relative on the logs."""
    out = mixed_jobs.case(group, case)
    history, weights = reference(case)
    for worker in range(GROUPS[group][2]):
        with open(os.path.join(out, f"rank_{worker}.json")) as f:
            got = json.load(f)["history"]
        for key, values in history.items():
            np.testing.assert_allclose(got[key], values, rtol=2e-3, err_msg=f"{group} {case} worker {worker}: {key}")
        with np.load(os.path.join(out, f"rank_{worker}.npz")) as got_weights:
            for i, value in enumerate(weights):
                np.testing.assert_allclose(got_weights[f"v{i}"], value, rtol=2e-3, atol=1e-3,
                                           err_msg=f"{group} {case} worker {worker}: weight {i}")
