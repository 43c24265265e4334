"""A process a cluster manager started: its server, its exit, and the watch on its peers.

A manager (Kubernetes' TFJob, Polyaxon, SageMaker, Vertex) starts every task
itself and says in ``TF_CONFIG`` which one each is
(:mod:`parallax.managers.tf_config`). There is no launcher and no MPI among the
tasks, so what :class:`~parallax.member.rank.LaunchedProcess` does over MPI is
done here over the tasks' TensorFlow servers (gRPC) alone:

* the server binds the address ``TF_CONFIG`` gives the task;
* the workers start from worker 0's values with TensorFlow's collective
  broadcast (:class:`~parallax.comm.broadcast.CollectiveBroadcast`);
* the tasks leave together (:class:`ExitBarrier`): each task adds itself to a
  queue on worker 0's server when its program ends, waits until every task has,
  then leaves; worker 0 leaves last, so no task loses a server it still needs;
* a task whose server goes away before that (its process died, or its host) ends
  every other task within seconds, naming it (:class:`~parallax.member.peer_watch.PeerWatch`);
* the workers talk between steps (``parallax.fit``'s metrics summed, a stop agreed) over queues on
  worker 0's server (:class:`~parallax.comm.chief_queues.ChiefQueues`).

GPUs: unlike a launched rank, a task gets no ``CUDA_VISIBLE_DEVICES`` from Parallax. The
manager gives each task its GPUs (the Kubernetes device plugin decides what CUDA shows the
container), and the task's process was started before Parallax ran in it, so TensorFlow may
already have read the variable. Its cluster lines are bare hosts (``TF_CONFIG`` names no
device), which stand for every GPU the task sees (``run_option='MPI'`` is refused with more
than one, :func:`parallax.job.settings.derive`), so its GPUs as it sees them are the ones its
sessions name (:attr:`parallax.job.plan.ProcessSpec.visible_device_list`, ``0,...,n-1``).

This is the process-wide state of a manager-started process (one per process,
as for a launched one); a process that trains alone keeps nothing.
"""

from __future__ import annotations

import atexit
import logging
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from parallax.comm.chief_queues import ChiefQueues, ChiefSession
from parallax.errors import LaunchError, PeerLost
from parallax.invocation import Invocation
from parallax.logs import log as logger
from parallax.managers.tf_config import ManagedJob, Task, parse_tf_config
from parallax.member import preemption
from parallax.member.bootstrap import end_on_exception
from parallax.member.peer_watch import PeerWatch, _end, _end_for_restart, _reachable  # its ends; its probe
from parallax.member.protocol import NoHeartbeat
from parallax.member.servers import make_server, server_config
from parallax.resources.cluster import Role

if TYPE_CHECKING:
    from parallax.comm.broadcast import Broadcast
    from parallax.comm.group import WorkerGroup
    from parallax.job.plan import JobPlan, ProcessSpec
    from parallax.job.settings import Settings

__all__ = ["JoinedProcess", "joined_process", "ExitBarrier", "PeerWatch", "BROADCAST_GROUP_OFFSET"]

#: Collective group keys of the start-up broadcast: beside the gradients' groups (1 + job key < 2**30).
BROADCAST_GROUP_OFFSET = 1 << 30
_CHIEF_DEVICE = "/job:worker/replica:0/task:0/device:CPU:0"


