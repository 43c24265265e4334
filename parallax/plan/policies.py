"""Build a :class:`Plan` from the graph analysis, the workers and the config."""

from __future__ import annotations

import fnmatch
import json
import re
import zlib
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import tensorflow as tf

from parallax.analysis import GraphAnalysis
from parallax.config import COMPRESSED_FORMATS, OVERRIDE_SYNC
from parallax.errors import PlanError
from parallax.plan.cost import (
    LINKS,
    SERVER_CHAIN_SECONDS,
    cheapest,
    cheapest_without_servers,
    estimate_density,
    options,
    servers_save,
    servers_to_call,
    traffic,
)
from parallax.plan.model import CommSpec, CrossWorker, GradientRef, Plan, PSSpec, Sync, VariablePlacement, WorkerPlan
from parallax.plan.stages import group_devices, pipeline_spec
from parallax.plan.traffic import Traffic, step_traffic

__all__ = ["build_plan", "PlanOptions", "place_by_bytes", "choose_sync", "partition_of", "Choice", "CROSS_WORKER"]

_PART_RE = re.compile(r"^(.*)/part_\d+$")


def place_by_bytes(analysis: GraphAnalysis, num_servers: int, names: list[str] | None = None) -> dict[str, int]:
    """Assign every variable to a server, balancing bytes (not round-robin).

    A variable and the variables colocated with it (its optimizer slots) form
    one group; groups are taken largest first (ties by name) and each goes to
    the server holding the fewest bytes so far (ties: the lowest index). The
    result depends only on the variables, never on creation order.

    Example: groups of 400, 300 and 200 bytes on two servers give
    ``{400}`` on server 0 and ``{300, 200}`` on server 1. ``names``: only
    these variables (default: all).
    """
    names = {v.name for v in analysis.variables} if names is None else set(names)

    def root(name: str) -> str:
        seen = set()
        while True:
            target = analysis.variable(name).colocate_with
            if target is None or target not in names or target in seen:
                return name
            seen.add(name)
            name = target

    groups: dict[str, list[str]] = {}
    for v in analysis.variables:
        if v.name in names:
            groups.setdefault(root(v.name), []).append(v.name)
    sizes = {r: sum(analysis.variable(n).num_bytes for n in members) for r, members in groups.items()}
    loads = [0] * num_servers
    placement: dict[str, int] = {}
    for r in sorted(groups, key=lambda g: (-sizes[g], g)):
        server = min(range(num_servers), key=lambda i: (loads[i], i))
        loads[server] += sizes[r]
        for name in groups[r]:
            placement[name] = server
    return placement


#: ``cross_worker`` values of :func:`choose_sync`, :class:`~parallax.plan.model.CrossWorker`'s (``"local"``: one
#: worker).
CROSS_WORKER = tuple(c.value for c in CrossWorker)


@dataclass(frozen=True)
class Choice:
    """How one variable with a gradient is synchronised, and why."""

    sync: Sync
    density: float | None
    density_source: str
    reason: str


def partition_of(name: str) -> str | None:
    """The partitioned variable ``name`` is a part of (``emb/part_3`` -> ``emb``), else ``None``."""
    m = _PART_RE.match(name)
    return m.group(1) if m else None


def _override_for(name: str, overrides: Mapping[str, Any]) -> dict[str, Any]:
    """The override entries that match ``name`` or its partitioned variable (globs allowed)."""
    merged: dict[str, Any] = {}
    whole = partition_of(name)
    for pattern in sorted(overrides):
        if fnmatch.fnmatchcase(name, pattern) or (whole is not None and fnmatch.fnmatchcase(whole, pattern)):
            value = overrides[pattern]
            merged.update({"sync": value} if isinstance(value, str) else dict(value))
    return merged


