"""``parallax.fit`` of keras-io's "Text classification from scratch" (tests/tf2/text_programs.py: an Embedding,
two Conv1D, Dense, Adam, a cached and prefetched ``tf.data`` pipeline with validation data) in PS mode on 2
processes, against ``model.fit`` on one device: every worker reads the pipeline as often as ``model.fit`` does
(its source once: the cache serves the later epochs), trains every batch of every epoch (as many as
``model.fit``), and has the same epoch logs and the same trained weights.

The regression: a ``cache()`` behind a ``prefetch``, partly read once before the epochs (``parallax.fit`` at
0aefeda drew the first batch for the step's signature), could be left complete with fewer batches, a different
number on each worker; in PS mode the worker whose epoch ended first waited for the others at the epoch's end
while the others waited in the step for its gradient, and the job hung after a step or two."""

from __future__ import annotations

import functools
import json
import os

import numpy as np
import pytest

from tests.multiprocess.harness import ROOT, ScriptJobs
from tests.tf2.text_programs import CASE

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "text_script.py")
# group: (resource file, run option, workers)
GROUPS = {"PS-2": ("localhost: cpu:0\nlocalhost: cpu:1\n", "PS", 2)}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    # a hung job fails the test after 180 s (ScriptJobs kills it), not after the default 420 s
    return ScriptJobs(tmp_path_factory, SCRIPT, {g: (text, ["--run_option", option])
                                                 for g, (text, option, _) in GROUPS.items()}, [CASE], timeout=180)


@functools.cache
def reference():
    from tests.tf2.text_programs import single_device

    return single_device()


@pytest.mark.parametrize("group", [pytest.param(g, marks=[pytest.mark.xdist_group(f"fit-text-{g}"), pytest.mark.core])
                                   for g in GROUPS])
def test_parallax_fit_of_a_cached_text_pipeline_trains_every_batch_as_model_fit(jobs, group):
    out = jobs.case(group, CASE)
    history, weights, batches, reads = reference()
    assert batches == [4, 4, 4] and reads == 4  # the cache serves the second and third epochs
    for worker in range(GROUPS[group][2]):
        where = f"{group} worker {worker}"
        with open(os.path.join(out, f"rank_{worker}.json")) as f:
            got = json.load(f)
        assert got["batches"] == batches, where
        assert got["reads"] == reads, f"{where}: the pipeline's source read {got['reads']} batches, model.fit {reads}"
        assert sorted(got["history"]) == sorted(history) == ["accuracy", "loss", "val_accuracy", "val_loss"]
        for key, values in history.items():
            np.testing.assert_allclose(got["history"][key], values, rtol=1e-5, err_msg=f"{where}: {key}")
        with np.load(os.path.join(out, f"rank_{worker}.npz")) as got_weights:
            assert len(got_weights.files) == len(weights)
            for i, value in enumerate(weights):
                np.testing.assert_allclose(got_weights[f"v{i}"], value, rtol=1e-5, atol=1e-6,
                                           err_msg=f"{where}: weight {i}")