class JoinedProcess:
    """What one manager-started process keeps for its life (see the module docstring).

    Args:
        managed: the job the manager describes and this process's task in it.
    """

    def __init__(self, managed: ManagedJob) -> None:
        self.managed = managed
        self.calls = 0
        self._server: Any = None
        self._exit: ExitBarrier | None = None
        self._watch: PeerWatch | None = None
        self._how: str | None = None
        self._finish_timeout = 0.0
        self._beat: Any = None  # its heartbeat to worker 0's stall monitor
        self._monitor: Any = None  # worker 0's
        self._group: WorkerGroup | None = None  # a worker's, once its server has started

    @property
    def task(self) -> Task:
        return self.managed.task

    def begin_call(self, settings: Settings) -> None:
        """Count a ``parallel_run`` call: a manager-started process trains one job, without a partition search.

        Raises:
            LaunchError: on a second call, or when ``settings`` ask for a partition search.
        """
        self.calls += 1
        if self.calls > 1:
            raise LaunchError(f"parallel_run was called again in {self.managed.source}: a process started by a "
                              "cluster manager trains one job (its server and its peers belong to that job)")
        if settings.search_partitions:
            raise LaunchError(f"search_partitions runs trials the launcher starts, and {self.managed.source} was "
                              "started by a cluster manager: search with parallax-run on one machine, then set the "
                              "partition count it found")

    def process_in(self, job: JobPlan) -> ProcessSpec:
        """This task's part of ``job``: the process at its ``host:port``.

        Raises:
            LaunchError: the job plan has no process there (the run option leaves this task out).
        """
        for p in job.processes:
            if (p.role, p.host, p.port) == (self.task.role, self.task.host, self.task.port):
                return p
        raise LaunchError(f"{self.managed.source}: the {job.layout} job has no place for this task at "
                          f"{self.task.host}:{self.task.port}")

    def server(self, start: Callable[[], Any], chief: bool = False) -> Any:
        if self._server is None:
            self._server = start()
        return self._server

    def start_server(self, job: JobPlan, settings: Settings, process: ProcessSpec,
                     group_leader: str | None = None) -> Any:
        """Start the server at the task's address, then the exit barrier and the watch on the peers.

        Raises:
            LaunchError: the address cannot be bound.
        """
        import tensorflow as tf


        spec: dict[str, list[str]] = {}
        for p in sorted(job.processes, key=lambda p: (p.role, p.index)):
            spec.setdefault(p.role, []).append(f"{p.host}:{p.port}")
        try:
            server = make_server(spec, process.role, process.index, server_config(settings, process, group_leader),
                                 settings.ps.protocol)
        except (tf.errors.UnknownError, tf.errors.InternalError, RuntimeError) as e:
            raise LaunchError(f"{self.managed.source}: cannot start this task's server on port {process.port} "
                              f"(is it in use?): {e}") from e
        total = len(job.processes)
        identity = self._identity(job, process)
        chief = job.workers[0]
        self._exit = ExitBarrier(server.target, identity, total, chief=identity == 0,
                                 timeout_ms=int(settings.timeouts.ready_poll * 1000) + 5000,
                                 chief_address=(chief.host, chief.port))
        peers = [(self.managed.name_of(p.host, p.port), p.host, p.port) for p in job.processes if p is not process]
        self._watch = PeerWatch(peers, self.task.name, finished=self._exit.complete,
                                grace=min(settings.timeouts.stall or 3.0, 3.0))
        self._watch.start()
        self._beat, self._monitor = _stall_check(job, process, identity, settings, self._identity, self.managed)
        if process.role == Role.WORKER:
            self._group = ChiefQueues(server.target, process.index, len(job.workers), _CHIEF_DEVICE,
                                      settings.timeouts.operation_ms)
        atexit.register(self._leave)
        logger.info("Parallax: %s serving as %s %d on port %d", self.managed.source, process.role, process.index,
                    process.port)
        return server

    @staticmethod
    def _identity(job: JobPlan, process: ProcessSpec) -> int:
        """A number per task, 0 for worker 0 (which holds the exit barrier)."""
        order = sorted(job.processes, key=lambda p: (p.role != Role.WORKER, p.role, p.index))
        return order.index(process)

    def split_comms(self) -> tuple[Any, Any]:
        return None, None  # no MPI among the tasks

    def heartbeat(self, state: str, where: str = "") -> Any:
        """This task's heartbeat to worker 0's stall monitor (:func:`_stall_check`), now in ``state``; and every
        finished ``run`` lets the peer watch probe from the main thread (:meth:`PeerWatch.poll`), whose own
        thread can be held up for seconds while TensorFlow starts."""
        beat = _WatchBeat(lambda: self._watch, lambda: self._beat)
        beat.set(state, where)
        return beat

    def exit_together(self, how: str, finish_timeout: float) -> None:
        """``"finish"`` (all-reduce workers): wait at most ``finish_timeout`` s for the others at the end;
        ``"barrier"`` (PS): as long as the others train."""
        self._how = self._how or how
        self._finish_timeout = finish_timeout

    def workers_group(self) -> WorkerGroup | None:
        """The job's workers over queues on worker 0's server (the tasks share no MPI); ``None`` before this
        worker's server has started."""
        return self._group

    def broadcast(self, job: JobPlan, process: ProcessSpec, settings: Settings) -> Broadcast:
        from parallax.comm.broadcast import CollectiveBroadcast

        return CollectiveBroadcast(len(job.workers), process.index == 0,
                                   BROADCAST_GROUP_OFFSET + job.plan.comm.job_key,
                                   settings.timeouts.operation_ms / 1000)

    def _leave(self) -> None:
        if self._exit is None:
            return
        if self._beat is not None:
            self._beat.close()  # done: a peer still in a step does not wait for this task
        bound = self._finish_timeout if self._how == "finish" else None
        outcome = self._exit.wait(bound, failed=self._watch.failed if self._watch else None)
        if outcome is not None:
            _end(f"Parallax: {self.managed.source} finished, but {outcome}")
        if self._watch is not None:
            self._watch.stop()
        if self._monitor is not None:
            self._monitor.stop()


