"""Jobs whose tasks a cluster manager starts, each told its task in TF_CONFIG (Kubeflow's TFJob, Polyaxon,
SageMaker, Vertex): every task a separate process started by tests/multiprocess/task_manager.py as a manager
would, none by Parallax; the result equals single-device training, and a task that dies ends the others."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from tests.multiprocess.harness import ROOT, SCRIPT, Run, leftover_processes, namespace_prefix
from tests.multiprocess.test_mpi_mode import BATCH, STEPS, check_ranks_match, expected_values
from tests.multiprocess.test_ps_mode import check_async_training, free_port

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

MANAGER = os.path.join(ROOT, "tests", "multiprocess", "task_manager.py")


@dataclass
class ManagedRun(Run):
    tasks: dict = None  # {"<type>_<index>": {"rc": ..., "ended": ...}}

    def log(self, task: str) -> str:
        with open(os.path.join(self.out_dir, "tasks", f"{task}.log"), errors="replace") as f:
            return f.read()

    def ids(self, worker_id: int) -> dict:
        with open(os.path.join(self.out_dir, f"started_{worker_id}")) as f:
            return json.load(f)


def tf_cluster(**counts: int) -> dict[str, list[str]]:
    """A TF_CONFIG cluster on localhost with fresh ports: ``tf_cluster(chief=1, worker=2, ps=2)``."""
    return {kind: [f"localhost:{free_port()}" for _ in range(n)] for kind, n in counts.items() if n}


def run_managed(tmp_path, cluster: dict | None, *args: str, timeout: float = 150, prefix: dict | None = None,
                namespace: bool = True, manifest: str | None = None, script: str = SCRIPT,
                restart_policy: str = "Never", restart_delay: float = 0.0, sized: bool = True) -> ManagedRun:
    """Start each task of ``cluster`` as a manager does (all in one loopback-only namespace when allowed
    and ``namespace``; ``prefix``: host -> the command that runs a task there; ``restart_policy``: a TFJob's,
    ``Never`` or ``ExitCode``; ``restart_delay``: seconds before a task starts again), or the pods of ``manifest``
    (a TFJob or polyaxonfile: their commands are theirs, ``args`` unused); ``sized``: ``script`` takes
    ``--steps`` and ``--batch``."""
    out = tmp_path / "out"
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PATH=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
    env.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    tasks_from = ["--manifest", manifest] if manifest else ["--cluster", json.dumps(cluster)]
    size = ["--steps", str(STEPS), "--batch", str(BATCH)] if sized else []
    command = [] if manifest else [sys.executable, script, "--resource_info", "unused", "--out", str(out), *size,
                                   *args]
    argv = [*(namespace_prefix() if namespace else ()), sys.executable, MANAGER, *tasks_from,
            "--out", str(out / "tasks"), "--timeout", str(timeout), "--prefix", json.dumps(prefix or {}),
            "--restart_policy", restart_policy, "--restart_delay", str(restart_delay), "--", *command]
    start = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=timeout + 60)
    with open(out / "tasks" / "tasks.json") as f:
        tasks = json.load(f)
    logs = "".join(f"==> {name}\n" + open(out / "tasks" / f"{name}.log", errors="replace").read() for name in tasks)
    return ManagedRun(proc.returncode, logs + proc.stdout + proc.stderr, time.monotonic() - start, str(out),
                      time.time(), tasks=tasks)


def check_ids(run: ManagedRun, workers: int, replicas: int = 1) -> None:
    """What parallel_run returned in each worker is what an mpirun-launched job of as many worker lines
    returns, and no task loaded MPI (gRPC alone)."""
    for worker_id in range(workers):
        assert run.ids(worker_id) == {"num_workers": workers, "worker_id": worker_id, "num_replicas": replicas,
                                      "mpi": False}


@pytest.mark.parametrize("model", ["mlp", pytest.param("embedding", marks=pytest.mark.core)])
def test_chief_workers_and_two_ps_equal_single_device(tmp_path, model):
    """Kubeflow TFJob's shape: a chief, workers and two ps; the run option left to its default (PS here)."""
    cluster = tf_cluster(chief=1, worker=2, ps=2)
    run = run_managed(tmp_path, cluster, "--run_option", "default", "--model", model, "--average_sparse")
    check_ranks_match(run, expected_values(model), 3)
    check_ids(run, 3)
    assert all(t["rc"] == 0 for t in run.tasks.values()), run.tasks
    assert "Parallax plan:\njob: layout PS, 5 process(es)" in run.log("chief_0")


def test_workers_only_all_reduce_with_collectives(tmp_path):
    """Workers only (no chief, no ps): MPI mode by default, all-reduced with TF collectives, no MPI at all."""
    cluster = tf_cluster(worker=3)
    run = run_managed(tmp_path, cluster, "--run_option", "default", "--model", "embedding", "--average_sparse")
    check_ranks_match(run, expected_values("embedding"), 3)
    check_ids(run, 3)
    assert "job: layout MPI, 3 process(es)" in run.log("worker_0")


def test_master_and_ps_with_async_workers(tmp_path):
    """SageMaker's names (master) and asynchronous training: every worker runs to the end, and every update
    of both lands on the ps (check_async_training)."""
    cluster = tf_cluster(master=1, worker=1, ps=1)
    run = run_managed(tmp_path, cluster, "--run_option", "PS", "--async", "--model", "mlp", "--count_gradients")
    check_async_training(run, "mlp", "adam", workers=2, steps=STEPS)
    check_ids(run, 2)


