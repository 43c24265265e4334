"""A trial that is a whole multi-process job (its launcher, mpirun, the ranks): past its time limit the runner
ends all of it, and nothing of it is left."""

from __future__ import annotations

import sys
import time

import pytest

from parallax.trials.execute import TrialSpec, run_trial
from tests.multiprocess.harness import ROOT, SCRIPT, leftover_processes

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, pytest.mark.core]


def test_a_job_past_its_time_limit_is_ended_with_all_its_ranks(tmp_path):
    (tmp_path / "res").write_text("localhost: cpu:0,cpu:1\n")
    argv = (sys.executable, SCRIPT, "--resource_info", str(tmp_path / "res"), "--out", str(tmp_path / "out"),
            "--run_option", "MPI", "--steps", "50", "--sleep_rank", "1", "--kill_step", "1", "--sleep_seconds", "600",
            "--stall_timeout", "600")
    began = time.monotonic()
    result = run_trial(TrialSpec("hang", argv, str(tmp_path / "trial"), {"PYTHONPATH": ROOT}, time_limit=20.0))
    assert result.status == "timeout", result.describe()
    assert time.monotonic() - began < 50
    deadline = time.monotonic() + 10
    while leftover_processes(tmp_path) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not leftover_processes(tmp_path)
