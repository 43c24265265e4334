"""MPI mode across real processes on localhost: numerics, failures, launching."""

from __future__ import annotations

import os
import re
from pathlib import Path

import numpy as np
import pytest

from parallax.comm import horovod_available
from tests.models import BUILDERS, DATA, train_single_device
from tests.multiprocess.harness import (
    TEST_BACKEND,
    SharedJobs,
    assert_killed_rank_ended_the_job,
    leftover_processes,
    run_script,
    seconds_after,
)

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

STEPS, BATCH = 4, 12  # 12 rows split evenly over 2 or 3 ranks
# PARALLAX_TEST_BACKEND (make test-horovod) narrows every test to that backend
BACKENDS = [TEST_BACKEND] if TEST_BACKEND else ["mpi", "collective"] + (["horovod"] if horovod_available() else [])


def resources(num_ranks: int) -> str:
    return "localhost: " + ",".join(f"cpu:{i}" for i in range(num_ranks)) + "\n"


def expected_values(model: str, optimizer: str = "adam") -> dict[str, np.ndarray]:
    return train_single_device(BUILDERS[model](optimizer), DATA[model](STEPS, BATCH))


def check_ranks_match(run, expected, num_ranks):
    assert run.returncode == 0, run.output[-6000:]
    for rank in range(num_ranks):
        got = run.rank_values(rank)
        assert set(got) == set(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6, err_msg=f"rank {rank}: {name}")


#: The bound of :func:`check_compressed`, in units of the format's roundoff times the weights' path length.
COMPRESSION_BOUND = 4.0


def check_compressed(run, model: str, optimizer: str, fmt: str, num_ranks: int) -> None:
    """A job whose gradients crossed in ``fmt`` (CommunicationConfig.compression) against one device.

    The tolerance, derived: each worker's gradient is rounded once to the format (relative error at
    most ``u``, UNIT_ROUNDOFF) and each partial sum once more (``ceil(log2 W)`` times), so the summed
    gradient of a step is off by at most ``(1 + ceil(log2 W)) u`` of the workers' magnitudes, 2u to 3u
    here. To first order a step's update is off by as much of itself, so the weights end within
    ``(1 + ceil(log2 W)) u`` times the path they moved (``sum_s max |w_s - w_{s-1}|`` of the
    single-device run); :data:`COMPRESSION_BOUND` (4) leaves room for the workers' gradients cancelling
    and for the optimizer's own nonlinearity (Adam's second moment). Measured: 0.16 to 1.1 of ``u`` x path.
    Every rank must hold the same values, and they must differ from one device's (it was compressed).
    """
    from parallax.comm.compression import UNIT_ROUNDOFF

    assert run.returncode == 0, run.output[-6000:]
    data = DATA[model](STEPS, BATCH)
    states = [train_single_device(BUILDERS[model](optimizer), data[:s]) for s in range(STEPS + 1)]
    path = {k: sum(float(np.max(np.abs(np.asarray(b[k], float) - np.asarray(a[k], float))))
                   for a, b in zip(states, states[1:])) for k in states[-1]}
    first = run.rank_values(0)
    differs = False
    for name, expected in states[-1].items():
        bound = COMPRESSION_BOUND * UNIT_ROUNDOFF[fmt] * path[name]
        error = float(np.max(np.abs(np.asarray(first[name], float) - expected)))
        assert error <= bound, f"{name}: off by {error:.3g}, more than {bound:.3g} ({fmt})"
        differs |= error > 0
    assert differs, f"every variable equals one device's exactly: were the gradients sent in {fmt}?"
    for rank in range(1, num_ranks):
        got = run.rank_values(rank)
        for name in states[-1]:
            np.testing.assert_array_equal(got[name], first[name], err_msg=f"rank {rank}: {name}")


#: 16-bit gradients (CommunicationConfig.compression): all-gathered (embedding) and all-reduced (mlp) on the mpi
#: backend's 3 ranks (sums rounded twice), and fp16 (the one format it carries) on TF's collectives.
FP16_EMBEDDING = ["--model", "embedding", "--average_sparse", "--compression", "fp16"]
COMPRESSED = {("mpi", 3): {"fp16_embedding": FP16_EMBEDDING, "bf16_mlp": ["--model", "mlp", "--compression", "bf16"]},
              ("collective", 2): {"fp16_embedding": FP16_EMBEDDING}}


