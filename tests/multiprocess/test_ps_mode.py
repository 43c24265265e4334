"""PS mode across real processes on localhost: parameter servers over TF's gRPC runtime."""

from __future__ import annotations

import socket

import pytest

from tests.models import BUILDERS, DATA, train_single_device
from tests.multiprocess.harness import (
    SharedJobs,
    assert_killed_rank_ended_the_job,
    in_group,
    run_script,
    seconds_after,
)
from tests.multiprocess.test_mpi_mode import BATCH, STEPS, check_compressed, check_ranks_match, expected_values

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

TWO_WORKERS = "localhost: cpu:0\nlocalhost: cpu:1\n"
TWO_WORKERS_TWO_REPLICAS = "localhost: cpu:0,cpu:1\nlocalhost: cpu:2,cpu:3\n"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


# The cases below that need nothing but their own options share one job per resource file (a
# parallel_run call each, one after the other in the same processes): each is still checked on its own.
AVERAGED = ["--average_sparse"]
GROUPS = {
    "ps-2x1": (TWO_WORKERS, ["--run_option", "PS"], {
        "mlp": ["--model", "mlp", *AVERAGED], "embedding": ["--model", "embedding", *AVERAGED],
        "sequence": ["--model", "sequence", *AVERAGED], "clip": ["--model", "mlp", "--clip", "0.05"],
        "summed": ["--model", "embedding_only", "--optimizer", "gd"],
        "fp16_embedding": ["--model", "embedding", *AVERAGED, "--compression", "fp16"]}),
    "ps-2x2": (TWO_WORKERS_TWO_REPLICAS, ["--run_option", "PS"], {
        "mlp": ["--model", "mlp", *AVERAGED], "embedding": ["--model", "embedding", *AVERAGED],
        "boundaries_off": ["--model", "embedding", *AVERAGED, "--no_boundary_between", "--no_boundary_among",
                           "--clip", "100"],
        "no_replicated_variables": ["--model", "mlp", "--no_replicate_variables"],
        "no_local_aggregation_mlp": ["--model", "mlp", *AVERAGED, "--no_local_aggregation"],
        "no_local_aggregation_embedding": ["--model", "embedding", *AVERAGED, "--no_local_aggregation"],
        "bf16_mlp": ["--model", "mlp", "--compression", "bf16"]}),
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return SharedJobs(tmp_path_factory, GROUPS)


CORE = "ps-2x1"  # make test's PS job (tests/conftest.py); ps-2x2 in make test-extended


@pytest.mark.parametrize("group", [pytest.param(g, marks=[in_group(g)] + [pytest.mark.core] * (g == CORE))
                                   for g in GROUPS])
@pytest.mark.parametrize("model", ["mlp", "embedding"])
def test_sync_ps_equals_single_device(jobs, model, group):
    check_ranks_match(jobs.case(group, model), expected_values(model), 2)


@pytest.mark.parametrize("group, case, model, fmt", [
    pytest.param("ps-2x1", "fp16_embedding", "embedding", "fp16", marks=[in_group("ps-2x1"), pytest.mark.core]),
    pytest.param("ps-2x2", "bf16_mlp", "mlp", "bf16", marks=in_group("ps-2x2"))])
def test_sixteen_bit_pushes_end_within_the_formats_bound_of_one_device(jobs, group, case, model, fmt):
    """Sparse rows (embedding) and packed dense gradients (mlp) pushed to the server in 16 bits."""
    check_compressed(jobs.case(group, case), model, "adam", fmt, 2)


@in_group("ps-2x2")
def test_boundaries_off_give_the_same_result(jobs):
    expected = train_single_device(BUILDERS["embedding"]("adam", clip=100.0), DATA["embedding"](STEPS, BATCH))
    check_ranks_match(jobs.case("ps-2x2", "boundaries_off"), expected, 2)


@pytest.mark.core
@in_group(CORE)
def test_partitioned_sequence_model(jobs):
    check_ranks_match(jobs.case("ps-2x1", "sequence"), expected_values("sequence"), 2)


@in_group("ps-2x2")
def test_without_replicated_variables_replicas_read_the_servers_and_the_result_is_the_same(jobs):
    check_ranks_match(jobs.case("ps-2x2", "no_replicated_variables"), expected_values("mlp"), 2)


@in_group("ps-2x2")
@pytest.mark.parametrize("model", ["mlp", "embedding"])
def test_without_local_aggregation_each_replica_sends_and_the_result_is_the_same(jobs, model):
    check_ranks_match(jobs.case("ps-2x2", f"no_local_aggregation_{model}"), expected_values(model), 2)


def test_explicit_role_file_with_two_servers(tmp_path):
    """Both servers hold variables when PSConfig.num_servers says so (on one host Parallax would keep one:
    a second spreads no bytes over another link)."""
    # The file fixes the ports, so another test's process may take one between free_port() and the
    # servers' start (the job then says so and stops); such a run is tried again on new ports.
    for attempt in range(3):
        ports = [free_port() for _ in range(4)]
        text = (f"ps,localhost,{ports[0]},\nps,localhost,{ports[1]},\n"
                f"worker,localhost,{ports[2]},cpu:0\nworker,localhost,{ports[3]},cpu:0\n")
        run = run_script(tmp_path / f"attempt_{attempt}", text, "--run_option", "PS", "--model", "embedding",
                         "--average_sparse", "--num_servers", "2")
        if "is a port of the resource file in use?" not in run.output:
            break
    assert "servers: 2 of 2 hold variables" in run.output, run.output[-3000:]
    check_ranks_match(run, expected_values("embedding"), 2)


@pytest.mark.core
@in_group(CORE)
def test_binding_clip_on_dense_gradients(jobs):
    """Clipping runs once, on the chief, on the sum of the workers' raw gradients."""
    expected = train_single_device(BUILDERS["mlp"]("adam", clip=0.05), DATA["mlp"](STEPS, BATCH))
    check_ranks_match(jobs.case("ps-2x1", "clip"), expected, 2)


@pytest.mark.core
@in_group(CORE)
def test_sparse_gradients_are_summed_without_average_sparse(jobs):
    expected = train_single_device(BUILDERS["embedding_only"]("gd", lr_scale=2.0),
                                   DATA["embedding_only"](STEPS, BATCH))
    check_ranks_match(jobs.case("ps-2x1", "summed"), expected, 2)


def check_async_training(run, model: str, optimizer: str, workers: int, steps: int, batch: int = BATCH,
                         counted_steps: int | None = None, loss_falls: bool = True) -> None:
    """What asynchronous training guarantees, since it cannot equal one device: every update of every worker
    lands on the servers, and training makes progress.

    The job ran train_script.py with ``--count_gradients``, each of its ``workers`` for ``steps`` steps. Each
    worker reads the variables when it has finished, so the last to finish sees every update: its shared
    global step counts every step of every worker (``counted_steps`` of each, the steps whose training op
    increments it: all by default), its ``applied_gradients`` every step whose update was applied; every
    worker sees at least its own. The model's loss on the batches trained (every worker's part) is lower with
    the last worker's values than with the initial ones; where the model's optimizers do not lower it reliably
    even without staleness (``loss_falls=False``), every variable it trains has moved instead.
    """
    import numpy as np
    import tensorflow as tf

    from tests.idioms import IDIOM_DATA, IDIOMS
    from tests.models import applied_gradients, loss_on

    assert run.returncode == 0, run.output[-4000:]
    counted_steps = steps if counted_steps is None else counted_steps
    finals = [run.rank_values(rank) for rank in range(workers)]
    seen = [(int(values["global_step"]), applied_gradients(values)) for values in finals]
    assert all(step >= counted_steps and applied >= steps for step, applied in seen), seen
    last = finals[max(range(workers), key=lambda rank: seen[rank][1])]
    assert max(seen) == (workers * counted_steps, workers * steps), seen
    build, data = {**BUILDERS, **IDIOMS}[model], {**DATA, **IDIOM_DATA}[model](steps, batch)
    initial = train_single_device(build(optimizer), [])
    if loss_falls:
        before, after = loss_on(build(optimizer), initial, data), loss_on(build(optimizer), last, data)
        assert after < before, (before, after)
        return
    trained = [v.op.name for v in build(optimizer).graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)]
    unmoved = [name for name in trained if np.array_equal(last[name], initial[name])]
    assert trained and not unmoved, unmoved


