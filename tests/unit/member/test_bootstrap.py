"""What a launched process does first: the launcher's environment (pure), the rank's context
and output redirection, the tee of a lone process's output, and the exit checks.

Whatever initialises MPI, redirects file descriptors or registers exit handlers runs in a
``python -c`` subprocess (MPI as a singleton, without mpirun), or in this process against a
fake ``mpi4py`` and a captured ``atexit.register``.
"""

from __future__ import annotations

import atexit
import json
import os
import socket
import subprocess
import sys
import textwrap
import types

import pytest

from parallax.invocation import JOB_DIR_ENV, LAUNCH_ENV, LEVEL_ENV, MONITOR_ENV, Invocation, LaunchIdentity, RankChannel
from parallax.launch.launcher import launch_env
from parallax.launch.layout import RankSpec, layout_from_json
from parallax.launch.runner import read_registry
from parallax.member.bootstrap import (
    EXIT_POLL_SECONDS,
    RankContext,
    finish_together,
    launched_context,
    leave_together,
    make_heartbeat,
)
from parallax.resources.files import Device

RANKS = (RankSpec("a", (Device("gpu", 0),), 1), RankSpec("a", (Device("gpu", 1),), 1),
         RankSpec("a", None, 0, "ps"), RankSpec("b", (Device("cpu", 2),), 2, "worker", 3333),
         RankSpec("b", None, 3, "ps", 2222))
JOB = {"layout": "HYBRID", "digest": "0123abcd", "gpus": 2}


def run_python(code, *args, env=None, timeout=60):
    """Run ``code`` in a fresh Python, with the launcher's variables only as given in ``env``."""
    base = {k: v for k, v in os.environ.items() if k not in (LAUNCH_ENV, JOB_DIR_ENV, MONITOR_ENV)}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env={**base, **(env or {})},
                          capture_output=True, text=True, timeout=timeout)


# --------------------------------------------------------------------------- launch_env (pure)
def test_launch_env_round_trips_the_rank_layout_and_the_job(monkeypatch):
    monkeypatch.delenv(LEVEL_ENV, raising=False)
    env = launch_env(RANKS, JOB, "/jobs/7")
    assert set(env) == {LAUNCH_ENV, JOB_DIR_ENV, LEVEL_ENV}
    assert all(isinstance(v, str) for v in env.values())
    data = json.loads(env[LAUNCH_ENV])
    assert data["job"] == JOB
    assert layout_from_json(data["ranks"]) == RANKS
    bound = Invocation.from_env(launch_env(RANKS, JOB, "/jobs/7", bound=3)).launch
    assert (bound.bound_cores, Invocation.from_env(env).launch.bound_cores) == (3, None)
    assert env[JOB_DIR_ENV] == "/jobs/7"


def test_launch_env_is_the_same_text_for_the_same_job(monkeypatch):
    monkeypatch.delenv(LEVEL_ENV, raising=False)
    shuffled = dict(reversed(JOB.items()))
    assert launch_env(RANKS, JOB, "/j") == launch_env(RANKS, shuffled, "/j")


@pytest.mark.parametrize("monitor, expected", [(None, None), ("", None), ("10.0.0.1:5000", "10.0.0.1:5000"),
                                               ("[::1]:7", "[::1]:7")],
                         ids=["none", "empty", "ipv4", "ipv6"])
def test_launch_env_names_the_stall_monitor_only_when_there_is_one(monkeypatch, monitor, expected):
    monkeypatch.delenv(LEVEL_ENV, raising=False)
    env = launch_env(RANKS, JOB, "/j", monitor=monitor)
    assert env.get(MONITOR_ENV) == expected
    assert (MONITOR_ENV in env) == (expected is not None)


@pytest.mark.parametrize("level, expected", [(None, "20"), ("", "20"), ("DEBUG", "DEBUG"), ("30", "30")],
                         ids=["unset", "empty", "name", "number"])
def test_launched_processes_log_at_info_unless_the_level_is_set(monkeypatch, level, expected):
    """The level is the launcher's (its invocation's ``log_level``, handed in), not read here."""
    monkeypatch.setenv(LEVEL_ENV, "ERROR")
    assert launch_env(RANKS, JOB, "/j", log_level=level)[LEVEL_ENV] == expected


# --------------------------------------------------------------------------- launched_context
@pytest.mark.parametrize("value", [None, ""], ids=["unset", "empty"])
def test_a_process_the_launcher_did_not_start_has_no_context(monkeypatch, value):
    environ = {} if value is None else {LAUNCH_ENV: value}
    assert launched_context(Invocation.from_env(environ), "/nonexistent/logs") is None
    assert not os.path.exists("/nonexistent/logs")