def choose_sync(analysis: GraphAnalysis, num_workers: int, replicas_per_worker: int, cross_worker: CrossWorker | str,
                overrides: Mapping[str, Any] | None = None, hosts: Sequence[str] | None = None
                ) -> tuple[dict[str, Choice], tuple[str, ...]]:
    """Decide how every variable with a gradient crosses workers.

    ``cross_worker``: a :class:`~parallax.plan.model.CrossWorker` (or its value): ``LOCAL``, ``ALLREDUCE``
    (MPI: dense all-reduced, sparse all-gathered), ``PS`` (everything on servers), ``HYBRID``
    (sparse on servers, dense all-reduced) or ``AUTO`` (per variable, the
    cheapest by :mod:`parallax.plan.cost`). ``overrides`` maps variable names
    or globs (a partitioned variable's name covers its parts) to a sync
    method or to ``{"sync": ..., "density": ...}``. ``hosts``: each worker's
    host (default: all on one), for AUTO's bytes between hosts.

    In a plan that mixes servers and all-reduce, a variable on the servers
    whose gradient feeds another variable's update (``clip_by_global_norm``
    over every gradient) is all-gathered instead: each worker updates its own
    copies of the all-reduced variables and must see the whole gradient.

    Returns:
        ``({variable: Choice}, notes)``.

    Raises:
        PlanError: an override names an unknown method, or asks for one the
            variable cannot use.
    """
    if cross_worker not in CROSS_WORKER:
        raise PlanError(f"unknown cross_worker {cross_worker!r}; expected one of {', '.join(CROSS_WORKER)}")
    cross_worker = CrossWorker(cross_worker)
    overrides = overrides or {}
    choices: dict[str, Choice] = {}
    forced: set[str] = set()
    weighed: dict[str, dict[Sync, Traffic]] = {}  # AUTO's options of each variable it chose by bytes
    where = list(hosts) if hosts is not None else ["h"] * num_workers
    for g in analysis.gradients:
        var = analysis.variable(g.variable)
        extra = _override_for(g.variable, overrides)
        density = estimate_density(var.shape, g.indices_count, replicas_per_worker) if g.sparse else None
        source = "shapes" if density is not None else "unknown"
        if "density" in extra:
            density, source = float(extra["density"]), "override"
        itemsize = tf.dtypes.as_dtype(var.dtype).size
        if num_workers == 1 and cross_worker is not CrossWorker.PS:
            sync, reason = Sync.LOCAL, "one worker"
        elif cross_worker is CrossWorker.ALLREDUCE:
            sync, reason = (Sync.ALLGATHER if g.sparse else Sync.ALLREDUCE), "MPI"
        elif cross_worker is CrossWorker.PS:
            sync, reason = Sync.PS, "PS"
        elif cross_worker is CrossWorker.HYBRID:
            sync, reason = (Sync.PS if g.sparse else Sync.ALLREDUCE), "HYBRID"
        else:
            costs = weighed[g.variable] = options(var.shape, itemsize, g.sparse, density, where)
            sync = cheapest(costs, g.sparse)
            reason = "AUTO, bytes per step between hosts / in all: " + ", ".join(
                f"{s} {t.crossing:,.0f} / {t.total:,.0f}" for s, t in costs.items())
        if "sync" in extra:
            if extra["sync"] not in OVERRIDE_SYNC:
                raise PlanError(f'plan override for "{g.variable}": sync must be one of '
                                f"{', '.join(OVERRIDE_SYNC)}, got {extra['sync']!r}")
            sync, reason = Sync(extra["sync"]), "override"
            if sync is Sync.ALLGATHER and not g.sparse:
                raise PlanError(f'plan override for "{g.variable}": "allgather" needs a sparse gradient; '
                                "this variable's gradient is dense (use \"allreduce\" or \"ps\")")
            if num_workers == 1 and sync is not Sync.PS:
                sync = Sync.LOCAL
            forced.add(g.variable)
            weighed.pop(g.variable, None)
        choices[g.variable] = Choice(sync, density, source, reason)
    notes: list[str] = list(_weigh_servers(choices, weighed, where, forced))
    changed = True
    while changed:  # servers + all-reduce: a server variable coupled to a worker-side update cannot stay
        changed = False
        on_workers = {n for n, c in choices.items() if c.sync.collective}
        if not on_workers:
            break
        for g in analysis.gradients:
            c = choices[g.variable]
            if c.sync is not Sync.PS or not set(g.coupled_with) & on_workers:
                continue
            if g.variable in forced:
                raise PlanError(f'plan override puts "{g.variable}" on the parameter servers, but its gradient '
                                f"also feeds the update of {', '.join(sorted(set(g.coupled_with) & on_workers))}, "
                                "which every worker applies itself (e.g. clip_by_global_norm over all "
                                "gradients, or a loss scale optimizer's check that all are finite); put them all "
                                "on the servers or none")
            sync = Sync.ALLGATHER if g.sparse else Sync.ALLREDUCE
            choices[g.variable] = Choice(sync, c.density, c.density_source, "coupled to all-reduced updates")
            notes.append(f"{g.variable}: {sync} instead of ps, because its gradient feeds the update of "
                         f"all-reduced variables (e.g. clip_by_global_norm, or a loss scale optimizer's "
                         f"check that all gradients are finite)")
            changed = True
    return choices, tuple(notes)


