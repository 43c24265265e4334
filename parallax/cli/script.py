"""The training script as a process of the command's own: run to its end with a SIGTERM passed on
(``parallax-run``), or only up to its ``parallel_run``, which writes what the command asked for and exits
(a dry run, a plan, a manifest)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys


def _run_forwarding_sigterm(argv: list[str], env: dict) -> int:
    """Run the program; a SIGTERM this process gets (a manager ending the job) goes to it, which ends its job
    as a SIGTERM to the launcher does."""
    proc = subprocess.Popen(argv, env=env)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:  # the program ends its job (it may have had the terminal's Ctrl-C too)
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)


def _run_to_parallel_run(argv: list[str], env: dict, output: str, timeout: float, command: str, what: str) -> int:
    """Run a script whose ``parallel_run`` writes ``output`` and exits (a plan, a dry run); its exit code,
    or 1 with a message when it times out or never reaches ``parallel_run``."""
    try:
        proc = subprocess.run(argv, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"{command}: {what} did not reach parallel_run in {timeout:.0f} s", file=sys.stderr)
        return 1
    if proc.returncode != 0:
        return proc.returncode
    if not os.path.exists(output):
        print(f"{command}: {what} ended without calling parallax.parallel_run", file=sys.stderr)
        return 1
    return 0
