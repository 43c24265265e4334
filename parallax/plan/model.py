"""The Plan: what goes where, as plain frozen data.

Vocabulary, used the same way everywhere in Parallax:

* **task**: one process of the job (a worker, or later a parameter server).
* **replica**: one copy of the model on one device. A worker task holds one
  or more replicas (``num_replicas_per_worker``), built into its graph.
* **server**: a parameter-server task.

A :class:`Plan` is deterministic (sorted, no timestamps), round-trips through
``to_dict``/``from_dict`` (JSON), and prints as a table with :meth:`Plan.describe`
(:mod:`parallax.plan.describe`). How its processes communicate, :class:`CommSpec` and
:class:`PSSpec`, is :mod:`parallax.plan.communication`'s, and its vocabularies, :class:`Layout`,
:class:`Sync` and :class:`CrossWorker`, are :mod:`parallax.plan.vocabulary`'s (importable from here too).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from parallax.config import BACKENDS
from parallax.plan.buckets import overlap_buckets
from parallax.plan.communication import CommSpec, PSSpec
from parallax.plan.describe import PlanTable
from parallax.plan.vocabulary import SYNC_METHODS, CrossWorker, Layout, Sync

__all__ = ["Layout", "Sync", "CrossWorker", "part_sizes", "GradientRef", "VariablePlacement", "WorkerPlan",
           "TaskSpec", "Plan", "CommSpec", "PSSpec", "PipelineSpec", "AGGREGATIONS", "SYNC_METHODS", "BACKENDS"]

AGGREGATIONS = ("mean", "sum")


def part_sizes(length: int, workers: int) -> list[int]:
    """How a tensor of ``length`` elements is cut over ``workers`` (sharded optimizer states): worker
    ``k`` holds elements ``[k m, (k+1) m)``, ``m = ceil(length / workers)``; the last parts are
    shorter, or empty. The rewrite and the MPI calls both cut by this.

    >>> part_sizes(10, 4), part_sizes(2, 3)
    ([3, 3, 3, 1], [1, 1, 0])
    """
    workers = max(1, workers)
    m = -(-length // workers)
    return [max(0, min(m, length - k * m)) for k in range(workers)]


@dataclass(frozen=True)
class GradientRef:
    """Where a variable's gradient is in the single-device graph.

    ``tensor`` is the dense gradient, or the values of a sparse one, whose
    ``indices`` are then given too. ``dtype``/``indices_dtype`` are their dtype names.
    ``repeats_merged``: the update itself first sums the rows of a sparse gradient
    whose indices repeat (see :attr:`parallax.analysis.GradientInfo.repeats_merged`),
    so they may be summed before they are sent. ``densified``: the update makes a sparse gradient whole first
    (:attr:`parallax.analysis.GradientInfo.densified`). ``shape``: a dense gradient's static shape where it
    is not the variable's (the values of a gather whose indices every replica shares, see
    :attr:`parallax.analysis.GradientInfo.shape`).
    """

    tensor: str
    indices: str | None = None
    dtype: str = "float32"
    indices_dtype: str | None = None
    repeats_merged: bool = False
    shape: tuple[int, ...] | None = None
    densified: bool = False

    def __post_init__(self) -> None:
        if self.shape is not None:  # a tuple, also when read back from JSON's list
            object.__setattr__(self, "shape", tuple(self.shape))

    @property
    def sparse(self) -> bool:
        return self.indices is not None



@dataclass(frozen=True)
class VariablePlacement:
    """How one variable is synchronised.

    Attributes:
        name: the variable's op name in the single-device graph.
        shape: its shape (``None`` for unknown dimensions).
        dtype: dtype name.
        trainable: whether it is trainable.
        gradient: its gradient, or ``None`` when no optimizer updates it.
        aggregation: ``"mean"`` or ``"sum"`` of the replicas' gradients.
        sync: ``"local"`` (only this worker's replicas aggregate, in its
            graph), ``"allreduce"`` (then summed across every worker; a
            sparse gradient is made dense first), ``"allgather"`` (a sparse
            gradient's rows are gathered from every worker) or ``"ps"`` (the
            variable lives on a parameter server; workers send it their
            gradients). Variables without a gradient are ``"local"``.
        server: the parameter server holding the variable (index into
            ``Plan.server_devices``), or ``None`` (it lives on every worker).
        density: the estimated fraction of the rows one worker's gradient
            touches per step (sparse gradients), or ``None`` when unknown.
        density_source: where ``density`` comes from: ``"shapes"`` (static
            shapes of the gradient's indices), ``"override"`` or ``"unknown"``.
        partition_of: the partitioned variable this one is a part of.
        bytes_per_worker: the estimated bytes one worker sends per step to
            synchronise this variable (see :mod:`parallax.plan.cost`).
        slot_of: the variable this one is an optimizer slot of (Adam's moments).
        sharded: with ``Plan.zero_stage``, a variable whose slots each worker keeps
            ``1/n`` of (and updates that part of it), or such a slot.
        stage: with a pipeline (:class:`PipelineSpec`), the stage whose device holds the
            variable (its slots follow it); ``0`` otherwise.
        summed: a metric's state, to which every replica adds (:attr:`parallax.analysis.VariableInfo.summed`).
    """

    name: str
    shape: tuple[int | None, ...]
    dtype: str
    trainable: bool
    gradient: GradientRef | None
    aggregation: str = "mean"
    sync: Sync = Sync.LOCAL
    server: int | None = None
    density: float | None = None
    density_source: str = ""
    partition_of: str | None = None
    bytes_per_worker: int = 0
    slot_of: str | None = None
    sharded: bool = False
    stage: int = 0
    summed: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "sync", Sync(self.sync))  # a misspelt method is a ValueError here
        if (self.sync is Sync.PS) != (self.server is not None) and self.sync is not Sync.LOCAL:
            raise ValueError(f'variable "{self.name}": sync {self.sync} with server {self.server}; a variable '
                             "synchronised through a server lives on one, an all-reduced or gathered one on none")

    @property
    def sparse(self) -> bool:
        return self.gradient is not None and self.gradient.sparse

    @property
    def num_bytes(self) -> int:
        return self.itemsize * self.num_elements

    @property
    def gradient_shape(self) -> tuple[int | None, ...]:
        """The shape of the dense gradient that crosses: the variable's, or the shared rows' values'
        (:attr:`GradientRef.shape`)."""
        return self.gradient.shape if self.gradient is not None and self.gradient.shape is not None else self.shape

    @property
    def itemsize(self) -> int:
        import numpy as np

        return 2 if self.dtype == "bfloat16" else int(np.dtype(self.dtype.replace("_ref", "")).itemsize)

    @property
    def num_elements(self) -> int:
        n = 1
        for d in self.shape:
            n *= d or 1
        return n

    def shard_elements(self, num_workers: int) -> int:
        """Elements of one worker's part when sharded over ``num_workers`` (the last parts padded).

        >>> VariablePlacement("w", (10, 3), "float32", True, None).shard_elements(4)
        8
        """
        return part_sizes(self.num_elements, num_workers)[0]


@dataclass(frozen=True)
class WorkerPlan:
    """One worker task: its host and the TensorFlow device of each of its replicas."""

    host: str
    replica_devices: tuple[str, ...]
    shared_device: str


@dataclass(frozen=True)
class PipelineSpec:
    """Pipeline (and model) parallelism inside each replica (:mod:`parallax.rewrite.micro_batches`).

    Attributes:
        stages: the forward pass is cut into this many stages, each on a device of its own;
            the backward ops of a forward op go to its stage.
        micro_batches: each replica's batch is split into this many micro-batches, each
            run through the stages, their gradients averaged before the one update.
        cuts: the first forward op of stages ``1 .. stages-1``, in the order the ops were made.
        devices: ``devices[w][r][s]``: the device of stage ``s`` of replica ``r`` of worker
            ``w`` (``WorkerPlan.replica_devices`` holds stage 0's).
        stage_costs: the estimated cost of each stage's forward ops (see
            :class:`parallax.analysis.ForwardOp`).
        cut_by: ``"cost"`` (cut where the estimated cost is balanced), ``"memory"`` (where the
            bytes of variables are, to fit ``device_memory``) or ``"user"`` (``Config.pipeline_cuts``).
        schedule: ``"gpipe"`` (the dataflow's order: forwards may run ahead of backwards) or
            ``"1f1b"`` (on stage ``s`` a micro-batch's forward waits for the backward of the
            micro-batch ``k - s`` before it).
    """

    stages: int = 1
    micro_batches: int = 1
    cuts: tuple[str, ...] = ()
    devices: tuple[tuple[tuple[str, ...], ...], ...] = ()
    stage_costs: tuple[int, ...] = ()
    cut_by: str = "cost"
    schedule: str = "gpipe"

    @property
    def active(self) -> bool:
        return self.stages > 1 or self.micro_batches > 1

    @property
    def bubble(self) -> float:
        """The fraction of a step each stage idles in the GPipe schedule: ``(k-1)/(m+k-1)``.

        >>> PipelineSpec(stages=4, micro_batches=8).bubble
        0.2727272727272727
        """
        return (self.stages - 1) / (self.micro_batches + self.stages - 1)


@dataclass(frozen=True)
class TaskSpec:
    """The identity of the process a graph is rewritten for."""

    worker_index: int


@dataclass(frozen=True)
class Plan(PlanTable):
    """The whole layout of a job.

    Attributes:
        run_option: ``PS``, ``MPI``, ``HYBRID`` or ``AUTO`` as resolved.
        sync: synchronous training.
        workers: every worker task, in worker-id order.
        variables: every variable, sorted by name.
        train_ops: the single-device graph's training ops.
        notes: remarks on choices made, printed by :meth:`describe`.
        comm: how gradients cross worker processes.
        server_devices: the TensorFlow device of each parameter server.
        ps: the PS communication settings.
        server_hosts: the host of each parameter server (for the traffic
            model: what crosses between hosts), or ``()`` when unknown.
        zero_stage: ZeRO: ``0`` off; ``1`` the workers shard the slots of the
            variables marked ``sharded``; ``2`` their gradients too
            (:mod:`parallax.rewrite.zero`).
        pipeline: stages and micro-batches inside each replica.
        replica_sums: the ops of the graph that stand for sums over every replica of the job (synchronised
            batch statistics, :data:`parallax.analysis.batch_statistics.REPLICA_SUMS`), in the graph's order.
    """

    run_option: str
    sync: bool
    workers: tuple[WorkerPlan, ...]
    variables: tuple[VariablePlacement, ...]
    train_ops: tuple[str, ...]
    notes: tuple[str, ...] = field(default=())
    comm: CommSpec = field(default_factory=CommSpec)
    server_devices: tuple[str, ...] = field(default=())
    ps: PSSpec = field(default_factory=PSSpec)
    server_hosts: tuple[str, ...] = field(default=())
    zero_stage: int = 0
    pipeline: PipelineSpec = field(default_factory=PipelineSpec)
    replica_sums: tuple[str, ...] = ()

    @property
    def num_workers(self) -> int:
        return len(self.workers)

    @property
    def sums_replicas_across_workers(self) -> bool:
        """Whether the step's own sums over the replicas (:attr:`replica_sums`) cross worker processes."""
        return bool(self.replica_sums) and self.num_workers > 1

    @property
    def num_replicas(self) -> int:
        """Replicas over all workers."""
        return sum(len(w.replica_devices) for w in self.workers)

    def first_replica(self, worker_index: int) -> int:
        """Global index of the first replica of worker ``worker_index``."""
        return sum(len(w.replica_devices) for w in self.workers[:worker_index])

    @property
    def bytes_per_worker(self) -> int:
        """Estimated bytes one worker sends per step, all variables together."""
        return sum(v.bytes_per_worker for v in self.variables)

    def bytes_per_rank(self) -> tuple[int, int]:
        """``(variables, slots)``: bytes of the variables a worker holds, its optimizer slots apart,
        with sharded slots at their ``1/n`` (a sharded variable adds its part, updated in place).
        Server-held variables are not counted."""
        held = [v for v in self.variables if v.server is None]
        n = self.num_workers
        variables = sum(v.num_bytes + (v.itemsize * v.shard_elements(n) if v.sharded else 0)
                        for v in held if v.slot_of is None)
        slots = sum(v.itemsize * v.shard_elements(n) if v.sharded else v.num_bytes
                    for v in held if v.slot_of is not None)
        return variables, slots

    def variable(self, name: str) -> VariablePlacement:
        for v in self.variables:
            if v.name == name:
                return v
        raise KeyError(name)

    # ------------------------------------------------------------------ #
    def to_dict(self) -> dict[str, Any]:
        """Plain JSON-ready data."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Plan:
        """Inverse of :meth:`to_dict`."""
        variables = tuple(
            VariablePlacement(
                name=v["name"], shape=tuple(v["shape"]), dtype=v["dtype"], trainable=v["trainable"],
                gradient=GradientRef(**v["gradient"]) if v["gradient"] else None,
                aggregation=v["aggregation"], sync=v.get("sync", Sync.LOCAL), server=v.get("server"),
                density=v.get("density"), density_source=v.get("density_source", ""),
                partition_of=v.get("partition_of"), bytes_per_worker=v.get("bytes_per_worker", 0),
                slot_of=v.get("slot_of"), sharded=v.get("sharded", False), stage=v.get("stage", 0))
            for v in data["variables"])
        workers = tuple(WorkerPlan(w["host"], tuple(w["replica_devices"]), w["shared_device"])
                        for w in data["workers"])
        return cls(run_option=data["run_option"], sync=data["sync"], workers=workers,
                   variables=variables, train_ops=tuple(data["train_ops"]),
                   notes=tuple(data.get("notes", ())), comm=CommSpec(**data.get("comm", {})),
                   server_devices=tuple(data.get("server_devices", ())), ps=PSSpec(**data.get("ps", {})),
                   server_hosts=tuple(data.get("server_hosts", ())), zero_stage=data.get("zero_stage", 0),
                   pipeline=_pipeline_from_dict(data.get("pipeline", {})),
                   replica_sums=tuple(data.get("replica_sums", ())))

    def stage_devices(self, worker_index: int) -> tuple[tuple[str, ...], ...]:
        """``[r][s]``: the device of stage ``s`` of each replica of a worker (one stage without a pipeline)."""
        if self.pipeline.devices:
            return self.pipeline.devices[worker_index]
        return tuple((d,) for d in self.workers[worker_index].replica_devices)

    @property
    def overlaps_backward(self) -> bool:
        """Whether dense gradients are all-reduced while the backward pass runs: :attr:`CommSpec.overlap`,
        and they make more than one bucket (:func:`parallax.plan.buckets.overlap_buckets`).

        One bucket waits for the last dense gradient, which is what waiting for the backward pass
        does, so it is not overlapped, and its worker gets no thread to wait in: that thread cost the
        sparse language model of ``benchmarks/`` a fifth of its steps (3 workers on 2 cores: 56-60
        steps/s against 63-76 without it; docs/benchmarks.md).
        """
        sizes = [v.num_bytes for v in self.all_reduced_whole]
        return self.comm.overlap and len(overlap_buckets(sizes, self.comm.fusion_bytes)) > 1

    @property
    def all_reduced_whole(self) -> list[VariablePlacement]:
        """The variables whose gradients are all-reduced whole, in plan order: every ``allreduce`` one but
        ZeRO stage 2's sharded ones, whose gradients are reduce-scattered (:mod:`parallax.rewrite.zero`)."""
        return [v for v in self.variables if v.sync is Sync.ALLREDUCE and v.gradient is not None
                and not (v.sharded and self.zero_stage == 2)]


def _pipeline_from_dict(data: dict[str, Any]) -> PipelineSpec:
    devices = tuple(tuple(tuple(r) for r in w) for w in data.get("devices", ()))
    return PipelineSpec(stages=data.get("stages", 1), micro_batches=data.get("micro_batches", 1),
                        cuts=tuple(data.get("cuts", ())), devices=devices,
                        stage_costs=tuple(data.get("stage_costs", ())), cut_by=data.get("cut_by", "cost"),
                        schedule=data.get("schedule", "gpipe"))
