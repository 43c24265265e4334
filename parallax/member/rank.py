"""A launched process's part in its job, and what it keeps for the job's whole life.

A process the launcher started is one rank of one job. Its TensorFlow server
cannot be stopped (TensorFlow has no ``Server.stop``), its MPI communicators are
made by every rank together, and its heartbeat and exit checks belong to the
process, not to one ``parallel_run`` call. So they are made once per process,
here, and every ``parallel_run`` call of the process (a second one, or the
partition search's trials) reuses them.

This is the one piece of process-wide state in Parallax, and it exists only in
processes the launcher started: a process that trains alone keeps nothing
between ``parallel_run`` calls.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from parallax.comm.group import MPIWorkers
from parallax.errors import LaunchError
from parallax.invocation import Invocation
from parallax.launch.layout import RankSpec
from parallax.member import preemption
from parallax.member.bootstrap import (
    RankContext,
    finish_together,
    launched_context,
    leave_together,
    make_heartbeat,
)
from parallax.member.protocol import NoHeartbeat
from parallax.member.servers import start_server
from parallax.resources.cluster import Role

if TYPE_CHECKING:
    from parallax.comm.broadcast import Broadcast
    from parallax.job.plan import JobPlan, ProcessSpec
    from parallax.job.settings import Settings

__all__ = ["LaunchedProcess", "launched_process"]


class LaunchedProcess:
    """What one launched process starts once: its server, communicators, heartbeat and exit checks.

    Args:
        context: this process's place in the job.
    """

    def __init__(self, context: RankContext) -> None:
        self.context = context
        self._server: Any = None
        self._comms: tuple[Any, Any] | None = None
        self._heartbeat: Any = None
        self._exit_check: str | None = None
        self.calls = 0  # parallel_run calls this process has begun
        preemption.install(self._ask_to_preempt)

    def _ask_to_preempt(self) -> None:
        """This process got SIGTERM: ask the launcher to end the job with a checkpoint."""
        if self._heartbeat is not None:
            self._heartbeat.preempt()

    @property
    def rank(self) -> int:
        return self.context.rank

    @property
    def spec(self) -> RankSpec:
        return self.context.spec

    def process_in(self, job: JobPlan) -> ProcessSpec:
        """This process's part of ``job``: the process of its rank."""
        return job.process(self.rank)

    def start_server(self, job: JobPlan, settings: Settings, process: ProcessSpec,
                     group_leader: str | None = None) -> Any:
        """Start this rank's server: the ranks agree on free ports over MPI
        (:func:`parallax.member.servers.start_server`)."""
        jobs = [(p.role, p.index) for p in job.processes]
        return start_server(self.rank, jobs, settings, process, group_leader=group_leader)

    def broadcast(self, job: JobPlan, process: ProcessSpec, settings: Settings) -> Broadcast:
        """Worker 0's values go to the other workers over MPI."""
        from parallax.comm.broadcast import MPIBroadcast

        return MPIBroadcast(self.workers_comm())

    def server(self, start: Callable[[], Any], chief: bool = False) -> Any:
        """This process's TensorFlow server: ``start()`` the first time, the same server after.

        On a later ``parallel_run`` call of a worker, once every worker is done with the previous
        job, the ``chief`` clears what that job left on the servers (variables, queues, accumulators).
        """
        if self._server is None:
            self._server = start()
        elif self.calls > 1 and self.spec.role == Role.WORKER:
            comm = self.workers_comm()
            comm.Barrier()
            if chief:
                import tensorflow as tf

                tf.compat.v1.Session.reset(self._server.target)
            comm.Barrier()
        return self._server

    def split_comms(self) -> tuple[Any, Any]:
        """The MPI communicators of the job's workers and of this host's workers (``None`` on a
        server); made once, by every rank of the job together (an MPI collective)."""
        if self._comms is None:
            from mpi4py import MPI

            world = MPI.COMM_WORLD
            worker = self.spec.role == Role.WORKER
            hosts = list(dict.fromkeys(r.host for r in self.context.ranks))
            self._comms = (world.Split(0 if worker else MPI.UNDEFINED, self.rank),
                           world.Split(hosts.index(self.spec.host) if worker else MPI.UNDEFINED, self.rank))
        return self._comms

    def workers_comm(self) -> Any:
        """The communicator of the job's workers (``COMM_WORLD`` when every rank is one)."""
        if any(r.role != Role.WORKER for r in self.context.ranks):  # servers, or a pipeline's stage servers
            return self.split_comms()[0]
        from mpi4py import MPI

        return MPI.COMM_WORLD

    def workers_group(self) -> MPIWorkers:
        """The job's workers over their MPI communicator (:mod:`parallax.comm.group`)."""
        return MPIWorkers(self.workers_comm())

    def check_job(self, job: JobPlan, settings: Settings, source: str) -> None:
        """This process must make the launcher's job plan from its own copy of the graph (its first
        ``parallel_run`` call; later ones must agree among the workers, :meth:`begin_call`).

        Raises:
            LaunchError: the resource file or the graph differs from the launcher's.
        """
        context, digest = self.context, job.digest()
        if job.layout != context.job.layout or job.ranks != context.ranks:
            other = "" if job.layout == context.job.layout else f"; with this graph and config: {job.layout}"
            raise LaunchError(f"{source} does not describe the {context.job.layout} job this process was "
                              f"launched in ({len(job.ranks)} processes in the file, {len(context.ranks)} "
                              f"launched{other}); give parallel_run the resource file the job was started with")
        if self.begin_call(digest) > 0:
            return  # a later call: the workers agreed among themselves
        if context.job.digest not in (None, digest):
            raise LaunchError(f"rank {context.rank} (on host {context.spec.host}) made another job plan from its "
                              "graph than the launching process did: the training script must build the same graph "
                              "in every process (the same variables, shapes and optimizer, whatever the rank)")

    def begin_call(self, digest: str) -> int:
        """Count a ``parallel_run`` call of this worker and return its number (0 for the first).

        A later call (a second training job of the program, or a partition-search trial)
        makes its job plan from a graph the launcher never saw: the workers check that they
        all made the same one.

        Raises:
            LaunchError: the workers' plans differ.
        """
        number, self.calls = self.calls, self.calls + 1
        if number > 0:
            digests = self.workers_comm().allgather(digest)
            if len(set(digests)) > 1:
                others = sorted({r for r, d in enumerate(digests) if d != digests[0]})
                raise LaunchError(f"parallel_run call {number + 1}: workers {others} made another job plan from "
                                  "their graph than worker 0: every process must build the same graph")
        return number

    def heartbeat(self, state: str, where: str = "") -> Any:
        """This process's heartbeat to the stall monitor, now in ``state`` waiting ``where``."""
        if self._heartbeat is None:
            self._heartbeat = make_heartbeat(self.context) or NoHeartbeat()
        self._heartbeat.set(state, where)
        return self._heartbeat

    def exit_together(self, how: str, finish_timeout: float) -> None:
        """Register, once, how this process leaves the job: ``"finish"`` (an all-reduce rank
        waits at most ``finish_timeout`` s for the others, then aborts the job) or ``"barrier"``
        (workers and servers of a PS job leave when all do)."""
        if self._exit_check is not None:
            return
        self._exit_check = how
        if how == "finish":
            finish_together(self.rank, finish_timeout)
        else:
            import atexit

            atexit.register(leave_together)


_THIS_PROCESS: LaunchedProcess | None = None


def launched_process(invocation: Invocation, redirect_path: str | None = None) -> LaunchedProcess | None:
    """This process's :class:`LaunchedProcess` if the launcher started it (``invocation.launch``), else ``None``
    (made at the first call: MPI initialised, the rank registered, output redirected)."""
    global _THIS_PROCESS
    if _THIS_PROCESS is None:
        context = launched_context(invocation, redirect_path)
        if context is None:
            return None
        _THIS_PROCESS = LaunchedProcess(context)
    return _THIS_PROCESS