def test_async_workers_apply_every_update_and_the_loss_falls(tmp_path):
    """Each worker applies its own gradients, without waiting: every update lands (the shared global step
    and the count of applied gradients hold both workers' steps), the loss falls, nobody deadlocks at the
    end."""
    run = run_script(tmp_path, TWO_WORKERS, "--run_option", "PS", "--async", "--steps", "30", "--batch", str(BATCH),
                     "--count_gradients")
    check_async_training(run, "mlp", "adam", workers=2, steps=30)


@pytest.mark.core
def test_a_killed_worker_ends_the_job_naming_it(tmp_path):
    run = run_script(tmp_path, TWO_WORKERS, "--run_option", "PS", "--kill_rank", "1", "--steps", "50")
    # layout of TWO_WORKERS: rank 0 and 1 are the workers, rank 2 the parameter server
    assert_killed_rank_ended_the_job(run, tmp_path, rank="1")


@pytest.mark.core
def test_a_killed_server_ends_the_job_naming_it(tmp_path):
    # layout of TWO_WORKERS: rank 0 and 1 are the workers, rank 2 the parameter server
    run = run_script(tmp_path, TWO_WORKERS, "--run_option", "PS", "--kill_server_rank", "2", "--steps", "50")
    assert_killed_rank_ended_the_job(run, tmp_path, rank="2")


@pytest.mark.core
def test_an_unsupported_protocol_is_refused_before_any_process_starts(tmp_path):
    run = run_script(tmp_path, TWO_WORKERS, "--run_option", "PS", "--protocol", "grpc+verbs")
    assert run.returncode != 0
    assert "ValueError: PSConfig.protocol='grpc+verbs': TensorFlow's servers start only with 'grpc'" in run.output
    assert "with mpirun" not in run.output and "Parallax job failed" not in run.output  # nothing was launched


@pytest.mark.core
def test_an_exception_in_a_worker_ends_the_job_quickly(tmp_path):
    run = run_script(tmp_path, TWO_WORKERS, "--run_option", "PS", "--raise_rank", "1", "--kill_step", "1",
                     "--steps", "50", timeout=90)
    assert run.returncode != 0 and "deliberate failure on rank 1" in run.output
    assert seconds_after(run, tmp_path, "raised_at") < 30, seconds_after(run, tmp_path, "raised_at")
