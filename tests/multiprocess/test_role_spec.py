"""A role spec (Polyaxon's environment section) as the resource file of a job on this machine."""

from __future__ import annotations

import pytest

from tests.multiprocess.harness import run_script
from tests.multiprocess.test_mpi_mode import check_ranks_match, expected_values

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SPEC = """\
environment:
  resources:
    cpu: {requests: 1, limits: 2}
  tensorflow:
    n_workers: 1
    n_ps: 2
    default_ps:
      resources:
        cpu: {requests: 1, limits: 1}
"""


def test_master_worker_and_two_ps_from_a_role_spec(tmp_path):
    run = run_script(tmp_path, SPEC, "--run_option", "PS", "--model", "embedding", "--average_sparse")
    check_ranks_match(run, expected_values("embedding"), 2)
    assert "rank 1 of 2 done" in run.output


def test_a_role_spec_without_ps_runs_as_mpi(tmp_path):
    run = run_script(tmp_path, "tensorflow:\n  n_workers: 2\n", "--run_option", "MPI", "--model", "mlp")
    check_ranks_match(run, expected_values("mlp"), 3)
