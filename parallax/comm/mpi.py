"""The ``mpi`` backend: mpi4py ``Allreduce``/``Allgatherv`` called from the graph.

Ops added (under the caller's name scope):

* ``allreduce_<k>``: one ``PyFunc`` per fusion buffer: the dense gradients of
  the call, in its order, in buckets of at most ``fusion_bytes`` (per dtype),
  each gradient a buffer of its own. Each buffer passes :func:`_owned` (a
  ``Snapshot``, which hands over the buffer when nothing else holds it, the
  usual case, and copies it otherwise: a constant, a variable's value, a
  tensor other ops still read; the compiled op, which does the same itself,
  goes without it: :func:`_skip_owned`). The call sums the buffers under
  ``FUSE_BELOW_BYTES`` together, in one buffer (:func:`fused_layout`), and
  every other one in place, with ``Allreduce(MPI.IN_PLACE, ...)`` on pieces
  of at most ``CHUNK_BYTES``, and returns them, which TensorFlow takes back
  without a copy. No large gradient is copied: concatenating 64 MB cost more
  than summing them (docs/benchmarks.md);
* the sparse gradients of a call, all in one ``PyFunc`` (:func:`packed_layout`: each
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
token to its function with :func:`bind_py_functions` before importing the graph.

A backend built for a ``group`` other than the default (``"host"``: the
workers of one host) suffixes its tokens with ``@<group>``; each process binds
them to its communicator for that group (:meth:`MPIBackend.prepare`, when its
session starts; the bindings are released when the session closes).
"""

from __future__ import annotations

import ctypes
import itertools
import os
from collections import Counter
from collections.abc import Callable

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from parallax.comm.arrival import FIRST_NAP_SECONDS, LONGEST_NAP_SECONDS, arrive
from parallax.comm.base import Backend, Prepared, ProcessComms
from parallax.invocation import current
from parallax.plan.model import part_sizes

__all__ = ["MPIBackend", "bind_py_functions", "import_bound", "TOKEN_PREFIX"]

TOKEN_PREFIX = "parallax_comm:"
_ALLREDUCE = TOKEN_PREFIX + "mpi_allreduce"
_ALLGATHERV = TOKEN_PREFIX + "mpi_allgatherv"
_ALLGATHER = TOKEN_PREFIX + "mpi_allgather"
_GATHERV = TOKEN_PREFIX + "mpi_gatherv"
_REDUCE_SCATTER = TOKEN_PREFIX + "mpi_reduce_scatter"
_ALLGATHER_SHARDS = TOKEN_PREFIX + "mpi_allgather_shards"
_TRANSPORT_DTYPES = (tf.float32, tf.float64, tf.int32, tf.int64, tf.float16, tf.bfloat16)
#: Buffers are summed in pieces of at most this many bytes: Open MPI sums 64 MiB in 2 or 4 MiB pieces in a
#: third to half the time of one call, and 16 MiB in 2 MiB pieces 10-20 % faster than in 4 MiB ones (on 2
#: ranks of one host, where a piece, its peer's and Open MPI's temporary all stay in the L3 cache;
#: docs/benchmarks.md); a piece costs one latency.
CHUNK_BYTES = 2 * 1024 * 1024
#: The compiled op asks for 2 MiB pages for buffers of at least this size (numpy's threshold for the
#: same advice); ``PARALLAX_HUGE_PAGES=0`` turns it off (parallax/comm/allreduce.cc says why).
HUGE_PAGE_BYTES = 4 * 1024 * 1024
#: Buffers of an all-reduce call under this size are summed together, in one MPI call over one
#: buffer (:func:`fused_layout`): a call costs a fixed ~15-30 us on one host, about what copying
#: 1 MiB costs (docs/benchmarks.md).
FUSE_BELOW_BYTES = 1024 * 1024
#: Alignment of each buffer in a fused one: TensorFlow's (``Allocator::kAllocatorAlignment``), so
#: that each piece of the fused buffer can be a tensor of its own.
FUSE_ALIGN = 64
_BINDINGS = itertools.count()


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
        """Bind the graph's MPI ops to this process's communicators (:func:`bind_py_functions`)."""
        bound, release = bind_py_functions(graph_def, comm=comms.workers, groups=comms.groups,
                                           spin=comms.arrival_spin)
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


# --------------------------------------------------------------------------- #
# Run time
# --------------------------------------------------------------------------- #

_SIXTEEN_BIT_FLOATS = ("float16", "bfloat16")
_SIXTEEN_BIT_SUMS: dict[str, object] = {}


