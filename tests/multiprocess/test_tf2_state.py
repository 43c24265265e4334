"""State a TensorFlow 2 step keeps but does not train (tests/tf2/state_programs.py: Keras 3 batch norm's
moving statistics, a ``keras.metrics.Mean`` the step updates, Adam's iteration counter), as docs/tf2_programs.md
says it is kept: each replica normalises by its own part's statistics, the trained variables equal one update
from the parts' averaged gradients, and each write outside the optimizer is made once per worker from its
first replica's part (MPI, HYBRID), once per job from worker 0's (PS: the variables live on the servers), or
from replica 0's (several replicas in one process). The metric the step updates (each worker keeps its
copy, PS too, to which each replica adds) is, in the program's own variables, what every part added
(parallax/tf2/summed.py).
The reference runs the same step on one device part by part, each part with its own copy of that state."""

from __future__ import annotations

import functools
import os
import sys

import numpy as np
import pytest

from tests.multiprocess.harness import ROOT, TWO_REPLICAS, run_command

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "state_script.py")
STEPS = 3
# group: (resource file, run option, processes, replicas each, whose copy of the state written in the step
# each worker ends with)
# (HYBRID-2 until 2026-12-04: these programs have no tables, so HYBRID ran them as MPI-2; out for CI's time)
WHOSE = {"MPI-2": "own",
         "PS-2": "worker 0",
         "local-2-replicas": "replica 0"}
GROUPS = {g: (*TWO_REPLICAS[g], whose) for g, whose in WHOSE.items()}


@functools.cache
def reference():
    from tests.tf2.state_programs import data_parallel

    return data_parallel(2, STEPS)


@pytest.mark.parametrize("group", [pytest.param(g, marks=pytest.mark.xdist_group(f"tf2-state-{g}")) for g in GROUPS])
def test_state_that_is_not_trained_is_kept_as_documented(group, tmp_path):
    text, option, processes, replicas, whose = GROUPS[group]
    (tmp_path / "resource_info").write_text(text)
    run = run_command(tmp_path, [sys.executable, SCRIPT, "--resource_info", str(tmp_path / "resource_info"),
                                 "--run_option", option, "--out", str(tmp_path / "out"), "--steps", str(STEPS)],
                      timeout=300)
    assert run.returncode == 0, run.output[-4000:]
    losses, finals, summed = reference()
    for rank in range(processes):
        with np.load(tmp_path / "out" / f"rank_{rank}.npz") as data:
            got = {k.replace("__", "/"): data[k] for k in data.files}
        parts = slice(rank * replicas, (rank + 1) * replicas)
        np.testing.assert_allclose(got["losses"], np.array(losses)[:, parts], rtol=1e-5, err_msg=f"rank {rank}")
        want = finals[rank if whose == "own" else 0]
        want = {**want, **summed}  # a metric: each replica adds to its worker's copy (PS too), summed after a step
        assert int(got["iterations"]) == STEPS
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=f"{group} rank {rank}: {key}")
