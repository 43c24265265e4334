"""The ``mpi`` backend: mpi4py ``Allreduce``/``Allgatherv`` called from the graph.

Ops added (under the caller's name scope):

* ``allreduce_<k>``: one ``PyFunc`` per fusion buffer: the dense gradients,
  sorted by variable name, are flattened and concatenated into buffers of at
  most ``fusion_bytes`` (per dtype), summed in place with
  ``Allreduce(MPI.IN_PLACE, buffer)`` and split back;
* per sparse gradient, with ``MPIConfig.use_allgatherv``, ``allgatherv_<k>``:
  one ``PyFunc`` that sends the values and indices with ``Allgatherv`` (each
  rank its own row count); without it (the default, as NCCL's all-gather
  would), ``allgather_<k>``: ``Allgather`` of the values and indices padded
  to the largest row count, the padding then dropped.

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

from collections.abc import Callable

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from parallax.comm.base import Backend, Prepared, ProcessComms

__all__ = ["MPIBackend", "bind_py_functions", "TOKEN_PREFIX"]

TOKEN_PREFIX = "parallax_comm:"
_ALLREDUCE = TOKEN_PREFIX + "mpi_allreduce"
_ALLREDUCE_INPLACE = TOKEN_PREFIX + "mpi_allreduce_inplace"
_ALLGATHERV = TOKEN_PREFIX + "mpi_allgatherv"
_ALLGATHER = TOKEN_PREFIX + "mpi_allgather"
_TRANSPORT_DTYPES = (tf.float32, tf.float64, tf.int32, tf.int64)


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

    def __init__(self, spec, num_workers, group: str = ""):
        super().__init__(spec, num_workers, group)
        self._tokens: dict[str, str] = {}
        self._suffix = _group_suffix(group)

    @classmethod
    def prepare(cls, graph_def: graph_pb2.GraphDef, comms: ProcessComms) -> Prepared:
        """Bind the graph's MPI ops to this process's communicators (:func:`bind_py_functions`)."""
        bound, release = bind_py_functions(graph_def, comm=comms.workers, groups=comms.groups)
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
        buckets: list[list[int]] = []
        sizes: dict[int, int] = {}
        current: dict[tf.DType, list[int]] = {}
        for i, t in enumerate(tensors):
            dtype = t.dtype if t.dtype in _TRANSPORT_DTYPES else tf.float32
            nbytes = dtype.size * max(1, t.shape.num_elements() or 1)
            bucket = current.get(dtype)
            if bucket is None or sizes[id(bucket)] + nbytes > self.spec.fusion_bytes:
                bucket = []
                buckets.append(bucket)
                current[dtype] = bucket
                sizes[id(bucket)] = 0
            bucket.append(i)
            sizes[id(bucket)] += nbytes
        for k, bucket in enumerate(buckets):
            members = [tensors[i] for i in bucket]
            transport = members[0].dtype if members[0].dtype in _TRANSPORT_DTYPES else tf.float32
            flat = [tf.reshape(tf.cast(t, transport), [-1]) for t in members]
            if len(flat) > 1:
                # In place: MPI sums straight into the concat's buffer, which only the
                # split below reads, after the call (control dependency). The call itself
                # returns a one-element "done" flag, so no buffer is copied back.
                fused = tf.concat(flat, 0, name=f"fuse_{k}")
                done = self._chained(lambda f=fused, k=k: _py_func(
                    [f], [tf.int32], _ALLREDUCE_INPLACE, f"allreduce_{k}", self._tokens))[0]
                with tf.control_dependencies([done]):
                    summed = tf.identity(fused, name=f"summed_{k}")
            else:
                summed = self._chained(lambda f=flat[0], k=k, d=transport: _py_func(
                    [f], [d], _ALLREDUCE, f"allreduce_{k}", self._tokens))[0]
            pieces = tf.split(summed, [tf.size(t) for t in members], name=f"unfuse_{k}") \
                if len(members) > 1 else [summed]
            for i, t, piece in zip(bucket, members, pieces):
                outputs[i] = tf.cast(tf.reshape(piece, tf.shape(t)), t.dtype)
        return outputs  # type: ignore[return-value]

    def allgather(self, pairs):
        results = []
        for k, (values, indices) in enumerate(pairs):
            transport = values.dtype if values.dtype in _TRANSPORT_DTYPES else tf.float32
            v = tf.cast(values, transport)
            token, name = (_ALLGATHERV, f"allgatherv_{k}") if self.spec.use_allgatherv else \
                (_ALLGATHER, f"allgather_{k}")
            gathered = self._chained(lambda v=v, ind=indices, token=token, name=name: _py_func(
                [v, ind], [v.dtype, ind.dtype], token, name, self._tokens))
            all_values = tf.cast(tf.reshape(gathered[0], tf.concat([[-1], tf.shape(values)[1:]], 0)),
                                 values.dtype)
            results.append((all_values, tf.reshape(gathered[1], [-1])))
        return results


# --------------------------------------------------------------------------- #
# Run time
# --------------------------------------------------------------------------- #

def _functions(comm):
    from mpi4py import MPI

    def allreduce(buf):
        out = np.empty_like(buf)
        comm.Allreduce(np.require(buf, requirements="C"), out, op=MPI.SUM)
        return out

    def allreduce_inplace(buf):
        if not buf.flags.c_contiguous:
            raise RuntimeError("Parallax: the fused gradient buffer is not contiguous")
        if not buf.flags.writeable:  # numpy marks TF's buffer read-only; it is ours alone
            buf.flags.writeable = True
        comm.Allreduce(MPI.IN_PLACE, buf, op=MPI.SUM)
        return np.ones(1, np.int32)

    def allgatherv(values, indices):
        values = np.require(values, requirements="C")
        indices = np.require(indices, requirements="C")
        row = int(np.prod(values.shape[1:], dtype=np.int64))
        counts = np.array(comm.allgather(int(values.shape[0])), dtype=np.int64)
        all_indices = np.empty(int(counts.sum()), dtype=indices.dtype)
        comm.Allgatherv(indices, [all_indices, counts])
        all_values = np.empty((int(counts.sum()),) + values.shape[1:], dtype=values.dtype)
        comm.Allgatherv(values.reshape(-1), [all_values.reshape(-1), counts * row])
        return all_values, all_indices

    def allgather(values, indices):
        counts = comm.allgather(int(values.shape[0]))
        most = max(counts)
        padded_values = np.zeros((most,) + values.shape[1:], dtype=values.dtype)
        padded_values[:values.shape[0]] = values
        padded_indices = np.zeros(most, dtype=indices.dtype)
        padded_indices[:indices.shape[0]] = indices
        all_values = np.empty((comm.size,) + padded_values.shape, dtype=values.dtype)
        all_indices = np.empty((comm.size, most), dtype=indices.dtype)
        comm.Allgather(padded_values, all_values)
        comm.Allgather(padded_indices, all_indices)
        return (np.concatenate([all_values[r, :n] for r, n in enumerate(counts)]),
                np.concatenate([all_indices[r, :n] for r, n in enumerate(counts)]))

    return {_ALLREDUCE: allreduce, _ALLREDUCE_INPLACE: allreduce_inplace, _ALLGATHERV: allgatherv,
            _ALLGATHER: allgather}


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


def bind_py_functions(graph_def: graph_pb2.GraphDef, comm=None, groups: dict | None = None
                      ) -> tuple[graph_pb2.GraphDef, Callable[[], None]]:
    """Point the graph's Parallax MPI ops at this process's functions.

    Registers one set of functions per communicator in TensorFlow's
    ``numpy_function`` registry and returns a copy of ``graph_def`` whose
    ``PyFunc`` nodes use the registry's tokens, with a function that removes
    them again (the registry holds functions weakly: the returned function
    keeps them alive until it is called).

    Args:
        graph_def: a rewritten graph.
        comm: the mpi4py communicator of the default group (``COMM_WORLD``
            when ``None``); the functions use a duplicate of each communicator.
        groups: communicators of named groups (``{"host": ...}``).

    Returns:
        ``(bound graph_def, release)``.
    """
    registry = _py_func_registry()
    bound: dict[str, tuple[str, Callable]] = {}
    for group, group_comm in {"": comm, **(groups or {})}.items():
        if group_comm is None:
            from mpi4py import MPI

            group_comm = MPI.COMM_WORLD
        for key, fn in _functions(group_comm.Dup()).items():
            bound[key + _group_suffix(group)] = (registry.insert(fn), fn)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.op in ("PyFunc", "PyFuncStateless"):
            token = node.attr["token"].s.decode()
            if token.startswith(TOKEN_PREFIX):
                if token not in bound:
                    raise RuntimeError(f"no Parallax MPI function for token {token!r} (groups bound: "
                                       f"{sorted(groups or {})})")
                node.attr["token"].s = bound[token][0].encode()

    def release() -> None:
        for token, _ in bound.values():
            registry.remove(token)
        bound.clear()

    return out, release


def _group_suffix(group: str) -> str:
    """What a named group adds to the tokens of its functions (nothing for the default group)."""
    return f"@{group}" if group else ""
