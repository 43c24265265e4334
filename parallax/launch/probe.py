"""Measure the link between two hosts (or two processes of one host): ``parallax probe``.

Two processes, started with the same ``mpirun`` (and the same ssh, Slurm or
MPI options) as a job's ranks, send messages back and forth over MPI: the
median half round trip of an 8-byte message is the latency; of a large one
(16 MiB by default), its size over that time, less the latency, is the
bandwidth per direction. The figures are what ``parallax plan --predict``
takes as ``--bandwidth`` and ``--latency`` (or ``--inside_bandwidth`` and
``--inside_latency`` when both processes are on one host).

The first process prints one line, ``PARALLAX_PROBE {json}``, which the
launching process reads.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass

from parallax.errors import LaunchError
from parallax.launch.command import build_mpirun_command
from parallax.launch.layout import RankSpec
from parallax.resources.cluster import is_local_host, local_host_names, usable_cores

__all__ = ["LinkMeasurement", "probe", "measure", "MARKER"]

MARKER = "PARALLAX_PROBE "
SMALL = 8
LARGE = 16 * 2**20


@dataclass(frozen=True)
class LinkMeasurement:
    """A measured link: its two ends, bytes per second each way, and one-way latency in seconds."""

    hosts: tuple[str, str]
    bandwidth: float
    latency: float

    def options(self) -> str:
        """The ``parallax plan --predict`` options that give this link."""
        prefix = "--inside_" if self.hosts[0] == self.hosts[1] else "--"
        return (f"{prefix}bandwidth {self.bandwidth * 8 / 1e9:.3g}Gbit "
                f"{prefix}latency {self.latency * 1e6:.3g}us")


def measure(comm, large: int = LARGE, repeats: int = 20) -> dict[str, float] | None:
    """Ping-pong between ranks 0 and 1 of ``comm``; rank 0 gets ``{bandwidth, latency}``, others ``None``."""
    import numpy as np

    rank = comm.Get_rank()
    peer = 1 - rank

    def half_round_trips(nbytes: int, count: int) -> list[float]:
        buffer = np.zeros(nbytes, dtype=np.uint8)
        times = []
        for i in range(count + 2):  # two to warm up
            comm.Barrier()
            start = time.perf_counter()
            if rank == 0:
                comm.Send(buffer, dest=peer, tag=1)
                comm.Recv(buffer, source=peer, tag=2)
            else:
                comm.Recv(buffer, source=peer, tag=1)
                comm.Send(buffer, dest=peer, tag=2)
            if i >= 2:
                times.append((time.perf_counter() - start) / 2)
        return times

    latency = statistics.median(half_round_trips(SMALL, repeats * 10))
    transfer = statistics.median(half_round_trips(large, repeats))
    if rank != 0:
        return None
    return {"latency": latency, "bandwidth": large / max(transfer - latency, 1e-9)}


def probe(hosts: tuple[str, str], mpirun: str, *, mpirun_options: str = "", timeout: float = 120,
          large: int = LARGE) -> LinkMeasurement:
    """Measure the link between ``hosts`` (the same name twice: two processes of that host).

    Raises:
        LaunchError: the processes could not start or did not report in ``timeout`` seconds,
            with mpirun's last output.
    """
    ranks = tuple(RankSpec(h, None, 0) for h in hosts)
    local = local_host_names() | {h for h in hosts if is_local_host(h)}
    where = f"between {hosts[0]} and {hosts[1]}" if hosts[0] != hosts[1] else f"inside {hosts[0]}"
    try:
        with tempfile.TemporaryDirectory(prefix="parallax_probe_") as session_dir:
            command = build_mpirun_command(
                mpirun, sys.executable, ["-m", "parallax.launch.probe", "--rank", "--large", str(large)], ranks,
                local_hosts=local, cpu_count=usable_cores(),
                is_root=hasattr(os, "geteuid") and os.geteuid() == 0, user_options=mpirun_options,
                environ=dict(os.environ), session_dir=session_dir)
            done = subprocess.run(list(command.argv), env={**os.environ, **command.env}, capture_output=True,
                                  text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise LaunchError(f"the link probe {where} did not finish in {timeout:g} s (are both hosts reachable? "
                          f"parallax-run --check tells)") from e
    for line in done.stdout.splitlines():
        if line.startswith(MARKER):
            found = json.loads(line[len(MARKER):])
            return LinkMeasurement(hosts, found["bandwidth"], found["latency"])
    tail = (done.stdout + done.stderr).strip().splitlines()[-15:]
    raise LaunchError(f"the link probe {where} failed (exit code {done.returncode}):\n  " + "\n  ".join(tail))


def _rank_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", action="store_true")
    parser.add_argument("--large", type=int, default=LARGE)
    args = parser.parse_args(argv)
    from mpi4py import MPI

    result = measure(MPI.COMM_WORLD, args.large)
    if result is not None:
        print(MARKER + json.dumps(result), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(_rank_main(sys.argv[1:]))
