"""HYBRID and AUTO across real processes on localhost: sparse variables on parameter
servers, dense ones all-reduced over MPI, every rank equal to one device."""

from __future__ import annotations

import json

import pytest

from tests.models import BUILDERS, DATA, train_single_device
from tests.multiprocess.harness import SharedJobs, assert_killed_rank_ended_the_job, run_script, seconds_after
from tests.multiprocess.test_mpi_mode import (
    BATCH,
    STEPS,
    check_compressed,
    check_ranks_match,
    expected_values,
    resources,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

# The cases of 2 workers and a server that need nothing but their own options share one job (a parallel_run call
# each, one after the other in the same processes); each is still checked on its own.
TWO = "hybrid-2"
GROUPS = {TWO: (resources(2), ["--run_option", "HYBRID", "--steps", str(STEPS), "--batch", str(BATCH)], {
    "adam": ["--model", "embedding", "--optimizer", "adam", "--average_sparse"],
    "momentum": ["--model", "embedding", "--optimizer", "momentum", "--average_sparse"],
    "summed": ["--model", "embedding", "--optimizer", "gd"],
    "sequence": ["--model", "sequence", "--average_sparse"],
    "fp16": ["--model", "embedding", "--optimizer", "adam", "--average_sparse", "--compression", "fp16"]})}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return SharedJobs(tmp_path_factory, GROUPS)


@pytest.mark.parametrize("optimizer, num_ranks", [
    pytest.param("adam", 2, marks=pytest.mark.xdist_group(TWO)), pytest.param("adam", 3, marks=pytest.mark.core),
    pytest.param("momentum", 2, marks=pytest.mark.xdist_group(TWO)), ("momentum", 3)])
def test_hybrid_equals_single_device(jobs, tmp_path, optimizer, num_ranks):
    if num_ranks == 2:
        run = jobs.case(TWO, optimizer)
    else:
        run = run_script(tmp_path, resources(num_ranks), "--run_option", "HYBRID", "--model", "embedding",
                         "--optimizer", optimizer, "--average_sparse", "--steps", str(STEPS), "--batch", str(BATCH))
    check_ranks_match(run, expected_values("embedding", optimizer), num_ranks)
    assert f"starting {num_ranks + 1} processes" in run.output  # one per device + one server


@pytest.mark.xdist_group(TWO)
def test_hybrid_sums_sparse_gradients_without_average_sparse(jobs):
    # embedding: the sum of 2 ranks' means = 2 x the union mean; proj/kernel: the mean
    expected = train_single_device(BUILDERS["embedding"]("gd", sparse_lr_scale=2.0), DATA["embedding"](STEPS, BATCH))
    check_ranks_match(jobs.case(TWO, "summed"), expected, 2)


@pytest.mark.xdist_group(TWO)
def test_sixteen_bit_gradients_end_within_the_formats_bound_of_one_device(jobs):
    """The dense gradient all-reduced and the sparse one pushed to the server, in fp16 (Horovod carries it too)."""
    check_compressed(jobs.case(TWO, "fp16"), "embedding", "adam", "fp16", 2)


@pytest.mark.xdist_group(TWO)
def test_partitioned_sequence_model(jobs):
    check_ranks_match(jobs.case(TWO, "sequence"), expected_values("sequence"), 2)


def test_two_hosts_aggregate_per_host(tmp_path):
    """Two host names (both this machine): each host's first worker sends its host's rows."""
    run = run_script(tmp_path, "localhost: cpu:0,cpu:1\n127.0.0.1: cpu:0\n", "--run_option", "HYBRID",
                     "--model", "embedding", "--average_sparse")
    check_ranks_match(run, expected_values("embedding"), 3)
    assert "starting 5 processes" in run.output  # 3 workers + a server per host


def test_clip_over_all_gradients_all_gathers_the_sparse_variable(tmp_path):
    run = run_script(tmp_path, resources(2), "--run_option", "HYBRID", "--model", "embedding", "--clip", "0.05",
                     "--average_sparse")
    expected = train_single_device(BUILDERS["embedding"]("adam", clip=0.05), DATA["embedding"](STEPS, BATCH))
    check_ranks_match(run, expected, 2)
    assert "runs as MPI" in run.output


def test_hybrid_without_sparse_variables_runs_as_mpi(tmp_path):
    run = run_script(tmp_path, resources(2), "--run_option", "HYBRID", "--model", "mlp")
    check_ranks_match(run, expected_values("mlp"), 2)
    assert "no sparse gradient" in run.output and "runs as MPI" in run.output
    assert "starting 2 processes" in run.output


def test_hybrid_without_dense_variables_runs_as_ps(tmp_path):
    run = run_script(tmp_path, resources(2), "--run_option", "HYBRID", "--model", "embedding_only",
                     "--optimizer", "gd", "--average_sparse")
    expected = train_single_device(BUILDERS["embedding_only"]("gd"), DATA["embedding_only"](STEPS, BATCH))
    assert "no dense gradient" in run.output and "runs as PS" in run.output
    # PS: one worker for the line (2 in-graph replicas) + one server
    assert "starting 2 processes" in run.output
    check_ranks_match(run, expected, 1)


def test_auto_with_an_override_mixes_servers_and_allreduce(tmp_path):
    """AUTO picks all-gather at 2 workers; the override moves the embedding to the servers."""
    run = run_script(tmp_path, resources(2), "--run_option", "AUTO", "--model", "embedding", "--average_sparse",
                     "--overrides", json.dumps({"embedding": "ps"}))
    check_ranks_match(run, expected_values("embedding"), 2)
    assert "starting 3 processes" in run.output


def test_auto_all_reduces_a_dense_enough_sparse_gradient(tmp_path):
    """Every row touched each step (density 1 >= 2/n): the sparse gradient is all-reduced as a dense one."""
    run = run_script(tmp_path, resources(2), "--run_option", "AUTO", "--model", "embedding", "--average_sparse",
                     "--overrides", json.dumps({"embedding": {"density": 1.0}}))
    check_ranks_match(run, expected_values("embedding"), 2)


def test_a_killed_worker_ends_a_hybrid_job(tmp_path):
    run = run_script(tmp_path, resources(3), "--run_option", "HYBRID", "--model", "embedding",
                     "--kill_rank", "1", "--kill_step", "2", "--steps", "50")
    assert_killed_rank_ended_the_job(run, tmp_path, rank="1")


@pytest.mark.core
def test_an_exception_in_a_worker_ends_a_hybrid_job_quickly(tmp_path):
    run = run_script(tmp_path, resources(2), "--run_option", "HYBRID", "--model", "embedding", "--raise_rank", "1",
                     "--kill_step", "1", "--steps", "50", timeout=90)
    assert run.returncode != 0 and "deliberate failure on rank 1" in run.output
    assert seconds_after(run, tmp_path, "raised_at") < 30, seconds_after(run, tmp_path, "raised_at")