CONTEXT_SCRIPT = """
    import json, sys
    from parallax.invocation import current
    from parallax.member.bootstrap import launched_context
    context = launched_context(current(), sys.argv[1])
    print(json.dumps({"rank": context.rank, "size": context.size, "role": context.spec.role,
                      "job": {"layout": context.job.layout, "digest": context.job.digest, "gpus": context.job.gpus},
                      "job_dir": context.job_dir,
                      "hook": getattr(sys.excepthook, "_parallax", False)}))
    sys.stderr.write("to the log\\n")
"""


@pytest.mark.parametrize("role", ["worker", "ps"])
def test_a_launched_rank_learns_its_context_registers_and_redirects_its_output(tmp_path, role):
    job_dir, logs = tmp_path / "job", tmp_path / "logs" / "run"
    job_dir.mkdir()
    env = launch_env((RankSpec("localhost", None, 1, role),), JOB, str(job_dir))
    result = run_python(CONTEXT_SCRIPT, str(logs), env=env)
    assert result.returncode == 0, result.stderr
    assert "to the log" not in result.stderr and result.stdout == ""
    assert json.loads((logs / f"{role}_0.stdout").read_text()) == {
        "rank": 0, "size": 1, "role": role, "job": JOB, "job_dir": str(job_dir), "hook": True}
    assert (logs / f"{role}_0.stderr").read_text().endswith("to the log\n")
    (entry,) = read_registry(str(job_dir)).values()
    assert entry["rank"] == 0 and entry["host"] == socket.gethostname()
    assert entry["log"] == str(logs / f"{role}_0.stderr")


def test_a_rank_of_a_job_of_another_size_than_mpis_world_fails():
    script = """
        from parallax.errors import LaunchError
        from parallax.invocation import current
        from parallax.member.bootstrap import launched_context
        try:
            launched_context(current())
        except LaunchError as e:
            print(e)
    """
    two = (RankSpec("localhost", None, 1), RankSpec("localhost", None, 2))
    result = run_python(script, env=launch_env(two, {}, ""))
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ("this process was launched with 1 MPI ranks, but the job has 2; start jobs "
                                     "with parallel_run or parallax-run, not a bare mpirun")


def test_a_launched_rank_ending_with_an_exception_aborts_after_the_traceback_without_exit_handlers():
    script = """
        import atexit
        from parallax.invocation import current
        from parallax.member.bootstrap import launched_context
        launched_context(current())
        launched_context(current())  # the hook is installed once
        atexit.register(print, "an exit handler ran")
        raise RuntimeError("the step failed")
    """
    result = run_python(script, env=launch_env((RankSpec("localhost", None, 1),), {}, ""))
    assert result.returncode != 0
    assert "RuntimeError: the step failed" in result.stderr
    assert result.stderr.count("Traceback") == 1
    assert "an exit handler ran" not in result.stdout


# --------------------------------------------------------------------------- make_heartbeat
def test_there_is_no_heartbeat_without_a_monitor(monkeypatch):
    monkeypatch.setenv(MONITOR_ENV, "127.0.0.1:9")  # not read: the context's channel says
    assert make_heartbeat(RankContext(0, 1, RANKS[:1], LaunchIdentity("[]"), "")) is None


def test_the_heartbeat_reaches_the_monitors_address_and_says_done_at_exit(monkeypatch):
    receiver = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    receiver.bind(("127.0.0.1", 0))
    receiver.settimeout(10)
    exits = []
    monkeypatch.setattr(atexit, "register", exits.append)
    channel = RankChannel(monitor=f"127.0.0.1:{receiver.getsockname()[1]}")
    try:
        beat = make_heartbeat(RankContext(3, 5, RANKS, LaunchIdentity("[]", **JOB), "", channel))
        first = json.loads(receiver.recv(4096))
        assert (first["rank"], first["state"]) == (3, "start")
        assert exits == [beat.close]
        exits[0]()
        while (message := json.loads(receiver.recv(4096)))["state"] != "done":
            pass
        assert message["rank"] == 3
    finally:
        receiver.close()


