"""One trial, run to its end: a command in a process group of its own, its log and its result.

A trial is a whole Parallax job (its launcher, ``mpirun`` and ranks, or one
process that trains alone) started as one command. It writes what it measured
as JSON to the file named by :data:`RESULT_ENV`; its output goes to a log file
in the trial's directory. :func:`run_trial` waits for it at most its time
limit; a trial still running then is ended with its whole process group
(``SIGTERM``, then ``SIGKILL``): the processes it started, and nothing else.

Both back ends (:mod:`parallax.trials.runner`) call :func:`run_trial` where the
trial runs: a thread of the master for local processes, a Dask worker's task
for Dask; the master itself trains nothing.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from parallax.invocation import env_with

__all__ = ["TrialSpec", "TrialResult", "run_trial", "STATUSES", "tail_of", "write_result"]

#: What became of a trial.
STATUSES = ("ok", "failed", "timeout", "lost")
_TAIL_LINES = 30
_KILL_GRACE = 5.0


@dataclass(frozen=True)
class TrialSpec:
    """One trial.

    Attributes:
        name: how reports name it (unique in a run).
        argv: the command (``[python, script, ...]``).
        directory: where its log and result go (made if missing).
        env: variables added to the environment it starts with.
        time_limit: seconds it may run; ``None``: no limit.
        devices: the devices it trains on (``"host/device"``); trials whose devices overlap do not run at once.
        params: what the trial tries (reported back with its result).
    """

    name: str
    argv: tuple[str, ...]
    directory: str
    env: Mapping[str, str] = field(default_factory=dict)
    time_limit: float | None = None
    devices: tuple[str, ...] = ()
    params: Mapping[str, Any] = field(default_factory=dict)

    @property
    def log_path(self) -> str:
        return os.path.join(self.directory, "log.txt")

    @property
    def result_path(self) -> str:
        return os.path.join(self.directory, "result.json")


@dataclass
class TrialResult:
    """What became of a trial (``status`` one of :data:`STATUSES`) and what it measured (``value``)."""

    name: str
    status: str
    params: Mapping[str, Any]
    value: Any = None
    seconds: float = 0.0
    returncode: int | None = None
    error: str | None = None
    log: str = ""
    tail: str = ""
    where: str = ""

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def describe(self) -> str:
        """One line: the trial, its outcome, and for a failure the reason and the log's path."""
        if self.ok:
            return f"{self.name}: ok in {self.seconds:.1f} s"
        return f"{self.name}: {self.status} after {self.seconds:.1f} s on {self.where}: {self.error} (log {self.log})"


def tail_of(path: str, lines: int = _TAIL_LINES) -> str:
    """The last ``lines`` lines of a text file ('' when it cannot be read)."""
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - 16384))
            text = f.read().decode("utf-8", "replace")
    except OSError:
        return ""
    return "\n".join(text.splitlines()[-lines:])


def run_trial(spec: TrialSpec) -> TrialResult:
    """Run ``spec`` to its end or its time limit; never raises for what the trial does."""
    os.makedirs(spec.directory, exist_ok=True)
    if os.path.exists(spec.result_path):
        os.remove(spec.result_path)
    # this process's environment (env_with's base), handed through with the trial's variables and result file
    env = env_with({**env_with(), **spec.env}, trial_result=spec.result_path)
    began = time.monotonic()
    status, error, code = "ok", None, None
    with open(spec.log_path, "wb") as log:
        try:
            proc = subprocess.Popen(list(spec.argv), stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, start_new_session=True)
        except OSError as e:
            return TrialResult(spec.name, "failed", spec.params, error=f"cannot start {spec.argv[0]}: {e}",
                               log=spec.log_path, where=socket.gethostname())
        try:
            code = proc.wait(timeout=spec.time_limit)
        except subprocess.TimeoutExpired:
            _end_group(proc)
            status, error = "timeout", f"still running after its time limit of {spec.time_limit:g} s; ended"
        except BaseException:  # the runner is going away: take the trial with it
            _end_group(proc)
            raise
    seconds = time.monotonic() - began
    value = None
    if status == "ok":
        if code != 0:
            status, error = "failed", _exit_text(code)
        else:
            try:
                with open(spec.result_path, encoding="utf-8") as f:
                    value = json.load(f)
            except (OSError, ValueError) as e:
                status, error = "failed", f"exited 0 without a result ({spec.result_path}: {e})"
    return TrialResult(spec.name, status, spec.params, value, seconds, code, error, spec.log_path,
                       tail_of(spec.log_path) if status != "ok" else "", socket.gethostname())


def write_result(result: dict, path: str | None) -> None:
    """Inside a trial: write its result (JSON) to ``path`` (:data:`RESULT_ENV`'s file; ``None``: nowhere), whole
    or not at all."""
    if not path:
        return
    tmp = f"{path}.{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(result, f, indent=1, sort_keys=True, default=float)
    os.replace(tmp, path)


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return f"ended by {signal.Signals(-code).name}"
        except ValueError:
            return f"ended by signal {-code}"
    return f"exited with {code}"


def _end_group(proc: subprocess.Popen) -> None:
    """End the trial's process group (it has one of its own: ``start_new_session``)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, sig)
        deadline = time.monotonic() + _KILL_GRACE
        while time.monotonic() < deadline:
            # reap the leader first: a zombie still counts as a member of its group
            if proc.poll() is not None and not _group_alive(proc.pid):
                return
            time.sleep(0.1)
    proc.wait()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True
