"""Start ``mpirun``, pass its output through, and explain a failure.

The runner forwards SIGINT/SIGTERM to ``mpirun`` (which stops every rank),
reads the first failed rank from ``mpirun``'s report, adds the host, pid and
log path each rank registered in the job directory, and makes sure no rank
process of this job is left on this machine.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from parallax.errors import TaskFailedError
from parallax.invocation import JOB_DIR_ENV
from parallax.launch.command import LaunchCommand
from parallax.launch.output import LEVEL_ENV, cleaned

__all__ = ["run_job", "JobResult", "LostRank", "Preemption", "PREEMPTED_EXIT_CODE", "PREEMPT_GRACE", "parse_failure",
           "register_rank", "read_registry"]

_SIGNAL_RE = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) exited on\s+signal (\d+)")
_ABORT_RE = re.compile(r"process rank (\d+) with PID (\d+) on node (\S+) calling\s+\"abort\"")
_EXIT_RE = re.compile(r"Process name:\s*\[[^\]]*,(\d+)\]\s*Exit code:\s*(-?\d+)")


@dataclass(frozen=True)
class JobResult:
    """How the job ended: ``returncode`` of mpirun and the first failure, if any; ``signal``: the signal
    (SIGINT, SIGTERM) the launcher received, which stopped the job (``None``: none); ``preempted``: the job was
    asked to end with a checkpoint (:class:`Preemption`), and ``returncode`` is :data:`PREEMPTED_EXIT_CODE`."""

    returncode: int
    failure: TaskFailedError | None
    signal: int | None = None
    preempted: str | None = None


#: The exit code of a job (the launcher, the chief) preempted: ended by SIGTERM, with a checkpoint saved at a
#: step boundary. 128 + SIGTERM, as a shell reports a process SIGTERM ended: a TFJob's ``restartPolicy:
#: ExitCode`` restarts on it (128-255), and Slurm requeues a job the signal ended.
PREEMPTED_EXIT_CODE = 128 + signal.SIGTERM
#: Seconds the ranks have, once asked to end with a checkpoint, before the launcher ends them (Kubernetes
#: gives a pod 30 s between its SIGTERM and its SIGKILL).
PREEMPT_GRACE = 25.0


class Preemption:
    """A request to end the job with a checkpoint: SIGTERM to the launcher, or a rank that got one (its
    heartbeat says so). The runner passes it to every rank as SIGUSR1 through mpirun (which forwards SIGUSR1,
    where a SIGTERM to it kills the ranks at once); the chief saves at its next step boundary and exits with
    :data:`PREEMPTED_EXIT_CODE` (:mod:`parallax.member.preemption`), which ends the job; ranks still running
    :data:`PREEMPT_GRACE` seconds later are stopped."""

    def __init__(self) -> None:
        self.source: str | None = None
        self._event = threading.Event()

    def request(self, source: str) -> None:
        if not self._event.is_set():
            self.source = source
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()


def register_rank(job_dir: str, rank: int, host: str, log_path: str | None) -> None:
    """Called by each rank at start: record where it runs (for failure reports)."""
    path = os.path.join(job_dir, f"rank_{rank}.json")
    with open(path + ".tmp", "w", encoding="utf-8") as f:
        json.dump({"rank": rank, "host": host, "pid": os.getpid(), "log": log_path}, f)
    os.replace(path + ".tmp", path)


def read_registry(job_dir: str) -> dict[int, dict]:
    """What the ranks registered, by rank."""
    out = {}
    if not os.path.isdir(job_dir):
        return out
    for name in os.listdir(job_dir):
        if name.startswith("rank_") and name.endswith(".json"):
            try:
                with open(os.path.join(job_dir, name), encoding="utf-8") as f:
                    entry = json.load(f)
                out[int(entry["rank"])] = entry
            except (OSError, ValueError, KeyError):
                continue
    return out


class LostRank:
    """Set (once) by the stall monitor when a rank is lost (not heard from for the stall time):
    the runner then stops the job and names it. ``hosts``: each rank's host."""

    def __init__(self, hosts: dict[int, str] | None = None) -> None:
        self.hosts = hosts or {}
        self.rank: int | None = None
        self.silent = 0.0
        self.stalled: str | None = None  # the stall report of a job ended for waiting too long
        self._event = threading.Event()

    def set(self, rank: int, silent: float) -> None:
        if not self._event.is_set():
            self.rank, self.silent = rank, silent
            self._event.set()

    def stall(self, rank: int, report: str) -> None:
        """End the job: ``rank`` has waited longer than ``Config.stall_shutdown``, as ``report`` says."""
        if not self._event.is_set():
            self.rank, self.stalled = rank, report
            self._event.set()

    def is_set(self) -> bool:
        return self._event.is_set()

    def failure(self, registry: dict[int, dict]) -> TaskFailedError:
        host = registry.get(self.rank, {}).get("host") or self.hosts.get(self.rank, "?")
        if self.stalled is not None:
            return TaskFailedError(
                f"Parallax job ended: it stalled ({self.stalled.removeprefix('Parallax stall: ')}), longer than "
                "Config.stall_shutdown allows; every rank was stopped", rank=self.rank, host=host, exit_code=None,
                log_path=None)
        return TaskFailedError(
            f"Parallax job failed: rank {self.rank} on host {host} was lost: no heartbeat for {self.silent:.0f} s "
            "(its host or the network to it is gone); every other rank was stopped", rank=self.rank, host=host,
            exit_code=None, log_path=None)