def _words(array: np.ndarray) -> np.ndarray:
    """``array`` as MPI is handed it: a 16-bit float one (float16, bfloat16) as 16-bit words, which MPI
    moves as they are (it has no type for them); any other as it is."""
    return array.view(np.uint16) if array.dtype.name in _SIXTEEN_BIT_FLOATS else array


def _sum_op(dtype: np.dtype):
    """The MPI operation that sums arrays of ``dtype``: ``MPI.SUM``, or for a 16-bit float (carried as
    :func:`_words`) one of ours that adds in float32 and rounds to the format, as the compiled op's does."""
    from mpi4py import MPI

    if dtype.name not in _SIXTEEN_BIT_FLOATS:
        return MPI.SUM
    if dtype.name not in _SIXTEEN_BIT_SUMS:
        def add(incoming, inout, _datatype, dtype=dtype) -> None:
            a = np.frombuffer(incoming, dtype)
            b = np.frombuffer(inout, dtype)
            b[...] = (a.astype(np.float32) + b.astype(np.float32)).astype(dtype)

        _SIXTEEN_BIT_SUMS[dtype.name] = MPI.Op.Create(add, commute=True)
    return _SIXTEEN_BIT_SUMS[dtype.name]


def _functions(comm, spin: float | None = None):
    """The Python functions of the graph's MPI ops, over ``comm``; with ``spin``, each first waits for
    every member asleep (:func:`parallax.comm.arrival.arrive`)."""
    from mpi4py import MPI

    def sum_in_place(target: np.ndarray) -> None:
        op = _sum_op(target.dtype)
        words = _words(target)
        step = max(1, CHUNK_BYTES // target.itemsize)
        for at in range(0, target.size, step):
            comm.Allreduce(MPI.IN_PLACE, words[at:at + step], op=op)

    def allreduce(*buffers):
        """Sum each buffer over the workers in place (each is ours alone: see :func:`_owned`); the small
        ones together, in one buffer laid out as :func:`fused_layout` says (the compiled op's calls)."""
        arrive(comm, spin)
        arrays = [np.asarray(b) for b in buffers]
        fused, offsets, total = fused_layout([(a.nbytes, a.dtype) for a in arrays])
        summed: list = list(buffers)
        if fused:
            joint = np.zeros(total, np.uint8)
            for i, at in zip(fused, offsets):
                joint[at:at + arrays[i].nbytes] = arrays[i].reshape(-1).view(np.uint8)
            sum_in_place(joint.view(arrays[fused[0]].dtype))
            for i, at in zip(fused, offsets):
                summed[i] = joint[at:at + arrays[i].nbytes].view(arrays[i].dtype).reshape(arrays[i].shape)
        together = set(fused)
        for i, buffer in enumerate(buffers):
            if i in together:
                continue
            if not isinstance(buffer, np.ndarray) or buffer.ndim == 0:
                # a scalar arrives as a numpy scalar, a copy of TensorFlow's: sum a new array
                scalar = np.array(buffer, ndmin=1)
                comm.Allreduce(MPI.IN_PLACE, _words(scalar), op=_sum_op(scalar.dtype))
                summed[i] = scalar.reshape(())
            elif buffer.size:
                sum_in_place(_writable(buffer))  # now summed: TensorFlow takes it back without a copy
        return summed

    def packed(arrays, to: str):
        """Every member's ``(values, indices)`` pairs (``arrays``: values, indices, values, ...), each pair's
        rows concatenated in member order, in two rounds (:func:`packed_layout`): ``to`` ``"all"``
        (``Allgatherv``), ``"padded"`` (``Allgather`` of buffers padded to the longest) or ``"first"``
        (``Gatherv`` to the first member; the others get no rows back)."""
        arrive(comm, spin)
        pairs = [(np.require(v, requirements="C"), np.require(i, requirements="C"))
                 for v, i in zip(arrays[0::2], arrays[1::2])]
        rows = np.array([v.shape[0] for v, _ in pairs], np.int64)
        widths = [(v.itemsize * int(np.prod(v.shape[1:], dtype=np.int64)), i.itemsize) for v, i in pairs]
        counts = np.empty((comm.size, len(pairs)), np.int64)
        first = to == "first"
        if first:
            comm.Gather(rows, counts, root=0)
        else:
            comm.Allgather(rows, counts)
        offsets, words = packed_layout(counts if not first or comm.rank == 0 else rows[None], widths)
        mine = 0 if first and comm.rank else comm.rank
        send = np.zeros(max(words) if to == "padded" else words[mine], np.uint64)
        view = send.view(np.uint8)
        for (v, i), (at_v, at_i) in zip(pairs, offsets[mine]):
            view[at_v:at_v + v.nbytes] = v.reshape(-1).view(np.uint8)
            view[at_i:at_i + i.nbytes] = i.reshape(-1).view(np.uint8)
        if first and comm.rank:
            comm.Gatherv(send, None, root=0)
            return [a for v, i in pairs for a in (v[:0], i[:0])]
        if to == "padded":
            received = np.empty(comm.size * len(send), np.uint64)
            comm.Allgather(send, received)
            starts = [r * len(send) for r in range(comm.size)]
        else:
            received = np.empty(sum(words), np.uint64)
            if first:
                comm.Gatherv(send, [received, words], root=0)
            else:
                comm.Allgatherv(send, [received, words])
            starts = np.concatenate([[0], np.cumsum(words)[:-1]]).astype(int).tolist()
        data = received.view(np.uint8)
        out = []
        for k, (v, i) in enumerate(pairs):
            parts_v, parts_i = [], []
            for r, start in enumerate(starts):
                n = int(counts[r, k])
                at_v, at_i = (start * 8 + at for at in offsets[r][k])
                parts_v.append(data[at_v:at_v + n * widths[k][0]].view(v.dtype).reshape((n, *v.shape[1:])))
                parts_i.append(data[at_i:at_i + n * widths[k][1]].view(i.dtype))
            out += [np.concatenate(parts_v), np.concatenate(parts_i)]
        return out

    def reduce_scatter(buffer):
        """This worker's part of the sum of ``buffer``, padded with zeros to ``ceil(len / size)``."""
        send = np.ascontiguousarray(buffer).reshape(-1)
        counts = part_sizes(send.size, comm.size)
        part = np.zeros(counts[0], dtype=send.dtype)
        comm.Reduce_scatter(send, [part, counts[comm.rank]], recvcounts=counts, op=MPI.SUM)
        return part

    def allgather_shards(shard, length):
        """Every worker's part (``shard``, padded), worker 0's first: the first ``length`` elements."""
        counts = part_sizes(int(length), comm.size)
        send = np.ascontiguousarray(shard)[:counts[comm.rank]]
        whole = np.empty(int(length), dtype=send.dtype)
        comm.Allgatherv(send, [whole, counts])
        return whole

    return {_ALLREDUCE: allreduce, _ALLGATHERV: lambda *a: packed(a, "all"),
            _ALLGATHER: lambda *a: packed(a, "padded"), _GATHERV: lambda *a: packed(a, "first"),
            _REDUCE_SCATTER: reduce_scatter, _ALLGATHER_SHARDS: allgather_shards}


def packed_layout(counts: np.ndarray, widths: list[tuple[int, int]]) -> tuple[list[list[tuple[int, int]]], list[int]]:
    """Where each member's sparse rows lie in its buffer of :meth:`MPIBackend.allgather`'s one call.

    Args:
        counts: ``[members, pairs]`` row counts.
        widths: each pair's bytes per row of values and per index.

    Returns:
        ``(offsets, words)``: per member, each pair's ``(values, indices)`` byte offsets, every piece
        starting at a multiple of 8 bytes; and each member's buffer length in 8-byte words.

    >>> packed_layout(np.array([[2, 0], [1, 3]]), [(12, 8), (4, 4)])
    ([[(0, 24), (40, 40)], [(0, 16), (24, 40)]], [5, 7])
    """
    offsets, words = [], []
    for member in counts:
        at, mine = 0, []
        for n, (row, index) in zip(member.tolist(), widths):
            values_at = at
            at += -(-n * row // 8) * 8
            mine.append((values_at, at))
            at += -(-n * index // 8) * 8
        offsets.append(mine)
        words.append(at // 8)
    return offsets, words


def fused_layout(buffers: list[tuple[int, object]]) -> tuple[list[int], list[int], int]:
    """Which of an all-reduce call's buffers (``(nbytes, dtype)`` each) are summed together, and where.

    Those under :data:`FUSE_BELOW_BYTES` (not empty) of the first one's dtype, when there are two or
    more, in order, each at an offset rounded up to :data:`FUSE_ALIGN` bytes: ``(indices, offsets,
    total bytes)``; none otherwise. The ``PyFunc`` and the compiled op both follow it, so processes
    with and without the op issue the same MPI calls: the fused buffer first, then the others in order.
    """
    fused: list[int] = []
    for i, (nbytes, dtype) in enumerate(buffers):
        if 0 < nbytes < FUSE_BELOW_BYTES and (not fused or np.dtype(dtype) == np.dtype(buffers[fused[0]][1])):
            fused.append(i)
    if len(fused) < 2:
        return [], [], 0
    offsets, total = [], 0
    for i in fused:
        offsets.append(total)
        total = -(-(total + int(buffers[i][0])) // FUSE_ALIGN) * FUSE_ALIGN
    return fused, offsets, total


def _writable(buffer: np.ndarray) -> np.ndarray:
    """A flat, writable view of a ``PyFunc`` input (numpy marks TensorFlow's buffer read-only).

    The input is TensorFlow's own buffer, not a copy (``PyFunc`` aliases its inputs), and the
    graph's ``Snapshot`` made it this call's alone. The view does not keep it alive: the call's
    arguments do, until it returns.
    """
    if not buffer.flags.c_contiguous:
        raise RuntimeError("Parallax: a gradient buffer handed to MPI is not contiguous")
    raw = (ctypes.c_char * buffer.nbytes).from_address(buffer.ctypes.data)
    return np.frombuffer(raw, dtype=buffer.dtype)


def _py_func_registry():
    """TensorFlow's registry of ``numpy_function`` bodies (private API: checked, not assumed)."""
    from tensorflow.python.ops import script_ops

    registry = getattr(script_ops, "_py_funcs", None)
    if registry is None or not hasattr(registry, "insert") or not hasattr(registry, "remove"):
        raise RuntimeError(
            f"Parallax's mpi backend needs TensorFlow's numpy_function registry (script_ops._py_funcs with "
            f"insert/remove), which TensorFlow {tf.__version__} does not have; use MPIConfig(backend='collective') "
            "or a TensorFlow version Parallax supports (see setup.py)")
    return registry


def bind_py_functions(graph_def: graph_pb2.GraphDef, comm=None, groups: dict | None = None,
                      native_ops: bool = True, spin: float | None = None
                      ) -> tuple[graph_pb2.GraphDef, Callable[[], None]]:
    """Point the graph's Parallax MPI ops at this process's functions.

    Registers one set of functions per communicator in TensorFlow's
    ``numpy_function`` registry and returns a copy of ``graph_def`` whose
    ``PyFunc`` nodes use the registry's tokens, with a function that removes
    them again (the registry holds functions weakly: the returned function
    keeps them alive until it is called). The dense all-reduces become the
    compiled op of :mod:`parallax.comm.native` where it is available.

    Args:
        graph_def: a rewritten graph.
        comm: the mpi4py communicator of the default group (``COMM_WORLD``
            when ``None``); the functions use a duplicate of each communicator.
        groups: communicators of named groups (``{"host": ...}``).
        native_ops: ``False`` keeps the all-reduces in Python (benchmarks compare the two).
        spin: ``None``: the calls are the collectives alone; seconds: each call first waits for
            every member asleep, after this long awake (:mod:`parallax.comm.arrival`). The members
            of each communicator agree here on the longest spin any of them asked for (an
            ``Allreduce``; so all make the same calls even when their hosts decide differently).

    Returns:
        ``(bound graph_def, release)``.
    """
    registry = _py_func_registry()
    native = _native_for(graph_def) if native_ops else None
    bound: dict[str, tuple[str, Callable]] = {}
    lowered: dict[str, str] = {}  # all-reduce token -> the compiled op's communicator key
    kept = []
    for group, group_comm in {"": comm, **(groups or {})}.items():
        if group_comm is None:
            from mpi4py import MPI

            group_comm = MPI.COMM_WORLD
        own = group_comm.Dup()
        kept.append(own)
        agreed = _agreed_spin(own, spin)
        for key, fn in _functions(own, agreed).items():
            bound[key + _group_suffix(group)] = (registry.insert(fn), fn)
        if native is not None:
            lowered[_ALLREDUCE + _group_suffix(group)] = key = f"{os.getpid()}.{next(_BINDINGS)}{_group_suffix(group)}"
            native.register(key, own, agreed, FIRST_NAP_SECONDS, LONGEST_NAP_SECONDS)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.op in ("PyFunc", "PyFuncStateless"):
            token = node.attr["token"].s.decode()
            if token in lowered:
                _lower(node, lowered[token])
            elif token.startswith(TOKEN_PREFIX):
                if token not in bound:
                    raise RuntimeError(f"no Parallax MPI function for token {token!r} (groups bound: "
                                       f"{sorted(groups or {})})")
                node.attr["token"].s = bound[token][0].encode()
    if lowered:
        _skip_owned(out)

    def release() -> None:
        for token, _ in bound.values():
            registry.remove(token)
        bound.clear()
        for key in lowered.values():
            native.unregister(key)
        lowered.clear()
        kept.clear()

    return out, release


def _agreed_spin(comm, spin: float | None) -> float | None:
    """The longest ``spin`` any member of ``comm`` asked for (``None``: none asked for one)."""
    from mpi4py import MPI

    longest = comm.allreduce(-1.0 if spin is None else float(spin), op=MPI.MAX)
    return None if longest < 0 else longest


def _native_for(graph_def: graph_pb2.GraphDef):
    """The compiled all-reduce op (:mod:`parallax.comm.native`) when the graph has an all-reduce to lower
    and the op is available here, else ``None``."""
    if not any(node.op == "PyFunc" and node.attr["token"].s.decode().split("@")[0] == _ALLREDUCE
               for node in graph_def.node):
        return None
    from parallax.comm.native import native_ops

    return native_ops()


def _lower(node, comm_key: str) -> None:
    """Turn an all-reduce ``PyFunc`` node into the compiled op's: same inputs, outputs and MPI calls."""
    from parallax.comm.native import OP_NAME

    types = list(node.attr["Tin"].list.type)
    for name in ("Tin", "Tout", "token"):
        del node.attr[name]
    node.op = OP_NAME
    node.attr["T"].list.type.extend(types)
    node.attr["comm"].s = comm_key.encode()
    node.attr["chunk_bytes"].i = CHUNK_BYTES
    node.attr["huge_page_bytes"].i = HUGE_PAGE_BYTES if (current().huge_pages or "1") != "0" else 0
    node.attr["fuse_below"].i = FUSE_BELOW_BYTES


def _skip_owned(graph_def: graph_pb2.GraphDef) -> None:
    """Let each compiled all-reduce read its gradients directly, without :func:`_owned`'s two ops.

    The compiled op does what the ``Snapshot`` did (it sums a buffer in place only when its
    reference is the only one, else a copy), and Grappler folds or merges neither it nor its
    inputs, so the ``DebugIdentityV2`` has nothing to guard: both are dropped (~10 us a tensor).
    """
    from parallax.comm.native import OP_NAME

    nodes = {node.name: node for node in graph_def.node}
    readers = Counter(_producer(name) for node in graph_def.node for name in node.input)

    def owned_pair(name: str):
        """``(Snapshot, DebugIdentityV2)`` when ``name`` is :func:`_owned`'s output and nothing else reads
        either, else ``None``."""
        snapshot = nodes.get(_producer(name))
        if snapshot is None or snapshot.op != "Snapshot" or len(snapshot.input) != 1:
            return None
        kept = nodes.get(_producer(snapshot.input[0]))
        if kept is None or kept.op != "DebugIdentityV2" or len(kept.input) != 1:
            return None
        return (snapshot, kept) if readers[snapshot.name] == readers[kept.name] == 1 else None

    dropped: set[str] = set()
    for node in graph_def.node:
        if node.op != OP_NAME:
            continue
        for i, name in enumerate(node.input):
            pair = owned_pair(name)
            if pair is not None:
                node.input[i] = pair[1].input[0]
                dropped.update(n.name for n in pair)
    if dropped:
        keep = [node for node in graph_def.node if node.name not in dropped]
        del graph_def.node[:]
        graph_def.node.extend(keep)


def _producer(input_name: str) -> str:
    """The node a ``NodeDef`` input names (``name:1`` and ``^name`` -> ``name``)."""
    return input_name.lstrip("^").split(":")[0]


def import_bound(graph: tf.Graph, backend: MPIBackend, comm=None, native_ops: bool = True,
                 spin: float | None = None) -> tuple[tf.Graph, Callable[[], None]]:
    """A copy of ``graph``, in which ``backend`` built its ops, with those ops bound to this process
    (what a worker's start-up does, for one graph: benchmarks, tests), and what releases them."""
    graph_def = graph.as_graph_def()
    backend.finalize_nodes(graph_def.node)
    graph_def, release = bind_py_functions(graph_def, comm=comm, native_ops=native_ops, spin=spin)
    bound = tf.Graph()
    with bound.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return bound, release


def _group_suffix(group: str) -> str:
    """What a named group adds to the tokens of its functions (nothing for the default group)."""
    return f"@{group}" if group else ""