@dataclass(frozen=True)
class PlanOptions:
    """What :func:`build_plan` is asked for besides the graph and the workers.

    Attributes:
        run_option: the resolved run option.
        sync: synchronous training.
        average_sparse: average sparse gradients instead of summing them.
        cross_worker: see :func:`choose_sync`.
        comm: the all-reduce settings (defaults when ``None``).
        server_devices: TensorFlow devices of the parameter servers.
        ps: the PS communication settings (defaults when ``None``).
        overrides: per-variable choices (see :func:`choose_sync`).
        notes: remarks to keep in the plan.
        server_hosts: the host of each server (``()``: unknown).
        zero_stage: shard the optimizer slots of all-reduced dense variables
            over the workers (:func:`shardable`).
        pipeline_stages, micro_batches, pipeline_cuts: the pipeline inside each replica
            (:mod:`parallax.plan.stages`): each worker's devices are taken ``pipeline_stages``
            at a time as one replica's stage devices. ``overrides`` may give a variable's
            ``stage``.
        device_memory: refuse a stage holding more bytes of variables and slots than this;
            ``pipeline_by_memory``: cut the stages where those bytes are balanced.
        pipeline_schedule: ``"gpipe"`` or ``"1f1b"``.
    """

    run_option: str
    sync: bool
    average_sparse: bool
    cross_worker: CrossWorker = CrossWorker.LOCAL
    comm: CommSpec | None = None
    server_devices: tuple[str, ...] = ()
    ps: PSSpec | None = None
    overrides: Mapping[str, Any] | None = None
    notes: tuple[str, ...] = ()
    server_hosts: tuple[str, ...] = ()
    zero_stage: int = 0
    pipeline_stages: int = 1
    micro_batches: int = 1
    pipeline_cuts: tuple[str, ...] = ()
    device_memory: int | None = None
    pipeline_by_memory: bool = False
    pipeline_schedule: str = "gpipe"