class _WatchBeat(NoHeartbeat):
    """The heartbeat of a manager-started process: its states go to worker 0's stall monitor (``beat``: the
    task's heartbeat once its server has started, ``None`` before or without one), and a step's end is a chance
    to probe the peers."""

    def __init__(self, watch: Callable[[], PeerWatch | None], beat: Callable[[], Any]) -> None:
        self._watch = watch
        self._beat = beat

    def set(self, state: str, where: str = "", steps: int | None = None) -> None:
        beat = self._beat()
        if beat is not None:
            beat.set(state, where, steps)

    def step_done(self) -> None:
        beat = self._beat()
        if beat is not None:
            beat.step_done()
        watch = self._watch()
        if watch is not None:
            watch.poll(time.monotonic())


def _stalled(_: int, report: str) -> None:
    """End the job from worker 0: a task has waited longer than ``Config.stall_shutdown`` (exit code 1: a
    restart would meet the same wait; the other tasks, left without worker 0, end as their watch ends them)."""
    _end(f"Parallax job ended: it stalled ({report.removeprefix('Parallax stall: ')}), longer than "
         "Config.stall_shutdown allows")


def _stall_check(job: JobPlan, process: ProcessSpec, identity: int, settings: Settings,
                 identity_of: Callable[[JobPlan, ProcessSpec], int], managed: ManagedJob) -> tuple[Any, Any]:
    """The stall check of a job a cluster manager started, as a launched job's
    (:mod:`parallax.launch.monitor`): every task sends its state to worker 0, on the UDP port of the number
    its server listens on over TCP (no other port needs to be open between the tasks), and worker 0 prints who
    waits for whom once a task has waited the stall time, and ends the job once one has waited
    ``stall_shutdown``. Returns this task's heartbeat and, in worker 0, the monitor (``None``, ``None`` when
    ``stall_timeout`` is off)."""
    from parallax.launch.monitor import Heartbeat, StallMonitor

    stall = settings.timeouts.stall
    if stall is None:
        return None, None
    chief = job.workers[0]
    monitor = None
    if identity == 0:
        names = {identity_of(job, p): f"task {managed.name_of(p.host, p.port)} ({p.host}:{p.port})"
                 for p in job.processes}
        try:
            monitor = StallMonitor(names, stall, bind_host="0.0.0.0", port=process.port,
                                   shutdown=settings.timeouts.shutdown, on_stalled=_stalled).start()
        except OSError as e:
            logger.warning("Parallax: no stall check in %s: UDP port %d is taken (%s)", managed.source,
                           process.port, e)
            return None, None
    return Heartbeat(f"{chief.host.strip('[]')}:{chief.port}", identity, lifeline=False), monitor

