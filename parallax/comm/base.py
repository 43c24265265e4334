"""The interface every all-reduce backend implements.

A backend is used twice:

1. at rewrite time, inside a scratch graph, an instance builds the ops that
   sum dense gradients (:meth:`Backend.allreduce_sum`) and gather sparse ones
   (:meth:`Backend.allgather`) across worker processes. Each call gets a list of
   gradients (the dense ones bucket by bucket, in the order the backward pass makes
   them ready: :mod:`parallax.rewrite.readiness`), which it may fuse; it must issue
   its communication in the order of the calls and lists, the same on every worker;
2. at run time, in each worker process, the class says what the process needs
   before its session starts: whether it needs a TensorFlow server
   (:attr:`Backend.needs_server`), what the session config must say
   (:meth:`Backend.configure_session`) and how the rewritten graph's ops are
   bound to this process (:meth:`Backend.prepare`, which returns what to release
   when the session closes).

Backends are looked up by name in :mod:`parallax.comm.registry`; nothing outside
``parallax/comm/`` switches on a backend's name.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, ClassVar

import tensorflow as tf
from tensorflow.core.framework import graph_pb2
from tensorflow.core.protobuf import config_pb2

from parallax.plan.model import CommSpec

__all__ = ["Backend", "ProcessComms", "Prepared", "NO_SHARDS"]

NO_SHARDS = ("the {} backend cannot shard optimizer states (zero_stage); use MPIConfig(backend='mpi'), "
             "the default on CPUs")


@dataclass(frozen=True)
class ProcessComms:
    """The communicators and TensorFlow cluster facts of one worker process.

    Attributes:
        workers: the mpi4py communicator of the job's workers (``None``:
            ``MPI.COMM_WORLD``, where every rank is a worker).
        groups: communicators of named subsets of the workers (``{"host": ...}``:
            the workers of this process's host).
        group_leader: the TensorFlow task that leads collective groups, when
            the process runs a server for collectives.
        arrival_spin: ``None``: the ``mpi`` backend's calls are blocking collectives;
            seconds: each first waits for every member asleep after this long awake
            (:mod:`parallax.comm.arrival`; :func:`parallax.member.roles.arrival_spin` decides).
        native_ops: the ``mpi`` backend's all-reduces become the compiled op where it is available
            (``PARALLAX_NATIVE_OPS``; :mod:`parallax.comm.native`).
        huge_pages: the compiled op's large buffers ask for huge pages (``PARALLAX_HUGE_PAGES``).
        cache_root: where the compiled op is kept (``PARALLAX_CACHE_DIR``; ``None``: the default cache).
        num_workers: the job's workers (0: not said); where ``workers`` is ``None`` the ``mpi`` backend's calls
            use ``MPI.COMM_WORLD``, which must hold that many.
    """

    workers: Any = None
    groups: dict[str, Any] = field(default_factory=dict)
    group_leader: str | None = None
    arrival_spin: float | None = None
    native_ops: bool = True
    huge_pages: bool = True
    cache_root: str | None = None
    num_workers: int = 0


@dataclass(frozen=True)
class Prepared:
    """A graph made ready for this process, and what to call when its session closes."""

    graph_def: graph_pb2.GraphDef
    release: Callable[[], None] = lambda: None


class Backend(ABC):
    """Cross-worker communication for one rewrite.

    Args:
        spec: the plan's communication settings.
        num_workers: how many worker processes take part.
    """

    name: ClassVar[str] = "base"
    #: Whether the worker processes must run TensorFlow servers in one cluster.
    needs_server: ClassVar[bool] = False
    #: Whether it can communicate within a named group of the workers (``"host"``).
    supports_groups: ClassVar[bool] = False
    #: Whether it implements :meth:`reduce_scatter_sum` and :meth:`allgather_shards` (ZeRO).
    supports_shards: ClassVar[bool] = False
    #: Whether it sums among the workers alone while other ranks serve a pipeline's stages (it takes the
    #: workers' communicator, ``ProcessComms.workers``, and no cluster-wide TensorFlow group).
    supports_stage_servers: ClassVar[bool] = False
    #: The 16-bit formats its all-reduce and all-gather can carry (``CommunicationConfig.compression``).
    wire_formats: ClassVar[tuple[str, ...]] = ("fp16", "bf16")

    def __init__(self, spec: CommSpec, num_workers: int, group: str = "") -> None:
        self.spec = spec
        self.num_workers = num_workers
        self.group = group
        self._last: tf.Operation | None = None

    # -- rewrite time (inside a scratch graph) ---------------------------- #
    @abstractmethod
    def allreduce_sum(self, tensors: list[tf.Tensor]) -> list[tf.Tensor]:
        """Sum each tensor over the workers; outputs in input order."""

    @abstractmethod
    def allgather(self, pairs: list[tuple[tf.Tensor, tf.Tensor]]) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """Concatenate each ``(values, indices)`` pair over the workers, worker 0 first."""

    def gather(self, pairs: list[tuple[tf.Tensor, tf.Tensor]]) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """As :meth:`allgather`, but only the group's first member needs the result: the others
        may get anything (this default all-gathers; a backend that can, sends to the first only)."""
        return self.allgather(pairs)

    def reduce_scatter_sum(self, tensors: list[tf.Tensor]) -> list[tf.Tensor]:
        """Sum each 1-D tensor over the workers and give each worker its part: with ``n`` elements and
        ``m = ceil(n / workers)``, worker ``k`` gets elements ``[k m, (k+1) m)`` of the sum, padded
        with zeros to ``m`` (sharded optimizer states, ZeRO stage 2)."""
        raise NotImplementedError(NO_SHARDS.format(self.name))

    def allgather_shards(self, shards: list[tf.Tensor], lengths: list[int]) -> list[tf.Tensor]:
        """Each worker's parts (``shards``, as :meth:`reduce_scatter_sum` cuts a tensor of ``lengths``
        elements) put together, in worker order: the whole 1-D tensors (sharded optimizer states)."""
        raise NotImplementedError(NO_SHARDS.format(self.name))

    def allgather_parts(self, parts: list[tf.Tensor], lengths: list[int], workers: int) -> list[tf.Tensor]:
        """Every worker's ``parts`` (each padded to ``ceil(length / workers)`` elements of its ``lengths``),
        put together as :meth:`allgather_shards` does, in one call per dtype: each worker's parts side by side in
        one buffer, the buffers gathered, each tensor's column of them read back in worker order (one collective
        in place of one per tensor: each call costs milliseconds)."""
        out: list[tf.Tensor | None] = [None] * len(parts)
        groups: dict[tf.DType, list[int]] = {}
        for i, t in enumerate(parts):
            groups.setdefault(t.dtype, []).append(i)
        for k, members in enumerate(groups.values()):
            sizes = [int(parts[i].shape[0]) for i in members]
            buffer = tf.concat([parts[i] for i in members], 0, name=f"buffer_{k}") if len(members) > 1 \
                else parts[members[0]]
            rows = tf.reshape(self.allgather_shards([buffer], [workers * sum(sizes)])[0], [workers, sum(sizes)])
            begin = 0
            for i, size in zip(members, sizes):
                out[i] = tf.reshape(rows[:, begin:begin + size], [-1])[:lengths[i]]
                begin += size
        return out

    def finalize_nodes(self, nodes: list) -> None:  # noqa: B027 - optional hook
        """Adjust the NodeDefs built in the scratch graph (default: nothing)."""

    def follow(self, other: Backend) -> None:
        """Issue this backend's communication after ``other``'s (one order of calls per process)."""
        self._last = other._last

    def _chained(self, build):
        """Build ops that run after the previous communication op of this backend."""
        deps = [self._last] if self._last is not None else []
        with tf.control_dependencies(deps):
            outputs = build()
        first = outputs[0] if isinstance(outputs, (list, tuple)) else outputs
        self._last = first.op
        return outputs

    # -- run time (in each worker process) -------------------------------- #
    @classmethod  # noqa: B027 - optional hook
    def configure_session(cls, config: config_pb2.ConfigProto, comms: ProcessComms) -> None:
        """Add what this backend's ops need to the session's config (default: nothing)."""

    @classmethod
    def prepare(cls, graph_def: graph_pb2.GraphDef, comms: ProcessComms) -> Prepared:
        """Make ``graph_def`` runnable in this process (default: as it is)."""
        return Prepared(graph_def)