def build_plan(analysis: GraphAnalysis, workers: list[tuple[str, tuple[str, ...], str]],
               options: PlanOptions | None = None, **fields: Any) -> Plan:
    """Decide the layout of every variable and replica.

    Dense gradients are averaged over the replicas; sparse ones are summed,
    or averaged when ``average_sparse`` is set (the seed system's semantics).

    Variables with a gradient are synchronised as :func:`choose_sync` says.
    Those on parameter servers are placed by :func:`place_by_bytes` with
    their optimizer slots. When every such variable is on the servers (PS),
    so is every other variable (global step, Adam's powers); when some are
    all-reduced, the others live on every worker.

    Args:
        analysis: the single-device graph's analysis.
        workers: ``(host, replica devices, shared device)`` of every worker
            task, in worker-id order, as TensorFlow device names.
        options: what is asked (:class:`PlanOptions`), or its ``fields`` as keywords
            (``build_plan(analysis, workers, run_option="MPI", sync=True, average_sparse=True)``).

    Returns:
        The plan.

    Raises:
        PlanError: variables go to parameter servers but there are none, or a
            bad override.
    """
    if options is None:
        options = PlanOptions(**fields)
    elif fields:
        raise TypeError(f"build_plan: the options or their fields, not both (got {', '.join(sorted(fields))})")
    overrides, pipeline_stages = options.overrides or {}, options.pipeline_stages
    stage_devices = [group_devices(devices, pipeline_stages, f"worker {i} on {host}")
                     for i, (host, devices, _) in enumerate(workers)]
    placed = {v.name: entry["stage"] for v in analysis.variables
              if "stage" in (entry := _override_for(v.name, overrides))}
    pipeline, stage_of_variable = pipeline_spec(analysis, stage_devices, pipeline_stages, options.micro_batches,
                                                options.pipeline_cuts, placed, options.device_memory,
                                                options.pipeline_by_memory, options.pipeline_schedule)
    worker_plans = tuple(WorkerPlan(host, tuple(r[0] for r in grouped), shared)
                         for (host, _, shared), grouped in zip(workers, stage_devices))
    replicas = max(1, len(worker_plans[0].replica_devices)) if worker_plans else 1
    choices, more_notes = choose_sync(analysis, len(worker_plans), replicas, options.cross_worker, overrides,
                                      hosts=[w.host for w in worker_plans])
    server_devices, server_hosts, notes = options.server_devices, options.server_hosts, options.notes
    on_servers = {name for name, c in choices.items() if c.sync is Sync.PS}
    if on_servers and not server_devices:
        raise PlanError(f"the plan puts {', '.join(sorted(on_servers))} on parameter servers, but the job has "
                        "none; use run_option='PS', 'HYBRID' or 'AUTO' with several workers")
    ps = options.ps or PSSpec()
    if on_servers and len(server_devices) > 1 and len(server_hosts) == len(server_devices):
        chosen, why = _servers_to_call(analysis, choices, on_servers, [w.host for w in worker_plans],
                                       server_hosts, ps.num_servers)
        server_devices = tuple(server_devices[i] for i in chosen)
        server_hosts = tuple(server_hosts[i] for i in chosen)
        notes = (*notes, why)
    summed = {v.name for v in analysis.variables if v.summed}  # metrics' states: each worker's own, in every mode
    on_workers_too = any(c.sync is not Sync.PS for c in choices.values())
    mixed = bool(on_servers) and (on_workers_too or bool(summed))
    if on_workers_too and on_servers:
        names = [v.name for v in analysis.variables if _server_group(analysis, v.name) in on_servers]
    else:
        names = [v.name for v in analysis.variables if v.name not in summed]
    # A forward-only graph in PS mode keeps its variables on the servers too: the
    # chief initializes them once and every worker reads the same values.
    forward_only_ps = options.cross_worker == CrossWorker.PS and not choices and bool(server_devices)
    placement = place_by_bytes(analysis, len(server_devices), names) if on_servers or forward_only_ps else {}
    if mixed and ps.local_aggregation and replicas == 1 and _aggregation_saves(worker_plans):
        ps = replace(ps, host_aggregation=True)
    variables = []
    for v in analysis.variables:
        g = analysis.gradient(v.name)
        ref = None if g is None else GradientRef(*g.aggregation_tensors, g.dtype, g.indices_dtype, g.repeats_merged,
                                           g.shape, g.densified)
        aggregation = "sum" if (g is not None and g.sparse and not options.average_sparse) else "mean"
        c = choices.get(v.name, Choice(Sync.LOCAL, None, "", ""))
        variables.append(VariablePlacement(v.name, v.shape, v.dtype, v.trainable, ref, aggregation, c.sync,
                                           placement.get(v.name), c.density, c.density_source,
                                           partition_of(v.name), slot_of=v.slot_of,
                                           stage=stage_of_variable.get(v.name, 0), summed=v.summed))
    zero_stage = options.zero_stage
    zero_notes: tuple[str, ...] = ()
    if zero_stage and len(worker_plans) > 1:
        variables, zero_notes = _shard_slots(variables, zero_stage)
    elif zero_stage:
        zero_notes = (f"zero_stage={zero_stage} shards optimizer states over the workers that all-reduce; this job "
                      "has one worker, so nothing is sharded",)
    comm, compression_notes = resolve_compression(options.comm or CommSpec(), worker_plans, server_hosts,
                                                  collectives=any(c.sync.collective for c in choices.values()))
    plan = Plan(run_option=options.run_option, sync=options.sync, workers=worker_plans, variables=tuple(variables),
                train_ops=analysis.train_ops, notes=tuple(notes) + more_notes + zero_notes + compression_notes,
                comm=comm,
                server_devices=tuple(server_devices), ps=ps, server_hosts=tuple(server_hosts),
                zero_stage=zero_stage if len(worker_plans) > 1 else 0, pipeline=pipeline,
                replica_sums=analysis.replica_sums)
    costs = step_traffic(plan).variables
    n = max(1, len(worker_plans))
    plan = replace(plan, variables=tuple(replace(v, bytes_per_worker=round(costs[v.name].per(n).total))
                                         if v.name in costs else v for v in plan.variables))
    # every process of the job computes the same key from the same plan; another job's plan, another key
    key = zlib.crc32(json.dumps(plan.to_dict(), sort_keys=True).encode()) % (1 << 30)
    return replace(plan, comm=replace(plan.comm, job_key=key))