def _own_line(output: str, rank: int) -> tuple[str, int] | None:
    """What mpirun says of ``rank`` itself: (how, exit code), or ``None``."""
    for m in _SIGNAL_RE.finditer(output):
        if int(m.group(1)) == rank:
            return _signal_words(int(m.group(4))), -int(m.group(4))
    for m in _ABORT_RE.finditer(output):
        if int(m.group(1)) == rank:
            return "failed (an exception or a non-zero exit; its traceback is above)", 1
    return None


def _signal_words(sig: int) -> str:
    try:
        return f"was killed by signal {sig} ({signal.Signals(sig).name})"
    except ValueError:
        return f"was killed by signal {sig}"


def parse_failure(output: str, registry: dict[int, dict], returncode: int,
                  first: int | None = None) -> TaskFailedError:
    """Turn mpirun's report into a :class:`TaskFailedError` naming rank and host.

    ``first``: the rank whose process ended first (the stall monitor's
    :meth:`~parallax.launch.monitor.StallMonitor.first_gone`); mpirun may name
    a peer that failed because of it, so it is named instead.
    """
    rank = host = None
    exit_code: int | None = None
    how = ""
    m = _SIGNAL_RE.search(output)
    if first is not None:
        rank = first
        exit_code, how = None, ("ended first, without an error of its own (killed, or its host failed); the "
                                "others failed after it")
        own = _own_line(output, first)
        if own is not None:
            how, exit_code = own
    elif m:
        rank, host, sig = int(m.group(1)), m.group(3), int(m.group(4))
        exit_code, how = -sig, _signal_words(sig)
    elif (m := _ABORT_RE.search(output)):
        rank, host = int(m.group(1)), m.group(3)
        exit_code = 1
        how = "failed (an exception or a non-zero exit; its traceback is above)"
    elif (m := _EXIT_RE.search(output)):
        rank, exit_code = int(m.group(1)), int(m.group(2))
        how = f"exited with code {exit_code}"
    entry = registry.get(rank, {}) if rank is not None else {}
    host = entry.get("host", host)
    pid = entry.get("pid")
    log = entry.get("log")
    if rank is None:
        message = f"Parallax job failed: mpirun exited with code {returncode}"
    else:
        message = (f"Parallax job failed: rank {rank} on host {host}"
                   f"{f' (pid {pid})' if pid else ''} {how}; every other rank was stopped")
    if log:
        message += f". Its output: {log}"
    return TaskFailedError(message, rank=rank, host=host, exit_code=exit_code, log_path=log)


