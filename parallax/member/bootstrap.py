"""What a launched process does first: learn its rank, register, redirect output.

The launcher passes the job to every rank in environment variables:
``PARALLAX_LAUNCH`` (JSON: the rank layout, and what the ranks must agree on
with the launcher: the job plan's layout and digest, and how many GPUs a bare
host line stands for) and ``PARALLAX_JOB_DIR`` (where ranks register for
failure reports).
"""

from __future__ import annotations

import os
import socket
import sys
from collections.abc import Callable
from dataclasses import dataclass, field

from parallax.errors import LaunchError
from parallax.invocation import Invocation, LaunchIdentity, RankChannel
from parallax.launch.layout import RankSpec, layout_from_json
from parallax.launch.monitor import Heartbeat
from parallax.launch.runner import register_rank

__all__ = ["RankContext", "launched_context", "make_heartbeat", "tee_output", "finish_together",
           "leave_together", "end_on_exception"]



@dataclass(frozen=True)
class RankContext:
    """This process's place in a launched job.

    Attributes:
        rank: its MPI rank.
        size: the number of ranks.
        ranks: every rank of the job, as the launcher started them.
        job: what the launcher said of the job (its ``layout``, the ``digest`` of the
            job plan, the ``gpus`` a bare host line stands for); ``None`` each for a
            program that launched plain ranks.
        job_dir: where ranks register for failure reports.
        channel: how this rank reaches its launcher (the job directory, the stall monitor).
    """

    rank: int
    size: int
    ranks: tuple[RankSpec, ...]
    job: LaunchIdentity
    job_dir: str
    channel: RankChannel = field(default_factory=RankChannel)

    @property
    def spec(self) -> RankSpec:
        return self.ranks[self.rank]


def make_heartbeat(context: RankContext) -> Heartbeat | None:
    """A :class:`~parallax.launch.monitor.Heartbeat` from this rank to the launcher's stall
    monitor (it says ``done`` when the process exits), or ``None`` when the launcher runs none
    (``context.channel``)."""
    address = context.channel.monitor
    if not address:
        return None
    import atexit

    beat = Heartbeat(address, context.rank, orphan_after=context.channel.stall_timeout)
    atexit.register(beat.close)
    return beat


def launched_context(invocation: Invocation, redirect_path: str | None = None) -> RankContext | None:
    """This process's :class:`RankContext` if the Parallax launcher started it (``invocation.launch``, and its
    ``channel``), else ``None``.

    Initializes MPI (through mpi4py), registers the rank in the job directory
    and, with ``redirect_path``, sends this process's stdout and stderr to
    ``<redirect_path>/<role>_<rank>.stdout`` / ``.stderr`` (role ``worker`` or ``ps``).

    Raises:
        LaunchError: MPI's world size disagrees with the layout the launcher sent.
    """
    identity = invocation.launch
    if identity is None:
        return None
    ranks = layout_from_json(identity.ranks)
    from mpi4py import MPI

    comm = MPI.COMM_WORLD
    if comm.size != len(ranks):
        raise LaunchError(f"this process was launched with {comm.size} MPI ranks, but the job has "
                          f"{len(ranks)}; start jobs with parallel_run or parallax-run, not a bare mpirun")
    job_dir = invocation.channel.job_dir or ""
    log_path = None
    if redirect_path:
        os.makedirs(redirect_path, exist_ok=True)
        base = os.path.join(redirect_path, f"{ranks[comm.rank].role}_{comm.rank}")
        log_path = base + ".stderr"
        _redirect(base + ".stdout", 1, sys.stdout)
        _redirect(log_path, 2, sys.stderr)
    if job_dir:
        register_rank(job_dir, comm.rank, socket.gethostname(), log_path)
    _note_failures()
    # Every rank reaches its training call before any enters a collective, waited for asleep: a rank that waits in
    # a blocking collective polls, and on one host the first rank (with staggered_start, seconds ahead) took a core
    # from the others' start-up that way (a 2-rank job on 2 cores: 3 s more CPU, 4 s more wall, 2026-12-03)
    _idle_barrier()
    return RankContext(comm.rank, comm.size, ranks, identity, job_dir, invocation.channel)