def _servers_to_call(analysis: GraphAnalysis, choices: dict[str, Choice], on_servers: set[str],
                     worker_hosts: list[str], server_hosts: Sequence[str], wanted: int) -> tuple[tuple[int, ...], str]:
    """The job's servers that hold variables (:func:`parallax.plan.cost.servers_to_call`, or the first
    ``wanted`` of its order), and the plan's note on them."""
    total = Traffic()
    for name in sorted(on_servers):
        var, g = analysis.variable(name), analysis.gradient(name)
        total = total + traffic(Sync.PS, var.shape, tf.dtypes.as_dtype(var.dtype).size, g.sparse, choices[name].density,
                                worker_hosts)
    chosen, seconds, every = servers_to_call(total, worker_hosts, server_hosts, wanted)
    if wanted:
        why = f"PSConfig.num_servers={wanted}"
    else:
        why = (f"{len(chosen)} cost{'s' if len(chosen) == 1 else ''} {seconds * 1e3:.2f} ms per step over the "
               f"assumed links and calls, all {len(server_hosts)} {every * 1e3:.2f} ms "
               f"(parallax/plan/cost.py; PSConfig.num_servers to choose)")
    held = ", ".join(f"ps {i} on {server_hosts[i]}" for i in chosen)
    return chosen, (f"servers: {len(chosen)} of {len(server_hosts)} hold variables ({held}): every worker's step "
                    f"calls each server that holds one; {why}")


def _weigh_servers(choices: dict[str, Choice], weighed: dict[str, dict[Sync, Traffic]], hosts: list[str],
                   forced: set[str]) -> tuple[str, ...]:
    """AUTO's servers, kept only when they save more time over the links than their chain costs a step
    (:func:`parallax.plan.cost.servers_save`); else each of its variables goes its cheapest other way, in
    ``choices``. An override that puts a variable on the servers pays the chain already."""
    on_servers = {n: weighed[n] for n, c in choices.items() if n in weighed and c.sync is Sync.PS}
    if not on_servers or any(choices[n].sync is Sync.PS for n in forced):
        return ()
    saved = servers_save(on_servers, hosts)
    if saved >= SERVER_CHAIN_SECONDS:
        return ()
    inside, between = LINKS
    why = (f"AUTO: the servers would save {saved * 1e3:.3f} ms per step over the assumed links "
           f"({between.bandwidth * 8e-9:g} Gbit/s between hosts, {inside.bandwidth * 8e-9:g} Gbit/s inside), less "
           f"than the {SERVER_CHAIN_SECONDS * 1e3:g} ms their synchronous chain costs a step")
    for name, ways in on_servers.items():
        c = choices[name]
        choices[name] = Choice(cheapest_without_servers(ways), c.density, c.density_source, why)
    return (f"{', '.join(sorted(on_servers))}: not on the servers. {why}; "
            "parallax tune measures the layouts instead",)


