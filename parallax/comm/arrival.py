"""Waiting for MPI requests without holding a core.

A blocking MPI call that waits for a late member polls: Open MPI's progress loop, with
``mpi_yield_when_idle`` a ``sched_yield`` per turn, takes a core for as long as the wait lasts.
That is harmless when every process of a host is in the same call, and harmful when the late
member waits for somebody who needs that core. HYBRID across hosts is that case: a worker's
all-reduce waits for workers who wait for a parameter server's gRPC answer, and on a host with
fewer cores than processes the polling workers starve the servers and gRPC threads the chain
goes through (docs/benchmarks.md: 2 cores, 4 workers on two virtual hosts, 11-14 steps/s polling,
24-26 waiting asleep).

:func:`wait_asleep` tests a request for a while (a short wait stays as quick as polling), then
sleeps between tests, each nap twice the last up to a bound. :func:`arrive` waits so for every
member of a communicator (an ``Ibarrier``) before a blocking collective: the collective itself
then starts with everybody there, and keeps Open MPI's tuned algorithms, which its
non-blocking collectives do not have. The compiled all-reduce op (``allreduce.cc``,
``Arrive``) does the same, so processes with and without it issue the same MPI calls.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

__all__ = ["wait_asleep", "arrive", "FIRST_NAP_SECONDS", "LONGEST_NAP_SECONDS", "DEFAULT_SPIN_SECONDS"]

#: The first sleep between tests, once the spin is over (seconds); each next one is twice as long.
FIRST_NAP_SECONDS = 20e-6
#: The longest sleep between tests of a collective's arrival (seconds): what a wait can overshoot.
LONGEST_NAP_SECONDS = 1e-3
#: How long :func:`arrive` tests without sleeping by default (seconds): the waits of ranks that run
#: in step (MPI mode on one host) are shorter; a wait on a server's answer is longer.
DEFAULT_SPIN_SECONDS = 1e-3


def wait_asleep(request: Any, spin: float = 0.0, first_nap: float = FIRST_NAP_SECONDS,
                longest_nap: float = LONGEST_NAP_SECONDS,
                on_waiting: Callable[[], None] | None = None) -> None:
    """Wait for an mpi4py ``request``: test it for ``spin`` seconds, then sleep between tests.

    Args:
        request: an mpi4py ``Request`` (``comm.Ibarrier()``, ...).
        spin: seconds of tests without sleeping.
        first_nap: the first sleep (seconds); each next one doubles, up to ``longest_nap``.
        longest_nap: the longest sleep between tests (seconds).
        on_waiting: called before each sleep (a heartbeat, a log line).
    """
    deadline = time.perf_counter() + spin
    nap = first_nap
    while not request.Test():
        if spin > 0 and time.perf_counter() < deadline:
            continue
        if on_waiting is not None:
            on_waiting()
        time.sleep(nap)
        nap = min(nap * 2, longest_nap)


def arrive(comm: Any, spin: float | None) -> None:
    """Wait for every member of ``comm`` to get here (an ``Ibarrier``, :func:`wait_asleep`).

    ``spin`` ``None``: nothing happens (and no MPI call is made): every member of ``comm`` must
    agree on it, since the others' next collective would otherwise meet this one's barrier.
    """
    if spin is not None:
        wait_asleep(comm.Ibarrier(), spin)