# The cases below that need nothing but their own options share one job per backend and rank count
# (a parallel_run call each, one after the other in the same processes); each is still checked on its own.
DEFAULT_BACKEND = TEST_BACKEND or "mpi"  # train_script.py's default: auto, which is mpi on CPUs
MODELS = {model: ["--model", model, "--average_sparse"] for model in ("mlp", "embedding")}
GROUPS = {f"{backend}-{n}": (resources(n), ["--backend", backend, "--steps", str(STEPS), "--batch", str(BATCH)],
                             {**MODELS, **({"summed": ["--model", "embedding_only", "--optimizer", "gd"]}
                                           if backend == DEFAULT_BACKEND else {}),
                              **({"clip_mlp": ["--model", "mlp", "--clip", "0.05", "--average_sparse"],
                                  "clip_embedding": ["--model", "embedding", "--clip", "0.05", "--average_sparse"],
                                  "no_fusion_sequence": ["--model", "sequence", "--fusion_bytes", "0",
                                                         "--average_sparse"],
                                  # fusion_bytes 0: a bucket per variable (these gradients would make one bucket,
                                  # which is not overlapped), overlapped or after the backward pass
                                  "overlap_deep_mlp": ["--model", "deep_mlp", "--fusion_bytes", "0"],
                                  "no_overlap_deep_mlp": ["--model", "deep_mlp", "--no_overlap", "--fusion_bytes", "0"]}
                                 if (backend, n) == (DEFAULT_BACKEND, 2) else {}),
                              **({"allgatherv": ["--model", "embedding", "--use_allgatherv", "--average_sparse",
                                                 "--export_graph_path", "graphs-allgatherv"]} if n == 2 else {}),
                              **COMPRESSED.get((backend, n), {})})
          for backend in BACKENDS for n in (2, 3)}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return SharedJobs(tmp_path_factory, GROUPS)


CORE = (DEFAULT_BACKEND, 2)  # make test's MPI job (tests/conftest.py); the other groups in make test-extended


def in_job(backend: str, num_ranks: int) -> list:
    """The marks of a case of the job of ``backend`` on ``num_ranks`` ranks."""
    return [pytest.mark.xdist_group(f"mpi-{backend}-{num_ranks}")] + [pytest.mark.core] * ((backend, num_ranks) == CORE)


def grouped(backend: str, num_ranks: int):
    return pytest.param(backend, num_ranks, id=f"{backend}-{num_ranks}", marks=in_job(backend, num_ranks))


@pytest.mark.parametrize("backend, num_ranks", [grouped(b, n) for b in BACKENDS for n in (2, 3)])
@pytest.mark.parametrize("model", ["mlp", "embedding"])
def test_every_rank_ends_with_the_single_device_variables(jobs, model, backend, num_ranks):
    check_ranks_match(jobs.case(f"{backend}-{num_ranks}", model), expected_values(model), num_ranks)


# make test-horovod: its own backend's case only
ALLGATHERV_BACKENDS = [TEST_BACKEND] if TEST_BACKEND else ["collective", "mpi"]


@pytest.mark.parametrize("backend, run_option", [pytest.param(b, "MPI", marks=in_job(b, 2))
                                                 for b in ALLGATHERV_BACKENDS]
                         + ([] if TEST_BACKEND else [("mpi", "HYBRID")]))
def test_use_allgatherv_sends_sparse_gradients_with_mpi_allgatherv(jobs, tmp_path, backend, run_option):
    if run_option == "MPI":  # a case of the backend's job of 2 ranks, which exports to graphs-allgatherv
        run = jobs.case(f"{backend}-2", "allgatherv")
        export = Path(run.out_dir).parent.parent / "graphs-allgatherv"
    else:
        export = tmp_path / "graphs"
        run = run_script(tmp_path, resources(2), "--model", "embedding", "--backend", backend, "--use_allgatherv",
                         "--average_sparse", "--run_option", run_option, "--export_graph_path", str(export))
    check_ranks_match(run, expected_values("embedding"), 2)
    graph = (export / "worker-0_metagraph").read_text()
    if run_option == "HYBRID":  # one host: no host aggregation, so nothing is all-gathered
        assert "parallax_comm:mpi_allgather" not in graph and "parallax_comm:mpi_gatherv" not in graph
    elif backend != "horovod":  # the path taken, not only the numbers
        assert '"parallax_comm:mpi_allgatherv' in graph and '"parallax_comm:mpi_allgather"' not in graph


@pytest.mark.core
@pytest.mark.xdist_group(f"mpi-{DEFAULT_BACKEND}-2")
@pytest.mark.parametrize("model", ["mlp", "embedding"])
def test_binding_clip_by_global_norm_matches_single_device(jobs, model):
    expected = train_single_device(BUILDERS[model]("adam", clip=0.05), DATA[model](STEPS, BATCH))
    check_ranks_match(jobs.case(f"{DEFAULT_BACKEND}-2", f"clip_{model}"), expected, 2)


@pytest.mark.parametrize("backend, num_ranks, case", [
    pytest.param(b, n, case, marks=in_job(b, n), id=f"{b}-{n}-{case}")
    for (b, n), cases in COMPRESSED.items() if b in BACKENDS for case in cases])
def test_sixteen_bit_gradients_end_within_the_formats_bound_of_one_device(jobs, backend, num_ranks, case):
    fmt, model = case.split("_")
    check_compressed(jobs.case(f"{backend}-{num_ranks}", case), model, "adam", fmt, num_ranks)


@pytest.mark.core
@pytest.mark.xdist_group(f"mpi-{DEFAULT_BACKEND}-2")
def test_no_fusion_and_partitioned_sequence_model(jobs):
    check_ranks_match(jobs.case(f"{DEFAULT_BACKEND}-2", "no_fusion_sequence"), expected_values("sequence"), 2)


