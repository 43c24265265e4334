"""``derive(config, sync, cluster) -> Settings``: every decision the user's config leaves open, made once.

The user's :class:`parallax.Config` stays theirs (mutable, as the seed API
shows). ``parallel_run`` reads it once, here, and everything after works from
the frozen :class:`Settings`: the run option in force, the communication
backends for each purpose, thread counts and timeouts, each default written in
one place. What the environment says to tune a run (``parallax-run``'s extra
mpirun options, ``PARALLAX_FINISH_TIMEOUT``, the communication's tuning) comes
in with the :class:`~parallax.invocation.Invocation` ``parallel_run`` read, and
is folded in here, nowhere else on the way into a run.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from parallax.comm.registry import backend_without_mpirun, choose_backend, wire_formats
from parallax.config import CheckPointConfig, Config, MPIConfig, ProfileConfig, PSConfig
from parallax.errors import LaunchError
from parallax.invocation import CommTuning, Invocation
from parallax.plan.model import CommSpec, Layout, PSSpec
from parallax.resources.cluster import Cluster, is_local_host, usable_cores

__all__ = ["Settings", "PipelineSettings", "Timeouts", "derive", "STOCK_PROTOCOLS"]

#: The server protocols stock TensorFlow 2 registers (verbs, GDR and MPI were contrib modules, gone since
#: TensorFlow 2; ``tf.distribute.Server`` with them raises "No server factory registered").
STOCK_PROTOCOLS = ("grpc",)


class PipelineSettings(NamedTuple):
    """The pipeline asked for: stages per replica, micro-batches per step, the ops the stages are cut
    after (``()``: cut where the variables' bytes balance), and the schedule (``gpipe`` or ``1f1b``)."""

    stages: int = 1
    micro_batches: int = 1
    cuts: tuple[str, ...] = ()
    schedule: str = "gpipe"


@dataclass(frozen=True)
class Timeouts:
    """Every bound on waiting, in one place.

    Attributes:
        operation_ms: TensorFlow's ``operation_timeout_in_ms`` in sessions with a
            server (a dead peer fails the step instead of blocking it forever).
        session_wait: seconds a non-chief worker waits for the chief to
            initialise the variables.
        ready_poll: seconds between a non-chief worker's readiness checks
            (TensorFlow's own worker session checks every 30 s).
        finish: seconds the ranks of an all-reduce job wait for each other at
            exit before aborting (``PARALLAX_FINISH_TIMEOUT``).
        stall: ``Config.stall_timeout``: seconds before a waiting process is
            reported (``None``: no stall check).
        shutdown: ``Config.stall_shutdown``: seconds a process may wait before the job is ended
            (``None``: never).
        server_start_attempts: tries to start the TensorFlow servers (a port
            picked free may be taken before it is bound).
    """

    operation_ms: int = 10 * 60 * 1000
    session_wait: float = 600.0
    ready_poll: float = 0.2
    finish: float = 60.0
    stall: float | None = 30.0
    server_start_attempts: int = 3
    shutdown: float | None = 900.0


@dataclass(frozen=True)
class Settings:
    """What ``parallel_run`` does with the user's config, decided once (see :func:`derive`).

    Attributes:
        run_option: the run option in force (``PS``, ``MPI``, ``HYBRID`` or
            ``AUTO``); the default, ``HYBRID``, becomes ``PS`` for ``sync=False``.
        sync: synchronous training.
        average_sparse: average sparse gradients instead of summing them.
        overrides: ``Config.plan_overrides``.
        allreduce_comm: the backends of a job of all-reduce workers (MPI):
            ``MPIConfig.backend``, where ``auto`` means TF collectives (NCCL)
            on GPUs and MPI on CPUs.
        server_comm: the backends beside parameter servers (HYBRID): MPI or
            Horovod, never TF collectives (they abort beside a shared PS).
        ps: the parameter servers' settings (``PSConfig``).
        gpus: GPUs of this machine, which a bare host line of the resource
            file stands for (every host of a job is taken to be alike).
        cpu_count: cores of this machine the job may use (this process's CPU affinity, which a container's or a
            batch system's cpuset narrows).
        bound_cores: the cores ``mpirun`` bound this rank to, its own (``None``: not bound; its host's
            ``cpu_count`` cores are shared by the processes there).
        local_hosts: the hosts of the resource file that are this machine.
        mpirun_options: ``MPIConfig.mpirun_options`` and those given to ``parallax-run``.
        timeouts: every bound on waiting.
        sess_config: a copy of the user's ``sess_config`` (or ``None``).
        hooks: the user's ``SessionRunHook`` objects.
        ckpt: a copy of ``Config.ckpt_config``.
        profile: a copy of ``Config.profile_config``.
        redirect_path: ``Config.redirect_path``.
        staggered_start: ``Config.staggered_start``.
        sync_batch_norm: ``Config.sync_batch_norm``.
        fuse_updates: ``Config.fuse_updates``.
        export_graph_path: ``Config.export_graph_path``.
        search_partitions: ``Config.search_partitions``.
        zero_stage: ``Config.zero_stage``.
        pipeline: a :class:`PipelineSettings`, from ``Config.pipeline_stages``, ``micro_batches``,
            ``pipeline_cuts`` and ``pipeline_schedule``.
        device_memory: ``Config.device_memory`` in bytes.
        arrival_spin: ``PARALLAX_ARRIVAL_SPIN_US``: ``None`` (unset: decided per job), ``"off"``, or
            seconds awake before sleeping (:mod:`parallax.comm.arrival`).
        comm_tuning: the environment's tuning of the communication (the compiled op, huge pages, ...).
        cache_root: where the compiled all-reduce op is kept (``PARALLAX_CACHE_DIR``).
        notes: remarks on what was decided, printed with the plan.
        cross_worker_settings: the settings the user changed from their defaults that act only
            between workers (``sync=False``, ``PSConfig`` and ``MPIConfig`` fields, ``zero_stage``,
            ``plan_overrides``' sync entries), each as ``name=value``: a job of one worker (the
            ``local`` layout) does not use them, and says so (:func:`parallax.job.plan.make_job_plan`).
    """

    run_option: str
    sync: bool
    average_sparse: bool
    overrides: Mapping[str, Any]
    allreduce_comm: CommSpec
    server_comm: CommSpec
    ps: PSSpec
    gpus: int
    cpu_count: int
    bound_cores: int | None = None
    local_hosts: frozenset[str] = frozenset()
    mpirun_options: str = ""
    timeouts: Timeouts = field(default_factory=Timeouts)
    sess_config: Any = None
    hooks: tuple = ()
    ckpt: CheckPointConfig = field(default_factory=CheckPointConfig)
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    redirect_path: str | None = None
    staggered_start: bool = True
    sync_batch_norm: bool = False
    fuse_updates: bool = True
    export_graph_path: str | None = None
    search_partitions: bool = False
    zero_stage: int = 0
    pipeline: PipelineSettings = PipelineSettings()
    device_memory: int | None = None
    arrival_spin: float | str | None = None
    comm_tuning: CommTuning = field(default_factory=CommTuning)
    cache_root: str = field(default_factory=lambda: Invocation().cache_root())
    notes: tuple[str, ...] = ()
    cross_worker_settings: tuple[str, ...] = ()

    def threads_per_process(self, processes_on_host: int) -> int:
        """TensorFlow threads per pool for each of ``processes_on_host`` training processes
        sharing this host's cores (0: TensorFlow's default, for a process alone on its host); a process bound
        to cores of its own has those.

        >>> from parallax.plan.model import CommSpec, Layout, PSSpec
        >>> s = Settings("MPI", True, False, {}, CommSpec(), CommSpec(), PSSpec(), gpus=0, cpu_count=8)
        >>> s.threads_per_process(1), s.threads_per_process(2), s.threads_per_process(16)
        (0, 4, 1)
        >>> dataclasses.replace(s, cpu_count=4, bound_cores=4).threads_per_process(2)  # 8 cores, bound
        4
        """
        if processes_on_host <= 1:
            return 0
        return self.bound_cores or max(1, self.cpu_count // processes_on_host)

    def comm_for(self, layout: Layout | str) -> CommSpec:
        """The backends of a job laid out as ``layout``: all-reduce alone (``MPI``) or beside servers.

        Raises:
            ValueError: ``layout`` names no :class:`~parallax.plan.model.Layout`.
        """
        return self.allreduce_comm if Layout(layout) is Layout.MPI else self.server_comm


def _managed_backend(run_option: str, asked: str, cluster: Cluster, manager: str, gpus: int) -> str:
    """The all-reduce backend of a job whose tasks a cluster manager started (TF collectives: the tasks
    share no MPI), after checking that ``run_option`` can run in its cluster.

    Raises:
        LaunchError: naming the run option and what to use instead.
    """
    servers = len(cluster.servers)
    if run_option in ("HYBRID", "AUTO"):
        raise LaunchError(
            f"run_option={run_option!r} cannot run in tasks started from {manager}: HYBRID all-reduces over MPI "
            "beside the parameter servers (TF collectives abort there), and tasks a cluster manager starts share no "
            "MPI. Use run_option='PS' (with ps tasks) or 'MPI' (workers only, all-reduced with TF collectives), or "
            "start the job with mpirun from a Kubeflow MPIJob's launcher (parallax manifest --kind mpijob)")
    if run_option == "PS" and not servers:
        raise LaunchError(f"run_option='PS' needs parameter servers, but {manager} has no ps task: add ps tasks "
                          "(PS replicas of a TFJob, n_ps in Polyaxon) or use run_option='MPI'")
    if run_option == "MPI":
        if servers:
            raise LaunchError(f"run_option='MPI' all-reduces among the workers, but {manager} has {servers} ps "
                              "task(s) that would idle: leave them out of the job or use run_option='PS'")
        if backend_without_mpirun(asked) is None:
            raise LaunchError(f"MPIConfig.backend={asked!r} needs processes started by mpirun; the tasks "
                              f"{manager} describes all-reduce with TF collectives: use backend 'auto' or "
                              "'collective' (or start the job as a Kubeflow MPIJob)")
        if gpus > 1:
            raise LaunchError(f"run_option='MPI' trains one replica per task, and this task sees {gpus} GPUs: "
                              "give each task one GPU (one task per GPU) or use run_option='PS', whose workers "
                              "train a replica on each GPU of their task")
    return backend_without_mpirun(asked) or backend_without_mpirun("auto")


def derive(config: Config, sync: bool, cluster: Cluster, *, gpus: int | None = None,
           cpu_count: int | None = None, invocation: Invocation | None = None,
           manager: str | None = None) -> Settings:
    """Read the user's config once and decide everything it leaves open.

    Args:
        config: the user's config (validated here; not changed).
        sync: ``parallel_run``'s ``sync``.
        cluster: the parsed resource file.
        gpus: GPUs of this machine (default: what TensorFlow sees).
        cpu_count: cores of this machine the job may use (default: this process's CPU affinity).
        invocation: what this process's environment asked (its extra mpirun options, finish timeout and
            communication tuning; default: nothing).
        manager: what started this process when a cluster manager did (``"TF_CONFIG"``): the run
            option then defaults to ``PS`` with ps tasks and ``MPI`` without, and the workers
            all-reduce with TF collectives (there is no MPI among such tasks).

    Returns:
        The frozen settings.

    Raises:
        TypeError, ValueError: the config breaks a rule across fields, or asks for a server
            protocol stock TensorFlow does not have (``PSConfig.protocol``).
        LaunchError: the run option cannot run in the cluster ``manager`` started.
    """
    config.validate(sync=sync)
    ps_config = config.communication_config.ps_config
    if ps_config.protocol not in STOCK_PROTOCOLS:
        raise ValueError(f"PSConfig.protocol={ps_config.protocol!r}: TensorFlow's servers start only with "
                         f"{', '.join(map(repr, STOCK_PROTOCOLS))} (the verbs, GDR and MPI transports were contrib "
                         "modules, removed in TensorFlow 2); use protocol='grpc'")
    invocation = invocation or Invocation()
    if gpus is None:
        import tensorflow as tf

        gpus = len(tf.config.list_physical_devices("GPU"))
    mpi = config.communication_config.mpi_config
    on_gpus = any(d.kind == "gpu" for w in cluster.workers for d in (w.devices or ())) or \
        (gpus > 0 and any(w.devices is None for w in cluster.workers))
    run_option = config.run_option or ("HYBRID" if sync else "PS")  # the seed's default, HYBRID; PS for async
    dense, _ = choose_backend(mpi.backend, on_gpus)
    if manager is not None:
        run_option = config.run_option or ("PS" if cluster.servers or not sync else "MPI")
        dense = _managed_backend(run_option, mpi.backend, cluster, manager, gpus)
    beside_servers, why = choose_backend(mpi.backend, on_gpus, beside_servers=True)
    common = dict(fusion_bytes=mpi.fusion_bytes, use_allgatherv=mpi.use_allgatherv, gpu=on_gpus, overlap=mpi.overlap,
                  compression=config.communication_config.compression)
    notes = (why,) if why and run_option in ("HYBRID", "AUTO") else ()
    extra_options = invocation.mpirun_options or ""
    return Settings(
        run_option=run_option, sync=sync, average_sparse=bool(config.average_sparse),
        overrides=dict(config.plan_overrides),
        allreduce_comm=CommSpec(backend=dense, wire_formats=wire_formats(dense, mpi.use_allgatherv), **common),
        server_comm=CommSpec(backend=beside_servers, wire_formats=wire_formats(beside_servers, mpi.use_allgatherv),
                             **common),
        ps=PSSpec(local_aggregation=ps_config.local_aggregation, protocol=ps_config.protocol,
                  replicate_variables=ps_config.replicate_variables,
                  boundary_among_servers=ps_config.boundary_among_servers,
                  boundary_between_workers_and_servers=ps_config.boundary_between_workers_and_servers,
                  num_servers=ps_config.num_servers or 0,
                  # with hooks, their writes are done before the others go on
                  release_in_step=not config.hooks),
        gpus=gpus, cpu_count=cpu_count or usable_cores(),
        bound_cores=invocation.launch.bound_cores if invocation.launch is not None else None,
        local_hosts=frozenset(h for h in cluster.hosts if is_local_host(h)),
        mpirun_options=" ".join(p for p in (mpi.mpirun_options, extra_options) if p.strip()),
        timeouts=Timeouts(stall=config.stall_timeout, shutdown=config.stall_shutdown,
                          finish=Timeouts.finish if invocation.finish_timeout is None else invocation.finish_timeout),
        sess_config=copy.deepcopy(config.sess_config), hooks=tuple(config.hooks),
        ckpt=copy.deepcopy(config.ckpt_config), profile=copy.deepcopy(config.profile_config),
        redirect_path=config.redirect_path, staggered_start=config.staggered_start,
        sync_batch_norm=config.sync_batch_norm, fuse_updates=config.fuse_updates,
        export_graph_path=config.export_graph_path,
        search_partitions=config.search_partitions, notes=notes, zero_stage=config.zero_stage,
        pipeline=PipelineSettings(config.stages, config.micro_batches, tuple(config.pipeline_cuts),
                                  config.pipeline_schedule),
        device_memory=config.device_memory, arrival_spin=invocation.comm.arrival_spin,
        comm_tuning=invocation.comm, cache_root=invocation.cache_root(),
        cross_worker_settings=_cross_worker_settings(config, sync))


def _cross_worker_settings(config: Config, sync: bool) -> tuple[str, ...]:
    """What the user set, away from its default, that acts only between workers (see
    :attr:`Settings.cross_worker_settings`), as ``name=value``."""
    found = [] if sync else ["sync=False"]
    for owner, given, default in (("PSConfig", config.communication_config.ps_config, PSConfig()),
                                  ("MPIConfig", config.communication_config.mpi_config, MPIConfig())):
        found += [f"{owner}.{f.name}={getattr(given, f.name)!r}" for f in dataclasses.fields(given)
                  if getattr(given, f.name) != getattr(default, f.name)]
    if config.zero_stage:
        found.append(f"zero_stage={config.zero_stage}")
    found += [f"plan_overrides[{name!r}]['sync']={entry['sync']!r}"
              for name, entry in sorted(config.plan_overrides.items()) if "sync" in entry]
    return tuple(found)
