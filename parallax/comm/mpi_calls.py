"""What the ``mpi`` backend's ops do at run time, in Python: the MPI calls over one communicator.

The graph names each function by a fixed token (``parallax_comm:mpi_allreduce`` ...; a named
group's tokens end in ``@<group>``); :func:`_functions` gives, for one communicator, the
function of each token: the dense all-reduce (the small buffers of a call summed together in
one, laid out as :func:`fused_layout` says; every other one in place, in pieces of at most
:data:`CHUNK_BYTES`), the sparse gathers in one call of two rounds (:func:`packed_layout`), and
the reduce-scatter and all-gather of sharded optimizer states. 16-bit floats travel as 16-bit
words, summed by an MPI operation of ours. The compiled op (``allreduce.cc``) follows the same
layout, so processes with and without it issue the same MPI calls.
"""

from __future__ import annotations

import ctypes

import numpy as np

from parallax.comm.arrival import arrive
from parallax.plan.model import part_sizes

__all__ = ["TOKEN_PREFIX", "CHUNK_BYTES", "FUSE_BELOW_BYTES", "FUSE_ALIGN", "fused_layout", "packed_layout"]

TOKEN_PREFIX = "parallax_comm:"
_ALLREDUCE = TOKEN_PREFIX + "mpi_allreduce"
_ALLGATHERV = TOKEN_PREFIX + "mpi_allgatherv"
_ALLGATHER = TOKEN_PREFIX + "mpi_allgather"
_GATHERV = TOKEN_PREFIX + "mpi_gatherv"
_REDUCE_SCATTER = TOKEN_PREFIX + "mpi_reduce_scatter"
_ALLGATHER_SHARDS = TOKEN_PREFIX + "mpi_allgather_shards"
#: Buffers are summed in pieces of at most this many bytes: Open MPI sums 64 MiB in 2 or 4 MiB pieces in a
#: third to half the time of one call, and 16 MiB in 2 MiB pieces 10-20 % faster than in 4 MiB ones (on 2
#: ranks of one host, where a piece, its peer's and Open MPI's temporary all stay in the L3 cache;
#: docs/benchmarks.md); a piece costs one latency.
CHUNK_BYTES = 2 * 1024 * 1024
#: Buffers of an all-reduce call under this size are summed together, in one MPI call over one
#: buffer (:func:`fused_layout`): a call costs a fixed ~15-30 us on one host, about what copying
#: 1 MiB costs (docs/benchmarks.md).
FUSE_BELOW_BYTES = 1024 * 1024
#: Alignment of each buffer in a fused one: TensorFlow's (``Allocator::kAllocatorAlignment``), so
#: that each piece of the fused buffer can be a tensor of its own.
FUSE_ALIGN = 64


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
        """Sum each buffer over the workers in place (each is ours alone: see :func:`parallax.comm.mpi._owned`);
        the small ones together, in one buffer laid out as :func:`fused_layout` says (the compiled op's calls)."""
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
    """Where each member's sparse rows lie in its buffer of :meth:`parallax.comm.mpi.MPIBackend.allgather`'s one call.

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


def _group_suffix(group: str) -> str:
    """What a named group adds to the tokens of its functions (nothing for the default group)."""
    return f"@{group}" if group else ""