def resolve_compression(comm: CommSpec, workers: Sequence[WorkerPlan], server_hosts: Sequence[str] = (),
                        collectives: bool = True) -> tuple[CommSpec, tuple[str, ...]]:
    """``CommSpec.compression`` checked against what its backends carry (``CommSpec.wire_formats``), and
    ``"auto"`` decided: a 16-bit format when the job spans several hosts (its gradients cross a network
    link, where half the bytes is worth two casts), bf16 where the backends take it, else fp16; none on
    one host (loopback and shared memory move bytes faster than the casts cost); with a note saying
    which. ``collectives``: some gradient is all-reduced or all-gathered (otherwise only pushes to
    servers, which take either format, are compressed).

    >>> w = [WorkerPlan("a", ("cpu:0",), "cpu:0"), WorkerPlan("b", ("cpu:0",), "cpu:0")]
    >>> resolve_compression(CommSpec(compression="auto"), w)[0].compression
    'bf16'
    >>> resolve_compression(CommSpec(compression="auto", wire_formats=("fp16",)), w)[0].compression
    'fp16'
    >>> resolve_compression(CommSpec(compression="auto"), w[:1], ("a",))[0].compression
    'none'
    >>> resolve_compression(CommSpec(compression="bf16", backend="collective", wire_formats=("fp16",)), w)
    Traceback (most recent call last):
    ...
    parallax.errors.PlanError: CommunicationConfig.compression='bf16': the collective backend carries only 'fp16'; \
use compression='fp16' or another MPIConfig.backend
    """
    allowed = [f for f in COMPRESSED_FORMATS if f in comm.wire_formats or not collectives]
    if comm.compression in COMPRESSED_FORMATS and comm.compression not in allowed:
        raise PlanError(f"CommunicationConfig.compression={comm.compression!r}: the {comm.backend} backend carries "
                        f"only {', '.join(map(repr, comm.wire_formats))}; use compression={allowed[0]!r} or "
                        "another MPIConfig.backend")
    if comm.compression != "auto":
        return comm, ()
    hosts = {w.host for w in workers} | set(server_hosts)
    chosen = allowed[-1] if len(hosts) > 1 else "none"
    why = f"{len(hosts)} hosts: gradients cross network links" if len(hosts) > 1 else \
        "one host: no network link to save bytes on"
    return replace(comm, compression=chosen), (f"compression='auto': {chosen} ({why})",)


def shardable(v: VariablePlacement, slots: list[VariablePlacement]) -> str:
    """Why ZeRO cannot shard ``v``'s ``slots`` (``""``: it can): only dense gradients that are
    all-reduced, or sparse ones all-gathered that the update makes whole (a Keras 3 optimizer's), of a known
    shape, with slots to shard."""
    if v.gradient is None:
        return ""
    if v.sparse and not v.gradient.densified:
        return "sparse gradient"
    if v.sync is not (Sync.ALLGATHER if v.sparse else Sync.ALLREDUCE):
        return f"sync {v.sync}"
    if not slots:
        return "no optimizer slots"
    if any(d is None for d in v.shape):
        return "shape not fully known"
    if v.gradient_shape != v.shape:
        return "its gradient is rows of it"
    return ""


def _shard_slots(variables: list[VariablePlacement], stage: int) -> tuple[list[VariablePlacement], tuple[str, ...]]:
    """Mark the variables whose slots are sharded (ZeRO), and those slots; notes on the others."""
    slots: dict[str, list[VariablePlacement]] = {}
    for v in variables:
        if v.slot_of is not None:
            slots.setdefault(v.slot_of, []).append(v)
    sharded, skipped = set(), []
    for v in variables:
        if v.gradient is None:
            continue
        why = shardable(v, slots.get(v.name, []))
        if why:
            skipped.append(f"{v.name} ({why})")
        else:
            sharded.add(v.name)
    marked = [replace(v, sharded=True) if v.name in sharded or v.slot_of in sharded else v for v in variables]
    notes = [f"zero_stage={stage}: the slots of {len(sharded)} variable(s) are sharded over the workers"]
    if skipped:
        notes.append(f"zero_stage={stage} leaves {len(skipped)} variable(s) whole: " + ", ".join(skipped[:8])
                     + (" ..." if len(skipped) > 8 else ""))
    return marked, tuple(notes)


def _aggregation_saves(workers: tuple[WorkerPlan, ...]) -> bool:
    """Whether gathering a host's sparse gradients to one sender can save traffic between hosts:
    only with several hosts, one of them with several workers. On one host the gather would add
    its bytes to the same pushes (every server is on that host too)."""
    per_host = Counter(w.host for w in workers)
    return len(per_host) > 1 and max(per_host.values()) > 1


def _server_group(analysis: GraphAnalysis, name: str) -> str:
    """The variable whose server ``name`` follows: its own, or an optimizer slot's primary
    (found through the update ops, see :attr:`VariableInfo.slot_of`). Adam's ``beta1_power``
    is colocated with the first variable but is no slot of it: it follows nobody."""
    return analysis.variable(name).slot_of or name
