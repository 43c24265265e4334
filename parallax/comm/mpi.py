"""The ``mpi`` backend: mpi4py ``Allreduce``/``Allgatherv`` called from the graph.

Ops added (under the caller's name scope):

* ``allreduce_<k>``: one ``PyFunc`` per fusion buffer: the dense gradients of
  the call, in its order, in buckets of at most ``fusion_bytes`` (per dtype),
  each gradient a buffer of its own. Each buffer passes :func:`_owned` (a
  ``Snapshot``, which hands over the buffer when nothing else holds it, the
  usual case, and copies it otherwise: a constant, a variable's value, a
  tensor other ops still read; the compiled op, which does the same itself,
  goes without it: :func:`parallax.comm.mpi_lowering._skip_owned`). The call sums the buffers under
  ``FUSE_BELOW_BYTES`` together, in one buffer (:func:`parallax.comm.mpi_calls.fused_layout`), and
  every other one in place, with ``Allreduce(MPI.IN_PLACE, ...)`` on pieces
  of at most ``CHUNK_BYTES``, and returns them, which TensorFlow takes back
  without a copy. No large gradient is copied: concatenating 64 MB cost more
  than summing them (docs/benchmarks.md);
* the sparse gradients of a call, all in one ``PyFunc`` (:func:`parallax.comm.mpi_calls.packed_layout`: each
  rank's values and indices put in one buffer, 8-byte aligned, moved as bytes, so a
  16-bit format needs no MPI type): first an ``Allgather`` of every rank's row counts,
  then one collective of the buffers. With ``MPIConfig.use_allgatherv``,
  ``allgatherv``: ``Allgatherv`` (each rank sends its own rows); without it (the
  default, as NCCL's all-gather would), ``allgather``: ``Allgather`` of the buffers
  padded to the longest, the padding then dropped. Two rounds of messages per call
  whatever the number of sparse gradients, where a call per gradient took three each
  (docs/benchmarks.md: 3 ranks on 2 cores spend more on each round than on its bytes);
* the sparse gradients gathered to the group's first member (:meth:`MPIBackend.gather`,
  the host aggregation of HYBRID), ``gatherv``: the same, with ``Gather`` and ``Gatherv``
  to that member, whose output has every member's rows; the others' outputs have none.
  Each member sends its rows once, where an all-gather would send them to every member.

Every ``PyFunc`` has a control dependency on the one before it, so each
worker issues the same MPI calls in the same order (unordered calls on one
communicator give silently wrong sums). The graph names the Python function
by a fixed token (``parallax_comm:mpi_allreduce`` ...); each process binds the
token to its function with :func:`parallax.comm.mpi_binding.bind_py_functions` before importing the graph.

A backend built for a ``group`` other than the default (``"host"``: the
workers of one host) suffixes its tokens with ``@<group>``; each process binds
them to its communicator for that group (:meth:`MPIBackend.prepare`, when its
session starts; the bindings are released when the session closes).

This module builds the ops (the backend the rewrite calls); what they do at run time is
:mod:`parallax.comm.mpi_calls`, how a process binds them :mod:`parallax.comm.mpi_binding`, and how
its all-reduces become the compiled op :mod:`parallax.comm.mpi_lowering`.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from parallax.comm.base import Backend, Prepared, ProcessComms
from parallax.comm.mpi_binding import bind_py_functions

# `noqa: F401`: some names (CHUNK_BYTES, fused_layout, HUGE_PAGE_BYTES, _lower, ...) are imported only so that
# every name this module had before it was split stays importable from parallax.comm.mpi (tests import them).
from parallax.comm.mpi_calls import (  # noqa: F401
    _ALLGATHER,
    _ALLGATHER_SHARDS,
    _ALLGATHERV,
    _ALLREDUCE,
    _GATHERV,
    _REDUCE_SCATTER,
    CHUNK_BYTES,
    FUSE_ALIGN,
    FUSE_BELOW_BYTES,
    TOKEN_PREFIX,
    _group_suffix,
    fused_layout,
    packed_layout,
)
from parallax.comm.mpi_lowering import HUGE_PAGE_BYTES, _lower, _native_for, _skip_owned  # noqa: F401
from parallax.errors import PlanError
from parallax.plan.model import part_sizes

__all__ = ["MPIBackend", "bind_py_functions", "import_bound", "TOKEN_PREFIX"]

_TRANSPORT_DTYPES = (tf.float32, tf.float64, tf.int32, tf.int64, tf.float16, tf.bfloat16)


def _transport(dtype: tf.DType) -> tf.DType:
    """The dtype a tensor travels in (MPI sums these; others go as float32)."""
    return dtype if dtype in _TRANSPORT_DTYPES else tf.float32


def _owned(tensor: tf.Tensor, name: str) -> tf.Tensor:
    """``tensor`` in a buffer nobody else holds, which the all-reduce may sum in place.

    ``Snapshot`` hands the buffer over when its reference is the only one (a gradient consumed
    once, the usual case) and copies it otherwise: a constant's, a variable's, one other ops
    still read. Before it, ``DebugIdentityV2`` (stateful, a pass-through when it has no
    ``debug_urls``) keeps Grappler from folding a constant gradient's ``Snapshot`` into a
    ``Const`` or merging two equal ones, either of which would hand the call one buffer twice.
    """
    with tf.name_scope(name):
        kept = tf.raw_ops.DebugIdentityV2(input=tensor, op_name=name, tfdbg_context_id=name)
        return tf.raw_ops.Snapshot(input=kept)


def _unbound(*args):  # placeholder body; replaced per process by bind_py_functions
    raise RuntimeError("Parallax MPI op ran before bind_py_functions()")


def _py_func(inputs: list[tf.Tensor], out_dtypes: list[tf.DType], token: str, name: str,
             tokens: dict[str, str]):
    outputs = tf.numpy_function(_unbound, inputs, out_dtypes, stateful=True, name=name)
    op = (outputs[0] if isinstance(outputs, (list, tuple)) else outputs).op
    tokens[op.get_attr("token").decode()] = token  # scratch-graph token -> our fixed token
    return outputs


class MPIBackend(Backend):
    """mpi4py inside the graph, fused and ordered (see the module docstring)."""

    name = "mpi"
    supports_groups = True
    supports_shards = True
    supports_stage_servers = True

    def __init__(self, spec, num_workers, group: str = ""):
        super().__init__(spec, num_workers, group)
        self._tokens: dict[str, str] = {}
        self._suffix = _group_suffix(group)

    @classmethod
    def prepare(cls, graph_def: graph_pb2.GraphDef, comms: ProcessComms) -> Prepared:
        """Bind the graph's MPI ops to this process's communicators (:func:`bind_py_functions`).

        Raises:
            PlanError: the calls would fall back to ``MPI.COMM_WORLD`` where it holds fewer processes than the job
                has workers (a task a cluster manager started, ``TF_CONFIG``: a world of one, whose sums would
                silently be this worker's own).
        """
        if comms.workers is None and comms.num_workers > 1:
            from mpi4py import MPI

            if MPI.COMM_WORLD.Get_size() < comms.num_workers:
                raise PlanError(
                    f"the plan sums values over the job's {comms.num_workers} workers with MPI (a synchronised batch "
                    "norm's statistics, or gradients all-reduced beside parameter servers), but this process is "
                    f"not one of an MPI job: its MPI world has {MPI.COMM_WORLD.Get_size()} process(es) (a task a "
                    "cluster manager started, TF_CONFIG); in such a job use run_option='MPI' (workers only, "
                    "TensorFlow's collectives), or launch the job with parallax-run")
        bound, release = bind_py_functions(graph_def, comm=comms.workers, groups=comms.groups,
                                           native_ops=comms.native_ops, spin=comms.arrival_spin,
                                           huge_pages=comms.huge_pages, cache_root=comms.cache_root)
        return Prepared(bound, release)

    def finalize_nodes(self, nodes) -> None:
        """Replace the scratch graph's PyFunc tokens by the fixed Parallax tokens."""
        for node in nodes:
            if node.op in ("PyFunc", "PyFuncStateless"):
                token = node.attr["token"].s.decode()
                if token in self._tokens:
                    node.attr["token"].s = (self._tokens[token] + self._suffix).encode()

    def allreduce_sum(self, tensors: list[tf.Tensor]) -> list[tf.Tensor]:
        outputs: list[tf.Tensor | None] = [None] * len(tensors)
        for k, bucket in enumerate(self._buckets(tensors)):
            members = [tensors[i] for i in bucket]
            transport = _transport(members[0].dtype)
            # each gradient its own buffer: the call itself sums the small ones together (fused_layout)
            owned = [_owned(tf.cast(t, transport), f"own_{k}_{n}") for n, t in enumerate(members)]
            summed = self._chained(lambda owned=owned, k=k: _py_func(
                owned, [o.dtype for o in owned], _ALLREDUCE, f"allreduce_{k}", self._tokens))
            for j, total in enumerate(summed):
                total.set_shape(members[j].shape)
                outputs[bucket[j]] = tf.cast(total, members[j].dtype)
        return outputs  # type: ignore[return-value]

    def reduce_scatter_sum(self, tensors: list[tf.Tensor]) -> list[tf.Tensor]:
        outputs = []
        for k, tensor in enumerate(tensors):  # one call each: no buffer of all of them is ever made
            t = tf.cast(tensor, _transport(tensor.dtype))
            part = self._chained(lambda t=t, k=k: _py_func([t], [t.dtype], _REDUCE_SCATTER, f"reducescatter_{k}",
                                                           self._tokens))
            part = part[0] if isinstance(part, (list, tuple)) else part
            part.set_shape([part_sizes(_length(tensor), self.num_workers)[0]])
            outputs.append(tf.cast(part, tensor.dtype))
        return outputs

    def allgather_shards(self, shards: list[tf.Tensor], lengths: list[int]) -> list[tf.Tensor]:
        outputs = []
        for k, (shard, length) in enumerate(zip(shards, lengths)):
            t = tf.cast(shard, _transport(shard.dtype))
            whole = self._chained(lambda t=t, k=k, length=length: _py_func(
                [t, tf.constant(length, tf.int64)], [t.dtype], _ALLGATHER_SHARDS, f"allgather_shards_{k}",
                self._tokens))
            whole = whole[0] if isinstance(whole, (list, tuple)) else whole
            whole.set_shape([length])
            outputs.append(tf.cast(whole, shard.dtype))
        return outputs

    def _buckets(self, tensors: list[tf.Tensor]) -> list[list[int]]:
        """Indices of ``tensors`` in fusion buckets: in order, per transport dtype, each at most
        ``fusion_bytes`` (a bigger tensor has a bucket of its own)."""
        buckets: list[list[int]] = []
        sizes: dict[int, int] = {}
        current: dict[tf.DType, list[int]] = {}
        for i, t in enumerate(tensors):
            dtype = _transport(t.dtype)
            nbytes = dtype.size * max(1, t.shape.num_elements() or 1)
            bucket = current.get(dtype)
            if bucket is None or sizes[id(bucket)] + nbytes > self.spec.fusion_bytes:
                bucket = []
                buckets.append(bucket)
                current[dtype] = bucket
                sizes[id(bucket)] = 0
            bucket.append(i)
            sizes[id(bucket)] += nbytes
        return buckets

    def allgather(self, pairs):
        if self.spec.use_allgatherv:
            return self._sparse_calls(pairs, _ALLGATHERV, "allgatherv")
        return self._sparse_calls(pairs, _ALLGATHER, "allgather")

    def gather(self, pairs):
        return self._sparse_calls(pairs, _GATHERV, "gatherv")

    def _sparse_calls(self, pairs, token: str, name: str):
        """One chained call of ``token`` for every ``(values, indices)`` pair: ``(values, indices)`` back."""
        if not pairs:
            return []
        sent = [t for values, indices in pairs for t in (tf.cast(values, _transport(values.dtype)), indices)]
        gathered = self._chained(lambda: _py_func(sent, [t.dtype for t in sent], token, name, self._tokens))
        results = []
        for (values, _), all_values, all_indices in zip(pairs, gathered[0::2], gathered[1::2]):
            if values.shape.rank is None:
                all_values = tf.reshape(all_values, tf.concat([[-1], tf.shape(values)[1:]], 0))
            else:
                all_values.set_shape([None, *values.shape[1:]])
            all_indices.set_shape([None])
            results.append((tf.cast(all_values, values.dtype), all_indices))
        return results


def _length(tensor: tf.Tensor) -> int:
    n = tensor.shape.num_elements()
    if n is None:
        raise ValueError(f"a sharded tensor needs a static length, {tensor.name} has shape {tensor.shape}")
    return n


def import_bound(graph: tf.Graph, backend: MPIBackend, comm=None, native_ops: bool = True,
                 spin: float | None = None, cache_root: str | None = None, huge_pages: bool = True
                 ) -> tuple[tf.Graph, Callable[[], None]]:
    """A copy of ``graph``, in which ``backend`` built its ops, with those ops bound to this process
    (what a worker's start-up does, for one graph: benchmarks, tests), and what releases them
    (``native_ops``, ``huge_pages``, ``cache_root``: the compiled op's, as :func:`bind_py_functions` takes them)."""
    graph_def = graph.as_graph_def()
    backend.finalize_nodes(graph_def.node)
    graph_def, release = bind_py_functions(graph_def, comm=comm, native_ops=native_ops, spin=spin,
                                           huge_pages=huge_pages, cache_root=cache_root)
    bound = tf.Graph()
    with bound.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return bound, release
