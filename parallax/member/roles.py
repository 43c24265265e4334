"""Roles: what each kind of process does before the shared start-up tail.

A role takes the job plan and this process's part in it and returns a
:class:`ProcessSetup`: its server (if it runs one), its communicators, whether
it initialises the variables or waits for the chief, and so on. One tail,
:func:`parallax.member.startup.start_worker`, turns any setup into a session.

===================  ==============  =============================================
role                 layouts         what it sets up
===================  ==============  =============================================
``local_replicas``   local           nothing to share: in-graph replicas only
``allreduce_worker`` MPI             a server when the backend needs one; every
                                     rank initialises, then takes rank 0's values
``server_job_worker`` PS, HYBRID     the workers' communicators, a server; the
                                     chief initialises, the others wait for it
``parameter_server`` PS, HYBRID      a server, then serves until the job ends
``_staged``          MPI, a pipeline  every rank a server; a stage server serves
                     spread over      its worker's stage until the job ends; a
                     processes        worker all-reduces among the workers alone
===================  ==============  =============================================

A launched program may call ``parallel_run`` again (a second job, or a
partition-search trial): the process keeps its server and communicators, the
workers check they made the same plan, and before the new session the chief
clears what the previous job left on the servers.

A process is a member of its job either because mpirun started it
(:class:`parallax.member.rank.LaunchedProcess`: MPI among the processes) or
because a cluster manager did (:class:`parallax.member.joined.JoinedProcess`:
the addresses of ``TF_CONFIG``, gRPC only). Both offer what the roles use
(:class:`JobMember`), so the roles are written once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from parallax.comm.base import ProcessComms
from parallax.comm.broadcast import Broadcast
from parallax.comm.group import Alone, WorkerGroup
from parallax.errors import LaunchError
from parallax.job.plan import JobPlan, ProcessSpec
from parallax.job.settings import Settings
from parallax.logs import log as logger
from parallax.member.bootstrap import tee_output
from parallax.member.protocol import JobMember, NoHeartbeat
from parallax.member.servers import GROUP_LEADER
from parallax.plan.model import Layout
from parallax.resources.cluster import Role

__all__ = ["ProcessSetup", "role_setup", "local_replicas", "check_local_devices"]


@dataclass(frozen=True)
class ProcessSetup:
    """What one process brings to the start-up tail (:func:`parallax.member.startup.start_worker`).

    Attributes:
        process: its part of the job plan.
        num_workers: the job's worker count (what ``parallel_run`` returns).
        server: its TensorFlow server, or ``None``.
        is_chief: it initialises the variables (and restores and saves
            checkpoints); the others wait for it.
        device_filters: the devices its session may see.
        broadcast: after initialisation, take worker 0's values of the
            variables the workers hold themselves this way (``None``: no broadcast).
        comms: its communicators, for the all-reduce backends and the broadcast.
        heartbeat: its heartbeat to the stall monitor.
        serve_only: a parameter server: no session; the process serves until
            every worker has finished.
        on_close: what to undo when its session closes.
        group: the job's workers as a group the program's loop can talk to between steps
            (:mod:`parallax.comm.group`; ``None``: no means to, in a process a cluster manager started).
    """

    process: ProcessSpec
    num_workers: int
    server: Any = None
    is_chief: bool = True
    device_filters: tuple[str, ...] = ()
    broadcast: Broadcast | None = None
    comms: ProcessComms = field(default_factory=ProcessComms)
    heartbeat: Any = field(default_factory=NoHeartbeat)
    serve_only: bool = False
    on_close: tuple[Callable[[], None], ...] = ()
    group: WorkerGroup | None = field(default_factory=Alone)

    @property
    def saves(self) -> bool:
        """Whether this process restores and saves checkpoints: worker 0 alone (every rank of an MPI job
        initialises its own variables, then takes worker 0's, restored ones included)."""
        return self.is_chief and self.process.index == 0


def check_local_devices(job: JobPlan, settings: Settings, source: str, process: ProcessSpec | None = None) -> None:
    """Refuse GPUs the job plan gives a process on this machine that TensorFlow does not see here.

    Checked where the job starts, for every process on this machine (by the host's GPU ids), and
    again in each process of the job (``process``), for its own GPUs as it sees them: a launched
    process sees only its own (its ``CUDA_VISIBLE_DEVICES``), numbered from 0.

    Raises:
        LaunchError: naming the resource file's line.
    """
    gpus = len(tf.config.list_physical_devices("GPU"))  # what this process sees, whatever the launcher assumed
    if process is not None:
        seen = [d.index for d in process.devices if d.kind == "gpu"]
        if seen and max(seen) >= gpus:
            raise LaunchError(
                f"{source}, line {process.line}: gives {process.role} {process.index} GPU(s) {process.visible_gpus} "
                f"of {process.host}, but its process sees {gpus} of them there. A bare host line stands for the "
                "GPUs of the machine that starts the job (every host is taken to be alike): where hosts differ, "
                f"list each host's GPU ids (e.g. \"{process.host}: 0,1\"), or cpu:<n> ids for replicas on the CPU")
        return
    for p in job.processes:
        if p.host not in settings.local_hosts:
            continue
        # the host's GPU ids: a launched process's visible list, or the local process's own devices
        ids = [int(i) for i in p.visible_gpus.split(",")] if p.visible_gpus else \
            [d.index for d in p.devices if d.kind == "gpu"]
        for gpu in ids:
            if gpu >= gpus:
                raise LaunchError(
                    f"{source}, line {p.line}: lists GPU {gpu} of {p.host}, but TensorFlow sees {gpus} "
                    f"GPU(s) on this machine. For replicas on the CPU write cpu:<n> ids, e.g. "
                    f"\"{p.host}: cpu:0,cpu:1\"")


def local_replicas(job: JobPlan, settings: Settings) -> ProcessSetup:
    """The one process of a ``local`` job: its devices are in-graph replicas."""
    on_close = (tee_output(settings.redirect_path),) if settings.redirect_path else ()
    return ProcessSetup(job.process(0), num_workers=1, on_close=on_close)


def role_setup(job: JobPlan, settings: Settings, member: JobMember) -> ProcessSetup:
    """The setup of a process of a multi-process job, by its role in ``job``."""
    process = member.process_in(job)
    if job.layout is Layout.MPI:
        return _allreduce_worker(job, settings, member, process)
    # PS and HYBRID: every rank splits the workers' communicators first (an MPI collective)
    comms = member.split_comms()
    if process.role == Role.PS and settings.fuse_updates:
        from parallax.comm.native import update_ops

        update_ops(settings.cache_root)  # the workers of its host fuse its updates (parallax.rewrite.fused_updates)
    server = member.server(lambda: member.start_server(job, settings, process), chief=process.index == 0)
    member.exit_together("barrier", settings.timeouts.finish)  # servers wait for the workers
    if process.role == Role.PS:
        member.heartbeat("serve")
        logger.info("Parallax: parameter server %d serving on %s", process.index, process.host)
        return ProcessSetup(process, len(job.workers), server=server, serve_only=True)
    chief = process.index == 0
    beat = member.heartbeat("start", "initialising the variables" if chief else
                            "waiting for the chief (worker 0) to initialise the variables")
    hybrid = job.layout is Layout.HYBRID
    return ProcessSetup(process, len(job.workers), server=server, is_chief=chief, group=member.workers_group(),
                        device_filters=("/job:ps", f"/job:worker/task:{process.index}"),
                        broadcast=member.broadcast(job, process, settings) if hybrid else None,
                        comms=process_comms(job, settings, workers=comms[0],
                                            groups={"host": comms[1]} if hybrid else {}),
                        heartbeat=beat)


def process_comms(job: JobPlan, settings: Settings, **comms: Any) -> ProcessComms:
    """A worker's :class:`ProcessComms` (its communicators ``comms``), tuned as ``settings`` say: how its MPI
    calls wait (:func:`arrival_spin`), and whether and where from they use the compiled op."""
    tuning = settings.comm_tuning
    return ProcessComms(**comms, arrival_spin=arrival_spin(job, settings), native_ops=tuning.native_ops,
                        huge_pages=tuning.huge_pages, cache_root=settings.cache_root, num_workers=len(job.workers))


def arrival_spin(job: JobPlan, settings: Settings) -> float | None:
    """How the workers' MPI calls wait for late members (:attr:`ProcessComms.arrival_spin`).

    ``PARALLAX_ARRIVAL_SPIN_US`` decides when it is set. Otherwise the calls of HYBRID workers on
    several hosts wait asleep after :data:`~parallax.comm.arrival.DEFAULT_SPIN_SECONDS`: there a
    worker's all-reduce waits for workers who wait for parameter servers over gRPC, and polling
    takes the cores those need (2 cores, 4 workers on two virtual hosts: 11-14 steps/s polling,
    24-26 asleep; docs/benchmarks.md). Measured on the same 2 cores, waiting asleep cost HYBRID
    on one host about 20 % (its chain is short) and MPI at 3 ranks 5-15 % (the ranks run in
    step), so those poll. The members of a communicator agree on the result when they bind it
    (:func:`parallax.comm.mpi.bind_py_functions`).
    """
    from parallax.comm.arrival import DEFAULT_SPIN_SECONDS

    if settings.arrival_spin is not None:
        return None if settings.arrival_spin == "off" else float(settings.arrival_spin)
    if job.layout is Layout.HYBRID and len({w.host for w in job.workers}) > 1:
        return DEFAULT_SPIN_SECONDS
    return None


def _allreduce_worker(job: JobPlan, settings: Settings, member: JobMember, process: ProcessSpec) -> ProcessSetup:
    """A rank of an MPI job: every rank initialises its variables, then takes rank 0's values."""
    if any(p.role == Role.STAGE for p in job.processes):
        return _staged(job, settings, member, process)
    member.exit_together("finish", settings.timeouts.finish)
    beat = member.heartbeat("start", "initialising the variables and taking rank 0's values")
    server = None
    if job.servers:  # the all-reduce backend needs TensorFlow servers (collectives)
        server = member.server(lambda: member.start_server(job, settings, process, GROUP_LEADER),
                               chief=process.rank == 0)
    return ProcessSetup(process, len(job.workers), server=server, broadcast=member.broadcast(job, process, settings),
                        group=member.workers_group(),
                        comms=process_comms(job, settings, group_leader=GROUP_LEADER if server is not None else None),
                        heartbeat=beat)


def _staged(job: JobPlan, settings: Settings, member: JobMember, process: ProcessSpec) -> ProcessSetup:
    """An MPI job whose replicas' stages are processes of their own: every rank runs a server; a stage
    server serves its worker's stage until the job ends; a worker's session runs its whole replica
    (its stages' ops on their servers, over gRPC), all-reduces among the workers alone, and initialises
    its replica's variables, then takes worker 0's values."""
    from parallax.job.plan import stage_tasks

    comms = member.split_comms()  # every rank: the workers' communicator leaves the stage servers out
    server = member.server(lambda: member.start_server(job, settings, process), chief=process.rank == 0)
    member.exit_together("barrier", settings.timeouts.finish)  # a stage server holds its stage until the end
    if process.role == Role.STAGE:
        member.heartbeat("serve")
        logger.info("Parallax: stage server %d serving on %s", process.index, process.host)
        return ProcessSetup(process, len(job.workers), server=server, serve_only=True)
    mine = [f"/job:stage/task:{s.index}" for s in stage_tasks(job.processes, job.ranks).get(process.index, ())]
    beat = member.heartbeat("start", "initialising the variables and taking worker 0's values")
    return ProcessSetup(process, len(job.workers), server=server, group=member.workers_group(),
                        device_filters=(f"/job:worker/task:{process.index}", *mine),
                        broadcast=member.broadcast(job, process, settings),
                        comms=process_comms(job, settings, workers=comms[0]),
                        heartbeat=beat)