@pytest.mark.parametrize("shape,option", [({"chief": 1, "worker": 1, "ps": 1}, "PS"),
                                          pytest.param({"chief": 1, "worker": 2}, "MPI", marks=pytest.mark.core)])
def test_a_task_that_dies_ends_the_others_naming_it(tmp_path, shape, option):
    """Worker 1 dies at its second step, when the others have just started training: their watch threads may
    not have run yet (TensorFlow's start-up holds the GIL), so their first step's end probes them."""
    cluster = tf_cluster(**shape)
    run = run_managed(tmp_path, cluster, "--run_option", option, "--model", "mlp", "--kill_rank", "1",
                      "--kill_step", "2", "--steps", "200", "--stall_timeout", "10")
    killed_at = float((tmp_path / "out" / "killed_at").read_text())
    assert run.tasks["worker_0"]["rc"] == -9
    for name, task in run.tasks.items():
        if name == "worker_0":
            continue
        assert task["rc"] not in (0, "timeout"), (name, run.output[-4000:])
        assert task["ended"] - killed_at < 10, (name, task["ended"] - killed_at)
        # worker 0, or worker 0 with the chief when this task's watch missed both in one round
        assert re.search(r"Parallax job failed: task ([^;]* and )?worker 0 \(localhost:\d+\)( and [^;]*)? "
                         rf"ha(s|ve) ended or cannot be reached; ending task {name.replace('_', ' ')}",
                         run.log(name)), run.log(name)[-3000:]
    assert not leftover_processes(tmp_path)


@pytest.mark.parametrize("option,message", [
    ("HYBRID", "run_option='HYBRID' cannot run in tasks started from TF_CONFIG"),
    ("AUTO", "run_option='AUTO' cannot run in tasks started from TF_CONFIG"),
    ("MPI", "run_option='MPI' all-reduces among the workers, but TF_CONFIG has 1 ps task(s)"),
])
def test_run_options_that_cannot_run_are_refused_in_every_task(tmp_path, option, message):
    run = run_managed(tmp_path, tf_cluster(chief=1, ps=1), "--run_option", option, timeout=60)
    for name, task in run.tasks.items():
        assert task["rc"] == 1, (name, run.output[-3000:])
        assert message in run.log(name)


@pytest.mark.parametrize("shape,option", [({"chief": 1, "worker": 1, "ps": 1}, "PS"),
                                          ({"chief": 1, "worker": 1}, "MPI")])
def test_a_live_but_stuck_task_is_named_by_worker_0_within_the_stall_time(tmp_path, shape, option):
    """Worker 1 (the TF_CONFIG task ``worker 0``) sleeps 9 s in its own code; worker 0 waits in its step and,
    after the stall time (3 s), prints who waits for whom, as a launched job's launcher does; the job then ends
    equal to single-device training."""
    run = run_managed(tmp_path, tf_cluster(**shape), "--run_option", option, "--model", "mlp", "--sleep_rank", "1",
                      "--sleep_seconds", "9", "--stall_timeout", "3")
    assert all(task["rc"] == 0 for task in run.tasks.values()), (run.tasks, run.output[-4000:])
    check_ranks_match(run, expected_values("mlp", "adam"), 2)
    pattern = (r"Parallax stall: task chief 0 \(localhost:\d+\) has waited \d+ s in sess.run call #\d+, .*for task "
               r"worker 0 \(localhost:\d+\), which has finished \d+ sess.run calls and is in the program's own code "
               r"\(between sess.run calls\) for \d+ s")
    assert re.search(pattern, run.log("chief_0")), run.log("chief_0")[-3000:]


def test_a_task_stuck_past_stall_shutdown_ends_the_job_from_worker_0(tmp_path):
    """Worker 1 (the TF_CONFIG task ``worker 0``) hangs in its own code (600 s): after ``Config.stall_shutdown``
    (6 s) worker 0 ends with exit code 1 and the stall report, as a launched job's launcher ends it, and the
    stuck task, left without worker 0, ends with 143 within seconds: no task waits for ever."""
    import time

    began = time.monotonic()
    run = run_managed(tmp_path, tf_cluster(chief=1, worker=1), "--run_option", "MPI", "--model", "mlp",
                      "--sleep_rank", "1", "--sleep_seconds", "600", "--stall_timeout", "2", "--stall_shutdown", "6",
                      timeout=120)
    assert time.monotonic() - began < 90, run.tasks
    assert run.tasks["chief_0"]["rc"] == 1, (run.tasks, run.log("chief_0")[-3000:])
    assert re.search(r"Parallax job ended: it stalled \(task chief 0 \(localhost:\d+\) has waited \d+ s .*\), longer "
                     r"than Config.stall_shutdown allows", run.log("chief_0")), run.log("chief_0")[-3000:]
    assert run.tasks["worker_0"]["rc"] == 143, (run.tasks, run.log("worker_0")[-3000:])
    assert "task chief 0 (localhost:" in run.log("worker_0"), run.log("worker_0")[-3000:]
    assert not leftover_processes(tmp_path)