def tee_output(redirect_path: str, name: str = "worker_0") -> Callable[[], None]:
    """``redirect_path`` for a process that trains alone: its stdout and stderr (TensorFlow's
    own lines too) also go to ``<redirect_path>/<name>.stdout`` / ``.stderr``, and still to the
    terminal, until the returned function is called (the session's ``close``) or the process exits."""
    import atexit
    import threading

    os.makedirs(redirect_path, exist_ok=True)
    pumps = []
    for fd, stream, suffix in ((1, sys.stdout, "stdout"), (2, sys.stderr, "stderr")):
        stream.flush()
        terminal = os.dup(fd)
        read_end, write_end = os.pipe()
        os.dup2(write_end, fd)
        os.close(write_end)
        target = os.open(os.path.join(redirect_path, f"{name}.{suffix}"), os.O_WRONLY | os.O_CREAT | os.O_APPEND,
                         0o644)

        def pump(read_end=read_end, terminal=terminal, target=target) -> None:
            while chunk := os.read(read_end, 65536):
                os.write(target, chunk)
                os.write(terminal, chunk)
            os.close(target)
            os.close(read_end)

        thread = threading.Thread(target=pump, name=f"parallax-tee-{suffix}", daemon=True)
        thread.start()
        pumps.append((fd, stream, terminal, thread))

    def restore() -> None:
        atexit.unregister(restore)
        for fd, stream, terminal, thread in pumps:
            stream.flush()
            os.dup2(terminal, fd)  # the pipe's last writer closes: the pump reads to the end and stops
            thread.join(timeout=5)
            os.close(terminal)
        pumps.clear()

    atexit.register(restore)
    return restore


def _redirect(path: str, fd: int, stream) -> None:
    stream.flush()
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(target, fd)
    os.close(target)


def end_on_exception(end: Callable[[BaseException], None]) -> None:
    """When this process ends with an unhandled exception, call ``end`` with it right after the traceback
    (once per process: a second call changes nothing), so no exit handler runs or delays the end."""
    if getattr(sys.excepthook, "_parallax", False):
        return
    previous = sys.excepthook

    def hook(kind, value, traceback):
        previous(kind, value, traceback)
        sys.stdout.flush()
        sys.stderr.flush()
        end(value)

    hook._parallax = True  # type: ignore[attr-defined]
    sys.excepthook = hook


def _note_failures() -> None:
    """When this process ends with an unhandled exception, abort the job at once, after the
    traceback: exit handlers (Horovod's shutdown, say) would otherwise fail other ranks first,
    and the job would name one of them instead of this rank."""

    def abort(_: BaseException) -> None:
        from mpi4py import MPI

        MPI.COMM_WORLD.Abort(1)

    end_on_exception(abort)


#: How often a process waiting at the end of the job looks whether the others are there (seconds).
EXIT_POLL_SECONDS = 0.01


def _idle_barrier(on_waiting: Callable[[], None] | None = None) -> None:
    """``COMM_WORLD``'s barrier, waited for asleep: tested every :data:`EXIT_POLL_SECONDS`.

    A blocking ``Barrier`` polls (with ``mpi_yield_when_idle``, a ``sched_yield`` loop), and a
    parameter server waits in it from its start to the end of training: on 2 cores, HYBRID's two
    servers each took half a core that way, from the workers and from their own gRPC threads.
    ``on_waiting`` is called at each test while the others are not there.
    """
    from mpi4py import MPI

    from parallax.comm.arrival import wait_asleep

    wait_asleep(MPI.COMM_WORLD.Ibarrier(), first_nap=EXIT_POLL_SECONDS, longest_nap=EXIT_POLL_SECONDS,
                on_waiting=on_waiting)


def leave_together() -> None:
    """Exit handler of PS and HYBRID processes: every process leaves when all do (servers
    wait for the workers, without taking a core: :func:`_idle_barrier`). One ending with an
    exception never gets here: it aborts the job from ``sys.excepthook`` (:func:`_note_failures`)."""
    _idle_barrier()


def finish_together(rank: int, timeout: float) -> None:
    """Register an exit check for an all-reduce rank: wait for every rank to end too.

    Ranks of a synchronous all-reduce job run in lockstep, so when one ends the
    others end within about a step. If they do not within ``timeout`` seconds
    (:attr:`parallax.job.settings.Timeouts.finish`), they are waiting in an all-reduce
    this rank will never join (it ran fewer steps): the job is aborted with a
    message instead of hanging. A rank ending with an exception aborts the job before
    this check (:func:`_note_failures`).
    """
    import atexit
    import time

    def check() -> None:
        deadline = time.monotonic() + timeout

        def abort_when_late() -> None:
            if time.monotonic() > deadline:
                from mpi4py import MPI

                sys.stderr.write(
                    f"Parallax: rank {rank} finished, but after {timeout:.0f} s other ranks are still "
                    "waiting in an all-reduce it will never join: every rank must run the same number of "
                    "steps (give each the same number of batches)\n")
                sys.stderr.flush()
                MPI.COMM_WORLD.Abort(3)

        _idle_barrier(abort_when_late)

    atexit.register(check)