class ExitBarrier:
    """Every task leaves when all have finished; worker 0, which holds the barrier's queues, last.

    A task arrives once however often it starts: each has a queue of its own on worker 0, which holds one
    arrival. A parameter server arrives as soon as it starts; one that ended (its peer watch saw a worker gone)
    and was started again by its manager, while worker 0 went on, arrives again, and a count of arrivals would
    then reach the number of tasks while worker 0 still trained: the server would leave with 0, which no
    manager restarts, and worker 0 would wait for it without end (so it went in CI, 2026-12-07).

    Args:
        target: this task's server (``grpc://...``).
        identity: this task's number (0: worker 0).
        total: how many tasks the job has.
        chief: this is worker 0.
        timeout_ms: how long one call on worker 0's queues may take.
        chief_address: worker 0's ``(host, port)``, checked before it is asked anything.
    """

    def __init__(self, target: str, identity: int, total: int, chief: bool, timeout_ms: int,
                 chief_address: tuple[str, int] | None = None) -> None:
        import tensorflow as tf

        self._chief_address = chief_address
        self.identity, self.total, self.chief = identity, total, chief
        self._done = threading.Event()
        graph = tf.Graph()
        with graph.as_default(), tf.device(_CHIEF_DEVICE):
            arrived = [tf.queue.FIFOQueue(1, [tf.int32], shapes=[[]], shared_name=f"parallax_exit_arrived_{i}",
                                          name=f"parallax_exit_arrived_{i}") for i in range(total)]
            left = tf.queue.FIFOQueue(total, [tf.int32], shapes=[[]], shared_name="parallax_exit_left",
                                      name="parallax_exit_left")
            own = arrived[identity]
            self._arrive = tf.cond(own.size() > 0, tf.no_op, lambda: own.enqueue(identity))
            self._arrived = tf.add_n([tf.minimum(queue.size(), 1) for queue in arrived])
            self._leave, self._left = left.enqueue(identity), left.size()
        config = tf.compat.v1.ConfigProto(device_filters=["/job:worker/replica:0/task:0"],
                                          operation_timeout_in_ms=timeout_ms)
        self._run = ChiefSession(target, graph, config, lock_timeout=30).run

    def complete(self, within: float = 2.0) -> bool:
        """Whether every task has finished, asked of worker 0; ``False`` when it does not answer
        ``within`` seconds (a session to a dead task can wait for it without end)."""
        if self._done.is_set():
            return True
        if self._chief_address is not None and not _reachable(*self._chief_address):
            return False
        answer: list[int] = []

        def ask() -> None:
            try:
                answer.append(self._run(self._arrived))
            except Exception:  # noqa: BLE001, S110 - worker 0 unreachable: no answer
                pass

        thread = threading.Thread(target=ask, name="parallax-exit-ask", daemon=True)
        thread.start()
        thread.join(within)
        if answer and answer[0] >= self.total:
            self._done.set()
        return self._done.is_set()

    def wait(self, bound: float | None, failed: Callable[[], bool] | None = None) -> str | None:
        """Arrive, wait for every task, and leave; ``None`` when all went well, else what went wrong.

        A parameter server arrives as soon as it has started, maybe before worker 0's server listens. Its
        TensorFlow runtime is not asked to reach worker 0 until worker 0's port takes a connection: a gRPC
        channel that fails to connect backs off (1 s, 1.6 s, ...) and fails every call meanwhile at once,
        and the server's ``RecvTensor`` calls to worker 0 in worker 0's first steps take the same channel:
        they would fail, and worker 0's ``MonitoredSession`` would start a new session, initialising every
        variable on the servers again and so throwing away what the other workers had trained.
        """
        start = time.monotonic()
        deadline = None if bound is None else start + bound
        while True:
            if self._chief_address is not None and not _reachable(*self._chief_address):
                if deadline is not None and time.monotonic() > deadline:
                    return "worker 0 could not be reached to leave together: its port takes no connection"
                time.sleep(0.2)
                continue
            try:
                self._run(self._arrive)
                break
            except Exception as e:  # noqa: BLE001 - worker 0 not up yet, or gone
                if deadline is not None and time.monotonic() > deadline:
                    return f"worker 0 could not be reached to leave together: {e}"
                time.sleep(0.2)
        while not self.complete():
            if failed is not None and failed():
                return "a peer task failed"
            if deadline is not None and time.monotonic() > deadline:
                return (f"after {bound:.0f} s other tasks are still training: every worker must run the same "
                        "number of steps (an all-reduce needs them all)")
            time.sleep(0.1)
        if not self.chief:
            try:
                self._run(self._leave)
            except Exception:  # noqa: BLE001, S110 - worker 0 gone: leaving anyway
                pass
            return None
        end = time.monotonic() + 30.0  # worker 0 keeps its server until the others have left
        while time.monotonic() < end:
            try:
                if self._run(self._left) >= self.total - 1:
                    return None
            except Exception:  # noqa: BLE001 - cannot happen on its own server; leave
                return None
            time.sleep(0.05)
        return None


