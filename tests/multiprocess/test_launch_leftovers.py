"""A job starts even where an earlier job was killed and left Open MPI's session files behind.

Open MPI 5 keeps them in ``$TMPDIR/ompi.<pid>`` by default; a killed ``mpirun`` leaves its
directory, and a later ``mpirun`` that the kernel gives the same pid (pid_max is often 32768)
then failed to start: "The PMIx server's listener thread failed to start", exit code 213. It
happened in CI, after the cluster tests that kill jobs on purpose. Parallax gives every job
a session directory of its own (``prte_tmpdir_base``, :mod:`parallax.launch.command`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket

import pytest

from tests.multiprocess.harness import ROOT, run_script

pytestmark = [pytest.mark.multiprocess, pytest.mark.core]

SCRIPT = os.path.join(ROOT, "tests", "multiprocess", "barrier_script.py")
PLANTED = 400  # pids ahead of the last one given out: a local job's mpirun takes one of the first few


def plant_leftovers(count: int, hosts: tuple[str, ...] = (socket.gethostname(),)) -> list[str]:
    """A killed job's session directories (``mpirun``'s and its daemons', for ``hosts``) for each of
    the next ``count`` free pids; returns the directories made here (the caller removes them)."""
    tmp = os.environ.get("TMPDIR", "/tmp")
    with open("/proc/sys/kernel/ns_last_pid") as f:
        pid = int(f.read())
    with open("/proc/sys/kernel/pid_max") as f:
        pid_max = int(f.read())
    made: list[str] = []
    while len(made) < 2 * count:
        pid = pid + 1 if pid + 1 < pid_max else 300  # where Linux starts again
        paths = [os.path.join(tmp, f"{kind}.{pid}") for kind in ("ompi", "prted")]
        if os.path.exists(f"/proc/{pid}") or any(os.path.exists(p) for p in paths):
            continue
        for path in paths:
            os.mkdir(path)
            made.append(path)
            for host in hosts:
                with open(os.path.join(path, f"pmix.{host}.tool"), "w"):
                    pass
    return made


def test_a_job_starts_where_a_killed_job_left_its_session_files(tmp_path):
    planted = plant_leftovers(PLANTED)
    try:
        run = run_script(tmp_path, "localhost: cpu:0,cpu:1\n", script=SCRIPT, timeout=120)
    finally:
        for path in planted:
            shutil.rmtree(path, ignore_errors=True)
    assert run.returncode == 0, run.output[-3000:]
    seen = [json.loads((tmp_path / "out" / f"rank_{r}.json").read_text()) for r in (0, 1)]
    assert [s["size"] for s in seen] == [2, 2]
