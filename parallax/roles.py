"""Roles: what each kind of process does before the shared start-up tail.

A role takes the job plan and this process's part in it and returns a
:class:`ProcessSetup`: its server (if it runs one), its communicators, whether
it initialises the variables or waits for the chief, and so on. One tail,
:func:`parallax.startup.start_worker`, turns any setup into a session.

===================  ==============  =============================================
role                 layouts         what it sets up
===================  ==============  =============================================
``local_replicas``   local           nothing to share: in-graph replicas only
``allreduce_worker`` MPI             a server when the backend needs one; every
                                     rank initialises, then takes rank 0's values
``server_job_worker`` PS, HYBRID     the workers' communicators, a server; the
                                     chief initialises, the others wait for it
``parameter_server`` PS, HYBRID      a server, then serves until the job ends
===================  ==============  =============================================

A launched program may call ``parallel_run`` again (a second job, or a
partition-search trial): the process keeps its server and communicators, the
workers check they made the same plan, and before the new session the chief
clears what the previous job left on the servers.

Processes started by a cluster manager (a later step) will be one more role.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import tensorflow as tf

from parallax.comm.base import ProcessComms
from parallax.errors import LaunchError
from parallax.job import JobPlan, ProcessSpec
from parallax.launch.bootstrap import tee_output
from parallax.launch.rank import LaunchedProcess, NoHeartbeat
from parallax.logs import log as logger
from parallax.settings import Settings
from parallax.startup import GROUP_LEADER, start_server

__all__ = ["ProcessSetup", "role_setup", "local_replicas", "check_local_devices"]


@dataclass(frozen=True)
class ProcessSetup:
    """What one process brings to the start-up tail (:func:`parallax.startup.start_worker`).

    Attributes:
        process: its part of the job plan.
        num_workers: the job's worker count (what ``parallel_run`` returns).
        server: its TensorFlow server, or ``None``.
        is_chief: it initialises the variables (and restores and saves
            checkpoints); the others wait for it.
        device_filters: the devices its session may see.
        broadcast: after initialisation, take worker 0's values of the
            variables the workers hold themselves (over ``comms.workers``).
        comms: its communicators, for the all-reduce backends and the broadcast.
        heartbeat: its heartbeat to the stall monitor.
        serve_only: a parameter server: no session; the process serves until
            every worker has finished.
        on_close: what to undo when its session closes.
    """

    process: ProcessSpec
    num_workers: int
    server: Any = None
    is_chief: bool = True
    device_filters: tuple[str, ...] = ()
    broadcast: bool = False
    comms: ProcessComms = field(default_factory=ProcessComms)
    heartbeat: Any = field(default_factory=NoHeartbeat)
    serve_only: bool = False
    on_close: tuple[Callable[[], None], ...] = ()

    @property
    def saves(self) -> bool:
        """Whether this process restores and saves checkpoints."""
        return self.is_chief


def check_local_devices(job: JobPlan, settings: Settings, source: str) -> None:
    """Refuse GPUs the job plan gives a process on this machine that this machine does not have
    (checked where the job starts, and again in each launched process, on its own host).

    Raises:
        LaunchError: naming the resource file's line.
    """
    gpus = len(tf.config.list_physical_devices("GPU"))  # this machine's, whatever the launcher assumed
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


def role_setup(job: JobPlan, settings: Settings, launched: LaunchedProcess) -> ProcessSetup:
    """The setup of a launched process, by its role in ``job``."""
    process = job.process(launched.rank)
    if job.layout == "MPI":
        return _allreduce_worker(job, settings, launched, process)
    # PS and HYBRID: every rank splits the workers' communicators first (an MPI collective)
    comms = launched.split_comms()
    server = launched.server(lambda: _start_job_server(job, settings, launched, process), chief=process.index == 0)
    launched.exit_together("barrier", settings.timeouts.finish)  # servers wait for the workers
    if process.role == "ps":
        launched.heartbeat("serve")
        logger.info("Parallax: parameter server %d serving on %s", process.index, process.host)
        return ProcessSetup(process, len(job.workers), server=server, serve_only=True)
    chief = process.index == 0
    beat = launched.heartbeat("start", "initialising the variables" if chief else
                              "waiting for the chief (worker 0) to initialise the variables")
    hybrid = job.layout == "HYBRID"
    return ProcessSetup(process, len(job.workers), server=server, is_chief=chief,
                        device_filters=("/job:ps", f"/job:worker/task:{process.index}"), broadcast=hybrid,
                        comms=ProcessComms(workers=comms[0], groups={"host": comms[1]} if hybrid else {}),
                        heartbeat=beat)


def _allreduce_worker(job: JobPlan, settings: Settings, launched: LaunchedProcess,
                      process: ProcessSpec) -> ProcessSetup:
    """A rank of an MPI job: every rank initialises its variables, then takes rank 0's values."""
    launched.exit_together("finish", settings.timeouts.finish)
    beat = launched.heartbeat("start", "initialising the variables and taking rank 0's values")
    server = None
    if job.servers:  # the all-reduce backend needs TensorFlow servers (collectives)
        server = launched.server(lambda: _start_job_server(job, settings, launched, process, GROUP_LEADER),
                                 chief=process.rank == 0)
    return ProcessSetup(process, len(job.workers), server=server, broadcast=True,
                        comms=ProcessComms(group_leader=GROUP_LEADER if server is not None else None),
                        heartbeat=beat)


def _start_job_server(job: JobPlan, settings: Settings, launched: LaunchedProcess, process: ProcessSpec,
                      group_leader: str | None = None) -> tf.distribute.Server:
    jobs = [(p.role, p.index) for p in job.processes]
    return start_server(launched.rank, jobs, settings, process, group_leader=group_leader)