_THIS_PROCESS: JoinedProcess | None = None


def joined_process(invocation: Invocation) -> JoinedProcess | None:
    """This process's :class:`JoinedProcess` if a cluster manager started it (``invocation.tf_config`` names a
    cluster of more than one task), else ``None``.

    Raises:
        ResourceFileError: ``TF_CONFIG`` is malformed.
        LaunchError: this task does not train (an evaluator).
    """
    global _THIS_PROCESS
    if _THIS_PROCESS is None:
        managed = parse_tf_config(invocation.tf_config)
        if managed is None or len(managed.tasks) < 2:
            return None
        if not invocation.log_level:  # a task logs at INFO (its plan, its server), as a launched one
            logger.setLevel(logging.INFO)
        # SIGTERM (the pod deleted, the node drained): worker 0 saves at its next step and ends with 143; the
        # other tasks, left without it, end with 143 too (PeerWatch): a manager's restart resumes them all
        preemption.install(lambda: None)
        _THIS_PROCESS = process = JoinedProcess(managed)
        # an unhandled exception ends the task at once: its exit barrier would wait for peers that wait
        # for it, while its peers, seeing its server gone, end naming it
        end_on_exception(lambda error: _end_after(error, process._watch))
    return _THIS_PROCESS


def _end_after(error: BaseException, watch: PeerWatch | None) -> None:
    """End this task after ``error``: with 143 where a peer's end or restart left it unable to go on (a manager's
    restart resumes the job from its checkpoint), naming the peer that ended if ``watch`` sees one gone within
    its grace, else with 1 (the program's own error, which a restart would meet again)."""
    import tensorflow as tf

    if not isinstance(error, PeerLost | tf.errors.AbortedError | tf.errors.UnavailableError):
        _end("Parallax: this task ended with an exception")
        return
    if watch is not None:
        watch.settle(watch.grace + 1.0)
    if isinstance(error, PeerLost):
        _end_for_restart(str(error))
    else:
        said = str(error.message).splitlines()[0] if error.message else ""
        _end_for_restart(f"Parallax job failed: a call to a peer task failed ({type(error).__name__}: {said}); "
                         "ending this task")
