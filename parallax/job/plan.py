"""The job plan: every process of a job, its role and devices, and the variable plan, made once.

``make_job_plan(cluster, settings, analysis)`` is pure: the same inputs give
the same :class:`JobPlan` in the launching process, in ``parallax plan``, in
``parallax-run --dry_run`` and in every launched process. The launcher starts
the processes the job plan lists and hands each its identity together with the
plan's :meth:`JobPlan.digest`; each process makes the job plan from its own
copy of the graph, checks the digest, and takes its part
(:meth:`JobPlan.process`). What ``parallax plan`` prints is therefore what runs.

Layouts:

* ``local``: one worker on this machine, its devices as in-graph replicas, no
  process launched (a resource file with one local worker line);
* ``MPI``: one worker process per device, gradients all-reduced;
* ``PS``: one worker process per worker line (its devices in-graph replicas)
  and parameter servers;
* ``HYBRID``: one worker process per device, as in MPI, plus parameter
  servers for the variables the plan puts there.

A bare host line stands for every GPU of its host (``settings.gpus``, the
launching machine's count: every host is taken to be alike) in every layout,
so MPI and HYBRID run a process per GPU there. A launched process sees only its
own GPUs (``visible_gpus``: the launcher sets its ``CUDA_VISIBLE_DEVICES``),
renumbered from 0, and its sessions name them so (``visible_device_list``).

``HYBRID`` and ``AUTO`` decide per variable first: without a variable for the
servers they run as ``MPI``, with nothing to all-reduce as ``PS``.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from dataclasses import dataclass, replace

from parallax.analysis import GraphAnalysis
from parallax.analysis.batch_statistics import refuse_unsynchronised, statistics_note
from parallax.analysis.update_order import refuse_gradients_after_updates
from parallax.comm.registry import backend_class
from parallax.config import Config
from parallax.errors import PlanError
from parallax.invocation import Invocation
from parallax.job.settings import Settings, derive
from parallax.launch.layout import RankSpec, hybrid_ranks, ps_ranks, ranks_per_device
from parallax.plan import Plan, PlanOptions, build_plan
from parallax.plan.model import CrossWorker, Layout, Sync
from parallax.plan.policies import choose_sync
from parallax.plan.stages import fit_stages
from parallax.resources.cluster import Cluster, Device, Role

__all__ = ["JobPlan", "ProcessSpec", "plan_job", "make_job_plan", "LAYOUTS"]

LAYOUTS = tuple(Layout)


@dataclass(frozen=True)
class ProcessSpec:
    """One process of a job and its part in it.

    Attributes:
        rank: its MPI rank (0 for the one process of a ``local`` job).
        role: ``Role.WORKER``, ``Role.PS`` (a parameter server) or ``Role.STAGE`` (a server holding a
            pipeline stage of a worker's replica).
        index: its worker id among the workers, or its index among the servers.
        host: where it runs.
        line: the resource-file line it comes from (0 when Parallax added it).
        port: the port the resource file gives its server, else ``None``.
        devices: its replicas' devices as the process sees them: GPUs numbered
            from 0 within ``visible_gpus``, CPUs as listed (``()`` for a server).
        visible_gpus: the host's GPU ids the process may use (``"1"``,
            ``"0,1"``): its ``CUDA_VISIBLE_DEVICES`` when launched; ``None``
            for a process without GPUs and for the one process of a ``local``
            job (its devices are the host's ids).
        sharing_host: how many training processes share its host's cores.
    """

    rank: int
    role: Role
    index: int
    host: str
    line: int
    port: int | None
    devices: tuple[Device, ...]
    visible_gpus: str | None
    sharing_host: int

    @property
    def visible_device_list(self) -> str | None:
        """Its sessions' ``gpu_options.visible_device_list``: its GPUs as it sees them (``"0,1"``
        for ``visible_gpus`` ``"2,3"``), or ``None`` (no GPU, or a ``local`` job's process)."""
        if self.visible_gpus is None:
            return None
        return ",".join(str(d.index) for d in self.devices if d.kind == "gpu")

    @property
    def cpu_devices(self) -> int:
        """The virtual CPU devices its replicas need (0: TensorFlow's one CPU device)."""
        return max([d.index + 1 for d in self.devices if d.kind == "cpu"], default=0)


@dataclass(frozen=True)
class JobPlan:
    """Every process of a job and the variable plan they share.

    Attributes:
        layout: a :class:`~parallax.plan.model.Layout`.
        processes: every process, in rank order.
        ranks: what the launcher needs of each process (host, devices as in
            the resource file, role, port), in rank order; ``()`` for ``local``.
        plan: the variable plan every worker rewrites its graph with.
        servers: whether the workers run TensorFlow servers (parameter
            servers, or an all-reduce backend that needs them).
        notes: what the launching process tells the user about the layout (at WARNING: it is not what was asked,
            or training will differ from one device).
        choices: what the job chose where the user left the choice to it (run_option AUTO's layout), said at INFO.
    """

    layout: Layout
    processes: tuple[ProcessSpec, ...]
    ranks: tuple[RankSpec, ...]
    plan: Plan
    servers: bool
    notes: tuple[str, ...] = ()
    choices: tuple[str, ...] = ()

    @property
    def launched(self) -> bool:
        """Whether the job's processes are started through mpirun (every layout but ``local``)."""
        return self.layout.launched

    @property
    def workers(self) -> tuple[ProcessSpec, ...]:
        return tuple(p for p in self.processes if p.role == Role.WORKER)

    def process(self, rank: int) -> ProcessSpec:
        """The part of the process with MPI rank ``rank``."""
        return self.processes[rank]

    def digest(self) -> str:
        """A hash of what every process must agree on: the layout, the ranks and the plan."""
        data = {"layout": self.layout, "ranks": [_rank_dict(r) for r in self.ranks], "plan": self.plan.to_dict()}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()

    def describe(self) -> str:
        """The processes as a table, then the variable plan (:meth:`Plan.describe`)."""
        lines = [f"job: layout {self.layout}, {len(self.processes)} process(es)"
                 + ("" if self.launched else ", this one (nothing is launched)")]
        for p in self.processes:
            devices = ", ".join(str(d) for d in p.devices) or "-"
            gpus = f" (the host's GPU{'s' if ',' in p.visible_gpus else ''} {p.visible_gpus})" \
                if p.visible_gpus else ""
            port = f", port {p.port}" if p.port else ""
            lines.append(f"  rank {p.rank}: {p.role} {p.index} on {p.host}: devices {devices}{gpus}{port}")
        lines.extend(f"  note: {n}" for n in self.choices + self.notes)
        return "\n".join(lines) + "\n" + self.plan.describe()


def _rank_dict(r: RankSpec) -> dict:
    return {"host": r.host, "line": r.line, "role": r.role, "port": r.port, "group": r.group, "stage": r.stage,
            "devices": None if r.devices is None else [str(d) for d in r.devices]}


def plan_job(config: Config, sync: bool, cluster: Cluster, analysis: GraphAnalysis, *, gpus: int | None = None,
             manager: str | None = None, invocation: Invocation | None = None) -> tuple[Settings, JobPlan]:
    """The settings ``config`` makes for ``cluster`` (:func:`parallax.job.settings.derive`; ``gpus`` a bare host
    line stands for when the launcher said, ``manager`` what started the processes, ``invocation`` what the
    environment asked) and the job plan under
    them: how every planner plans, the process the user started, each launched rank or managed task,
    ``parallax plan``, a manifest's processes and ``parallax tune``'s candidates.

    Raises:
        ValueError, LaunchError: the config does not fit the cluster.
        PlanError: the variable plan cannot be made.
    """
    settings = derive(config, sync, cluster, gpus=gpus, manager=manager, invocation=invocation)
    return settings, make_job_plan(cluster, settings, analysis)


def make_job_plan(cluster: Cluster, settings: Settings, analysis: GraphAnalysis) -> JobPlan:
    """The job plan of ``cluster`` under ``settings`` for the analysed graph (pure).

    Raises:
        PlanError: the variable plan cannot be made (see :func:`parallax.plan.build_plan`).
    """
    refuse_gradients_after_updates(analysis.after_updates, settings.sync)
    cluster = cluster.with_bare_hosts(settings.gpus)  # every GPU of the host, in every layout
    settings, by_memory = _fit_memory(cluster, settings, analysis)
    layout, ranks, notes = _layout(cluster, settings, analysis)
    choices, notes = (notes, ()) if settings.run_option == "AUTO" else ((), notes)  # AUTO was asked to choose
    if layout is Layout.LOCAL:
        worker = cluster.workers[0]
        devices = worker.devices or _bare_host_devices(settings.gpus)
        processes = (ProcessSpec(0, Role.WORKER, 0, worker.host, worker.line, worker.port, devices, None, 1),)
        servers = False
        notes += _unused_alone(settings)
    else:
        if layout is Layout.PS and (settings.pipeline.stages, settings.pipeline.micro_batches) != (1, 1):
            raise PlanError(f"pipeline_stages={settings.pipeline.stages}, micro_batches="
                            f"{settings.pipeline.micro_batches}: a "
                            "pipeline keeps each stage's variables on its own device, so it does not run with "
                            "parameter servers across processes (run_option PS); use 'MPI' or 'HYBRID' (whose "
                            "sparse variables may stay on servers), or one process (a single resource line)")
        _check_ports(cluster, ranks, layout)
        processes = _processes(ranks, layout)
        staged = any(p.role == Role.STAGE for p in processes)
        stage_servers = backend_class(settings.allreduce_comm.backend).supports_stage_servers
        if staged and (layout is not Layout.MPI or not stage_servers):
            raise PlanError(f"pipeline_stages={settings.pipeline.stages} with each stage in a process of its own (the "
                            "resource lines' devices do not divide into stages) runs with run_option 'MPI' and the "
                            f"'mpi' all-reduce backend, not {layout} / {settings.allreduce_comm.backend!r}: list "
                            "each replica's stages on one line to keep them in one process, or use 'MPI'")
        # stage servers: the workers reach their stages through TensorFlow's gRPC runtime
        servers = layout is not Layout.MPI or staged or backend_class(settings.allreduce_comm.backend).needs_server
    plan = _variable_plan(layout, processes, servers, settings, analysis, by_memory, ranks)
    refuse_unsynchronised(analysis, settings.sync_batch_norm, settings.pipeline)
    notes += statistics_note(analysis.batch_statistics, sum(len(w.replica_devices) for w in plan.workers))
    return JobPlan(layout, processes, ranks, plan, servers, notes, choices)


def _fit_memory(cluster: Cluster, settings: Settings, analysis: GraphAnalysis) -> tuple[Settings, bool]:
    """With ``device_memory`` and no pipeline asked for: as many stages as the variables need
    (model parallelism), cut where their bytes are balanced."""
    pipeline = settings.pipeline
    if settings.device_memory is None or pipeline.stages > 1 or pipeline.cuts:
        return settings, False
    counts = [len(w.devices or _bare_host_devices(settings.gpus)) for w in cluster.workers]
    fitted = fit_stages(analysis, settings.device_memory, counts)
    return replace(settings, pipeline=pipeline._replace(stages=fitted)), fitted > 1


def _layout(cluster: Cluster, settings: Settings, analysis: GraphAnalysis
            ) -> tuple[Layout, tuple[RankSpec, ...], tuple[str, ...]]:
    """The layout, the ranks to launch, and notes on a run option that runs as another layout."""
    first = cluster.workers[0]
    alone = len(cluster.workers) == 1 and first.host in settings.local_hosts and not cluster.servers
    stages = settings.pipeline.stages
    per_device = ranks_per_device(cluster, stages)
    option = settings.run_option
    if option == "MPI":
        local = len(cluster.workers) == 1 and first.host in settings.local_hosts and len(per_device) == 1
        return (Layout.LOCAL, (), ()) if local else (Layout.MPI, per_device, ())
    if option == "PS":
        return (Layout.LOCAL, (), ()) if alone else (Layout.PS, ps_ranks(cluster), ())
    if alone and len(per_device) == 1:
        return Layout.LOCAL, (), ()
    # HYBRID or AUTO: each variable as a process per device beside servers (HYBRID's layout) would send it
    choices, coupled = choose_sync(analysis, len(per_device), 1, CrossWorker.of(Layout.HYBRID, option),
                                   settings.overrides, hosts=[r.host for r in per_device])
    on_servers = [name for name, c in choices.items() if c.sync is Sync.PS]
    if not on_servers:
        if coupled:  # sparse gradients there were, but tied to the all-reduced updates
            why = "; ".join(coupled)
        elif option == "HYBRID":
            why = "no sparse gradient"
        else:
            why = "the cost model chose all-reduce or all-gather for every variable"
        unused = "; the ps lines of the cluster file are not used" if cluster.servers else ""
        return Layout.MPI, per_device, (f"run_option={option}: no variable goes to parameter servers ({why}), so "
                                   f"the job runs as MPI{unused}",)
    if len(on_servers) == len(choices):
        why = "no dense gradient" if option == "HYBRID" else "cost model"
        return Layout.PS, ps_ranks(cluster), (f"run_option={option}: every variable goes to parameter servers "
                                         f"({why}), so the job runs as PS",)
    return Layout.HYBRID, hybrid_ranks(cluster, stages), ()


def _unused_alone(settings: Settings) -> tuple[str, ...]:
    """The note on what a job of one worker does not use: the settings that act between workers."""
    if not settings.cross_worker_settings:
        return ()
    named = [s + " (its replicas average their gradients in every step, in-graph)" if s == "sync=False" else s
             for s in settings.cross_worker_settings]
    return (f"one worker trains alone here (the local layout): nothing crosses workers, so these settings are "
            f"not used: {', '.join(named)}",)


def _bare_host_devices(gpus: int) -> tuple[Device, ...]:
    """What a bare host line stands for: every GPU, or one CPU replica without GPUs."""
    return tuple(Device("gpu", i) for i in range(gpus)) if gpus else (Device("cpu", 0),)


def _check_ports(cluster: Cluster, ranks: tuple[RankSpec, ...], layout: Layout) -> None:
    """A worker line's port serves one process: refuse a line with a port that became several.

    Raises:
        PlanError: naming the line (an explicit-role worker line whose host's GPUs make a process each).
    """
    for w in cluster.workers:
        count = sum(r.line == w.line and r.role != Role.PS for r in ranks)
        if w.port is not None and count > 1:
            raise PlanError(f"{cluster.source}, line {w.line}: the worker line of {w.host} with port {w.port} "
                            f"leaves its device to the host, whose {count} GPUs make {count} processes in "
                            f"{layout} (one per GPU), and a port serves one process: write one line per GPU, each "
                            f"with its own port (worker,{w.host},<port>,<gpu id>), or use run_option='PS'")


def _processes(ranks: tuple[RankSpec, ...], layout: Layout) -> tuple[ProcessSpec, ...]:
    """Each rank's part: its index among its role, and its devices as it sees them."""
    counters: Counter[Role] = Counter()
    trainers = Counter(r.host for r in ranks if r.role == Role.WORKER)
    out = []
    for rank, r in enumerate(ranks):
        index = counters[r.role]
        counters[r.role] += 1
        if r.role == Role.PS:
            out.append(ProcessSpec(rank, Role.PS, index, r.host, r.line, r.port, (), None, 0))
            continue
        # a worker, or a stage server (which runs the ops of its stage: devices like a worker's);
        # a bare host line is left only on hosts without GPUs (Cluster.with_bare_hosts): one CPU replica
        devices = r.devices if r.devices is not None else _bare_host_devices(0)
        gpu_ids = [d.index for d in devices if d.kind == "gpu"]
        visible = ",".join(str(i) for i in gpu_ids) or None
        # a process sees only its own GPUs, numbered from 0 (two processes on one host share none)
        seen = tuple(Device("gpu", gpu_ids.index(d.index)) if d.kind == "gpu" else d for d in devices)
        sharing = trainers[r.host] if layout.all_reduces else 1
        out.append(ProcessSpec(rank, r.role, index, r.host, r.line, r.port, seen, visible, sharing))
    return tuple(out)


def stage_tasks(processes: tuple[ProcessSpec, ...], ranks: tuple[RankSpec, ...]) -> dict[int, list[ProcessSpec]]:
    """Each worker's stage servers, in stage order (a pipeline spread over processes; else empty)."""
    if not any(p.role == Role.STAGE for p in processes):
        return {}
    worker_of = {r.group: p.index for p, r in zip(processes, ranks) if p.role == Role.WORKER}
    out: dict[int, list[tuple[int, ProcessSpec]]] = {}
    for p, r in zip(processes, ranks):
        if p.role == Role.STAGE:
            out.setdefault(worker_of[r.group], []).append((r.stage, p))
    return {w: [p for _, p in sorted(stages, key=lambda x: x[0])] for w, stages in out.items()}


def _variable_plan(layout: Layout, processes: tuple[ProcessSpec, ...], servers: bool, settings: Settings,
                   analysis: GraphAnalysis, by_memory: bool = False, ranks: tuple[RankSpec, ...] = ()) -> Plan:
    """The plan of every variable, with each worker's TensorFlow device names."""
    workers = []
    stages = stage_tasks(processes, ranks)
    for p in processes:
        if p.role != Role.WORKER:
            continue
        prefix = f"/job:worker/replica:0/task:{p.index}" if servers else ""
        replicas = tuple(f"{prefix}{d.tf_name}" for d in p.devices)
        # a replica spread over processes: its later stages' devices are on the stage servers
        replicas += tuple(f"/job:stage/replica:0/task:{s.index}{s.devices[0].tf_name}" for s in stages.get(p.index, ()))
        # one process per device (MPI): its shared state stays on that device, next to the all-reduce
        shared = replicas[0] if layout is Layout.MPI else f"{prefix}/device:CPU:0"
        workers.append((p.host, replicas, shared))
    server_devices = tuple(f"/job:ps/replica:0/task:{p.index}/device:CPU:0" for p in processes if p.role == Role.PS)
    server_hosts = tuple(p.host for p in processes if p.role == Role.PS)
    option = settings.run_option
    overrides = settings.overrides
    if layout is Layout.LOCAL:  # in one process every variable is local: only the densities matter
        overrides = {k: {key: v[key] for key in ("density", "stage") if key in v}
                     for k, v in overrides.items() if isinstance(v, dict) and {"density", "stage"} & set(v)}
    notes = (f"run_option={option} runs as {layout}",) if layout is not Layout.LOCAL and layout != option else ()
    if layout is Layout.HYBRID:
        notes += settings.notes
    run_option = option if layout is Layout.LOCAL else layout.value
    pipeline = settings.pipeline
    return build_plan(analysis, workers, PlanOptions(
        run_option=run_option, sync=settings.sync, average_sparse=settings.average_sparse,
        cross_worker=CrossWorker.of(layout, option), comm=settings.comm_for(layout), server_devices=server_devices,
        ps=settings.ps, overrides=overrides, notes=notes, server_hosts=server_hosts,
        zero_stage=settings.zero_stage if layout.all_reduces else 0, pipeline_stages=pipeline.stages,
        micro_batches=pipeline.micro_batches, pipeline_cuts=pipeline.cuts, device_memory=settings.device_memory,
        pipeline_by_memory=by_memory, pipeline_schedule=pipeline.schedule))