def _is_our_rank(pid: int, job_dir: str) -> bool:
    """Whether ``pid`` is still a rank of this job (its environment names ``job_dir``)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            return f"{JOB_DIR_ENV}={job_dir}".encode() in f.read().split(b"\0")
    except OSError:
        return False


def _kill_leftovers(registry: dict[int, dict], local_hosts: frozenset[str], job_dir: str) -> list[int]:
    killed = []
    for entry in registry.values():
        pid = entry.get("pid")
        if not pid or entry.get("host") not in local_hosts or not _is_our_rank(pid, job_dir):
            continue
        try:
            os.kill(pid, signal.SIGKILL)
            killed.append(pid)
        except (ProcessLookupError, PermissionError):
            pass
    return killed


def run_job(command: LaunchCommand, job_dir: str, local_hosts: frozenset[str],
            popen: Callable[..., subprocess.Popen] = subprocess.Popen,
            stderr_sink=None, lost: LostRank | None = None,
            culprit: Callable[[], tuple[str, int, float] | None] | None = None,
            preemption: Preemption | None = None) -> JobResult:
    """Run ``command`` to completion.

    Args:
        command: the mpirun command (see :mod:`parallax.launch.command`).
        job_dir: directory where the ranks register.
        local_hosts: names of this machine, whose leftover rank processes may be killed.
        popen: process starter (injected by tests).
        stderr_sink: where mpirun's stderr goes (default ``sys.stderr``).
        lost: set when a rank is lost: mpirun and everything it started here are
            then stopped (SIGTERM, SIGKILL 3 s later) and the rank is named.
        culprit: the stall monitor's :meth:`~parallax.launch.monitor.StallMonitor.culprit`:
            the rank that ended first, or was lost, named instead of mpirun's pick.
        preemption: set (by a rank's heartbeat, or here by a SIGTERM to this process) when the job is to end
            with a checkpoint; a SIGTERM without it, or a second one, stops mpirun at once.

    Returns:
        A :class:`JobResult`.
    """
    sink = stderr_sink or sys.stderr
    env = dict(os.environ)
    env.update(command.env)
    proc = popen(list(command.argv), env=env, stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                 text=True, errors="replace", start_new_session=True, preexec_fn=_end_with_launcher)
    tail: deque[str] = deque(maxlen=400)

    quiet = LEVEL_ENV not in os.environ  # the user's TF_CPP_MIN_LOG_LEVEL wins (parallax.launch.output)

    def pump() -> None:
        for raw in proc.stderr:
            line = cleaned(raw, quiet)
            if line is None:
                continue
            tail.append(line)
            sink.write(line)
            sink.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    previous = {}
    received: list[int] = []

    def forward(signum, frame):
        received.append(signum)
        if signum == signal.SIGTERM and preemption is not None and not preemption.is_set():
            preemption.request("SIGTERM to the launcher")  # a second SIGTERM stops mpirun at once
            return
        try:
            proc.send_signal(signum)
        except ProcessLookupError:
            pass

    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, forward)
    try:
        returncode = _wait(proc, lost, preemption)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    reader.join(timeout=5)
    registry = read_registry(job_dir)
    time.sleep(0.1)
    _kill_leftovers(registry, local_hosts, job_dir)
    signalled = received[0] if received else None
    if lost is not None and lost.is_set():  # mpirun was stopped by us: its own exit code says nothing
        return JobResult(1, lost.failure(registry), signalled)
    if preemption is not None and preemption.is_set() and signal.SIGINT not in received and returncode != 0:
        # (a job that finished before the chief's next step ends well: nothing is left to resume)
        return JobResult(PREEMPTED_EXIT_CODE, None, signal.SIGTERM, preemption.source)
    if returncode == 0:
        return JobResult(0, None, signalled)
    blamed = culprit() if culprit is not None else None
    if blamed is not None and blamed[0] == "lost" and lost is not None:
        lost.set(blamed[1], blamed[2])
        return JobResult(1, lost.failure(registry), signalled)
    first = blamed[1] if blamed is not None else None
    return JobResult(returncode, parse_failure("".join(tail), registry, returncode, first), signalled)


def _end_with_launcher() -> None:
    """In mpirun, before it starts: a SIGTERM when the launcher's thread that started it ends, however it ends
    (a SIGKILL too: a supervisor's SIGTERM then SIGKILL, sooner than the ranks' checkpoint), so that mpirun ends
    the ranks rather than leaving them (Linux's ``PR_SET_PDEATHSIG``; nothing elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM, 0, 0, 0)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass


def _wait(proc: subprocess.Popen, lost: LostRank | None, preemption: Preemption | None = None) -> int:
    """mpirun's exit code; when ``lost`` is set first, stop mpirun's whole session (it cannot end the
    job itself while it waits for a host that is gone); when ``preemption`` is, pass it to the ranks (SIGUSR1)
    and stop mpirun :data:`PREEMPT_GRACE` seconds later if the job has not ended."""
    if lost is None and preemption is None:
        return proc.wait()
    killed_at, started, asked_at = None, set(), None
    while True:
        try:
            code = proc.wait(timeout=0.2)
            if killed_at is not None:  # what mpirun started and left (an ssh to the lost host) goes too
                _signal_all(started, signal.SIGKILL)
            return code
        except subprocess.TimeoutExpired:
            pass
        if preemption is not None and preemption.is_set():
            now = time.monotonic()
            if asked_at is None:
                asked_at = now
                print(f"Parallax: {preemption.source}: the chief saves a checkpoint at its next step and the job "
                      "ends", file=sys.stderr, flush=True)
                _signal_all({proc.pid}, signal.SIGUSR1)
            elif now - asked_at > PREEMPT_GRACE + 5:  # mpirun did not end: it and what it started, all ours
                _signal_all({proc.pid} | _descendants(proc.pid), signal.SIGKILL)
            elif now - asked_at > PREEMPT_GRACE:  # mpirun stops every rank at a SIGTERM
                _signal_all({proc.pid}, signal.SIGTERM)
        if lost is None or not lost.is_set():
            continue
        now = time.monotonic()
        started |= _descendants(proc.pid)
        if killed_at is None:
            killed_at = now
            _signal_all(started | {proc.pid}, signal.SIGTERM)
        elif now - killed_at > 3:
            _signal_all(started | {proc.pid}, signal.SIGKILL)


def _descendants(pid: int) -> set[int]:
    """The processes ``pid`` started, and theirs (from /proc; empty where there is none)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", encoding="utf-8") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        children.setdefault(parent, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in found:
                found.add(child)
                todo.append(child)
    return found


def _signal_all(pids: set[int], sig: int) -> None:
    """Signal mpirun and what it started (its ssh clients, its local ranks): all ours, by PID."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