@pytest.mark.core
@pytest.mark.xdist_group(f"mpi-{DEFAULT_BACKEND}-2")
@pytest.mark.parametrize("case", ["overlap_deep_mlp", "no_overlap_deep_mlp"])
def test_all_reduced_in_buckets_during_or_after_the_backward_pass_the_result_is_the_same(jobs, case):
    """A bucket per variable, all-reduced as the backward pass makes them ready, or with MPIConfig(overlap=False)
    after it (no_fusion_sequence overlaps too; the other cases' gradients make one bucket)."""
    check_ranks_match(jobs.case(f"{DEFAULT_BACKEND}-2", case), expected_values("deep_mlp"), 2)


@pytest.mark.parametrize("num_ranks", [pytest.param(n, marks=in_job(DEFAULT_BACKEND, n)) for n in (2, 3)])
def test_sparse_gradients_are_summed_without_average_sparse(jobs, num_ranks):
    """Seed semantics: the sum of the ranks' gradients, i.e. num_ranks x the union-batch mean."""
    expected = train_single_device(BUILDERS["embedding_only"]("gd", lr_scale=float(num_ranks)),
                                   DATA["embedding_only"](STEPS, BATCH))
    check_ranks_match(jobs.case(f"{DEFAULT_BACKEND}-{num_ranks}", "summed"), expected, num_ranks)


@pytest.mark.core
def test_a_killed_rank_ends_the_job_quickly_naming_rank_and_host(tmp_path):
    run = run_script(tmp_path, resources(3), "--kill_rank", "1", "--kill_step", "2", "--steps", "50")
    assert_killed_rank_ended_the_job(run, tmp_path, rank="1")


@pytest.mark.core
def test_an_exception_in_a_rank_ends_the_job_naming_it(tmp_path):
    run = run_script(tmp_path, resources(2), "--raise_rank", "1", "--kill_step", "1", "--steps", "50")
    assert run.returncode != 0
    assert "deliberate failure on rank 1" in run.output
    assert re.search(r"Parallax job failed: rank 1 on host \S+", run.output), run.output[-3000:]
    # the failing rank does not wait for the others (PARALLAX_FINISH_TIMEOUT is 60 s)
    assert seconds_after(run, tmp_path, "raised_at") < 30, seconds_after(run, tmp_path, "raised_at")
    assert not leftover_processes(tmp_path)


@pytest.mark.core
def test_a_rank_running_fewer_steps_ends_the_job_instead_of_hanging(tmp_path, monkeypatch):
    monkeypatch.setenv("PARALLAX_FINISH_TIMEOUT", "5")
    run = run_script(tmp_path, resources(2), "--short_rank", "1", "--steps", "6", timeout=120)
    assert run.returncode != 0
    if TEST_BACKEND == "horovod":  # Horovod fails the waiting rank's all-reduce itself when a rank shuts down
        assert "after one of the ranks finished execution" in run.output, run.output[-3000:]
    else:
        assert "rank 1 finished, but after 5 s other ranks are still waiting in an all-reduce" in run.output
    assert not leftover_processes(tmp_path)


def test_redirect_path_gives_each_rank_its_own_files(tmp_path):
    logs = tmp_path / "logs"
    run = run_script(tmp_path, resources(2), "--redirect_path", str(logs))
    assert run.returncode == 0, run.output[-4000:]
    assert sorted(os.listdir(logs)) == ["worker_0.stderr", "worker_0.stdout", "worker_1.stderr", "worker_1.stdout"]
    assert "rank 1 of 2 done" in (logs / "worker_1.stdout").read_text()
    # the launching terminal shows every process's lines, prefixed
    assert "[worker 1] rank 1 of 2 done" in run.output and "[worker 0] rank 0 of 2 done" in run.output


def test_redirect_path_names_servers_too(tmp_path):
    logs = tmp_path / "logs"
    run = run_script(tmp_path, resources(2), "--run_option", "HYBRID", "--model", "embedding",
                     "--redirect_path", str(logs))
    assert run.returncode == 0, run.output[-4000:]
    assert sorted(os.listdir(logs)) == ["ps_2.stderr", "ps_2.stdout", "worker_0.stderr", "worker_0.stdout",
                                        "worker_1.stderr", "worker_1.stdout"]
    assert "[worker 1] rank 1 of 2 done" in run.output


def test_redirect_path_in_a_process_that_trains_alone_writes_files_and_keeps_the_terminal(tmp_path):
    logs = tmp_path / "logs"
    run = run_script(tmp_path, "localhost: cpu:0,cpu:1\n", "--run_option", "PS", "--redirect_path", str(logs))
    assert run.returncode == 0, run.output[-4000:]
    assert sorted(os.listdir(logs)) == ["worker_0.stderr", "worker_0.stdout"]
    assert "rank 0 of 1 done" in (logs / "worker_0.stdout").read_text()
    assert "rank 0 of 1 done" in run.output  # still on the terminal too