# --------------------------------------------------------------------------- tee_output
TEE_SCRIPT = """
    import os, subprocess, sys
    from parallax.member.bootstrap import tee_output
    restore = tee_output(sys.argv[1], "worker_0")
    print("print to stdout", flush=True)
    sys.stderr.write("write to stderr\\n")
    os.write(1, b"fd 1\\n")
    os.write(2, b"fd 2\\n")
    subprocess.run(["sh", "-c", "echo child stdout; echo child stderr >&2"], check=True)
    if sys.argv[2] == "restore":
        restore()
        restore()  # a second call (and the exit handler) does nothing
        print("after restore", flush=True)
        sys.stderr.write("after restore\\n")
    else:
        print("last line, unflushed at exit", end="")
"""
TEED_OUT = "print to stdout\nfd 1\nchild stdout\n"
TEED_ERR = "write to stderr\nfd 2\nchild stderr\n"


def test_tee_output_sends_the_output_to_the_files_and_the_terminal_until_restored(tmp_path):
    logs = tmp_path / "logs" / "tee"
    result = run_python(TEE_SCRIPT, str(logs), "restore", timeout=30)
    assert result.returncode == 0, result.stderr
    assert (logs / "worker_0.stdout").read_text() == TEED_OUT
    assert (logs / "worker_0.stderr").read_text() == TEED_ERR
    assert result.stdout == TEED_OUT + "after restore\n"
    assert result.stderr == TEED_ERR + "after restore\n"


def test_tee_output_lasts_until_the_process_exits_and_appends(tmp_path):
    logs = tmp_path / "tee"
    logs.mkdir()
    (logs / "worker_0.stdout").write_text("an earlier run\n")
    result = run_python(TEE_SCRIPT, str(logs), "exit", timeout=30)
    assert result.returncode == 0, result.stderr
    assert result.stdout == TEED_OUT + "last line, unflushed at exit"
    assert (logs / "worker_0.stdout").read_text() == "an earlier run\n" + result.stdout
    assert result.stderr == (logs / "worker_0.stderr").read_text() == TEED_ERR


# --------------------------------------------------------------------------- finish_together, leave_together
def test_finish_together_and_leave_together_return_at_once_for_a_lone_rank():
    script = """
        from parallax.member.bootstrap import finish_together, leave_together
        finish_together(0, 5.0)
        leave_together()
        print("left")
    """
    result = run_python(script)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "left\n" and "Parallax: rank" not in result.stderr


class Aborted(Exception):
    pass


class FakeComm:
    """MPI.COMM_WORLD (mpi4py's method names) whose barrier completes after ``polls`` tests (never, for ``None``)."""

    def __init__(self, polls):
        self.polls, self.calls = polls, []

    def Ibarrier(self):
        self.calls.append("Ibarrier")
        return self

    def Test(self):
        if self.polls is None:
            return False
        self.polls -= 1
        return self.polls < 0

    def Barrier(self):
        self.calls.append("Barrier")

    def Abort(self, code):
        self.calls.append(f"Abort({code})")
        raise Aborted


@pytest.fixture
def fake_mpi(monkeypatch):
    """Install a fake ``mpi4py`` (no MPI in this process) and capture exit handlers; yields a maker of comms."""
    handlers = []
    monkeypatch.setattr(atexit, "register", handlers.append)
    module = types.ModuleType("mpi4py")

    def install(polls=0):
        module.MPI = types.SimpleNamespace(COMM_WORLD=FakeComm(polls))
        monkeypatch.setitem(sys.modules, "mpi4py", module)
        return module.MPI.COMM_WORLD, handlers

    return install


def test_finish_together_waits_at_exit_for_the_other_ranks(fake_mpi, capsys):
    comm, handlers = fake_mpi(polls=3)
    finish_together(2, 5.0)
    assert comm.calls == []  # nothing before the exit
    (check,) = handlers
    check()
    assert comm.calls == ["Ibarrier"] and capsys.readouterr().err == ""


def test_finish_together_aborts_with_a_message_when_the_others_never_finish(fake_mpi, capsys):
    comm, handlers = fake_mpi(polls=None)
    finish_together(2, 0.05)
    with pytest.raises(Aborted):
        handlers[0]()
    assert comm.calls == ["Ibarrier", "Abort(3)"]
    assert capsys.readouterr().err == (
        "Parallax: rank 2 finished, but after 0 s other ranks are still waiting in an all-reduce it will never "
        "join: every rank must run the same number of steps (give each the same number of batches)\n")


def test_leave_together_waits_for_the_others_asleep(fake_mpi, monkeypatch):
    """A server waits here for the whole training: a blocking Barrier would poll, taking a core."""
    import time

    naps = []
    monkeypatch.setattr(time, "sleep", naps.append)
    comm, _ = fake_mpi(polls=3)
    leave_together()
    assert comm.calls == ["Ibarrier"]  # never the blocking Barrier
    assert naps == [EXIT_POLL_SECONDS] * 3 and EXIT_POLL_SECONDS >= 0.001
