"""Public TensorFlow 2 custom training loops (tests/tf2/public_programs.py: Keras's guide "Writing a training
loop from scratch" and TensorFlow's "Custom training: walkthrough", rewritten small) trained by
``parallel_run`` with their steps unchanged, in MPI and PS on 2 processes and with 2 replicas in one
process, against one device on the union batches: every replica's loss at every step, every trained weight,
and the accuracy each keeps (the walkthrough's from the returned logits, of every replica; the guide's metric,
updated inside the step, every part's examples counted as on one device); then ``parallax.predict`` of held-out
examples, sharded over the job's workers, equals ``model.predict``."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

from tests.multiprocess.harness import ROOT, TWO_REPLICAS, ScriptJobs
from tests.tf2.public_programs import PROGRAMS

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "public_script.py")
STEPS = 4
# group: (resource file, run option, processes, replicas each, whose copy of the state written in the step
# each worker ends with)
# (HYBRID-2 until 2026-12-04: these programs have no tables, so HYBRID ran them as MPI-2; out for CI's time)
WHOSE = {"MPI-2": "own",
         "PS-2": "worker 0",
         "local-2-replicas": "own"}
GROUPS = {g: (*TWO_REPLICAS[g], whose) for g, whose in WHOSE.items()}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return ScriptJobs(tmp_path_factory, SCRIPT, {g: (text, ["--run_option", option, "--steps", str(STEPS)])
                                                 for g, (text, option, *_) in GROUPS.items()}, PROGRAMS)


@functools.cache
def reference(name: str):
    from tests.tf2.public_programs import eager

    return eager(name, STEPS)


@pytest.mark.parametrize("name", PROGRAMS)
@pytest.mark.parametrize("group", [pytest.param(g, marks=[pytest.mark.xdist_group(f"tf2-public-{g}")]
                                                + [pytest.mark.core] * (g == "MPI-2"))  # make test's job
                                   for g in GROUPS])
def test_a_public_custom_training_loop_trains_as_on_one_device(jobs, group, name):
    out = jobs.case(group, name)
    losses, weights, right = reference(name)
    _, _, processes, replicas, _ = GROUPS[group]
    for rank in range(processes):
        where = f"{group} {name} rank {rank}"
        with np.load(os.path.join(out, f"rank_{rank}.npz")) as got:
            parts = slice(rank * replicas, (rank + 1) * replicas)
            if losses is not None:
                np.testing.assert_allclose(got["losses"], losses[:, parts], rtol=1e-5, err_msg=where)
            for i, value in enumerate(weights):
                np.testing.assert_allclose(got[f"v{i}"], value, rtol=1e-5, atol=1e-6, err_msg=f"{where}: {i}")
            # parallax.predict in a parallel_run job: sharded over its workers, gathered in order
            np.testing.assert_allclose(got["predict"], got["predict_alone"], rtol=1e-6, atol=1e-7, err_msg=where)
            if losses is None:
                continue
            if name == "tf-walkthrough":
                assert list(got["correct"]) == list(right[parts]), where
            else:  # the step's metric: every part's, summed into the program's after each step (tf2/summed.py)
                assert int(got["correct"][0]) == int(np.sum(right)), where
