"""The ``mpi`` backend's all-reduce ``PyFunc`` nodes made nodes of the compiled op (:mod:`parallax.comm.native`).

When a process binds a graph (:func:`parallax.comm.mpi_binding.bind_py_functions`) and the graph has
an all-reduce, :func:`_native_for` loads the compiled op if it is available here; :func:`_lower` turns
each all-reduce ``PyFunc`` node into a ``ParallaxMpiAllreduce`` node with the same inputs, outputs and
MPI calls, and :func:`_skip_owned` lets it read its gradients without the ``Snapshot`` the ``PyFunc``
needs.
"""

from __future__ import annotations

from collections import Counter

from tensorflow.core.framework import graph_pb2

from parallax.comm.mpi_calls import _ALLREDUCE, CHUNK_BYTES, FUSE_BELOW_BYTES

__all__ = ["HUGE_PAGE_BYTES"]

#: The compiled op asks for 2 MiB pages for buffers of at least this size (numpy's threshold for the
#: same advice); ``PARALLAX_HUGE_PAGES=0`` turns it off (parallax/comm/allreduce.cc says why).
HUGE_PAGE_BYTES = 4 * 1024 * 1024


def _native_for(graph_def: graph_pb2.GraphDef, cache_root: str | None = None):
    """The compiled all-reduce op (:mod:`parallax.comm.native`, kept under ``cache_root``) when the graph has
    an all-reduce to lower and the op is available here, else ``None``."""
    if not any(node.op == "PyFunc" and node.attr["token"].s.decode().split("@")[0] == _ALLREDUCE
               for node in graph_def.node):
        return None
    from parallax.comm.native import native_ops

    return native_ops(cache_root)


def _lower(node, comm_key: str, huge_pages: bool = True) -> None:
    """Turn an all-reduce ``PyFunc`` node into the compiled op's: same inputs, outputs and MPI calls (its large
    buffers in huge pages unless ``huge_pages`` is ``False``)."""
    from parallax.comm.native import OP_NAME

    types = list(node.attr["Tin"].list.type)
    for name in ("Tin", "Tout", "token"):
        del node.attr[name]
    node.op = OP_NAME
    node.attr["T"].list.type.extend(types)
    node.attr["comm"].s = comm_key.encode()
    node.attr["chunk_bytes"].i = CHUNK_BYTES
    node.attr["huge_page_bytes"].i = HUGE_PAGE_BYTES if huge_pages else 0
    node.attr["fuse_below"].i = FUSE_BELOW_BYTES


def _skip_owned(graph_def: graph_pb2.GraphDef) -> None:
    """Let each compiled all-reduce read its gradients directly, without :func:`parallax.comm.mpi._owned`'s two ops.

    The compiled op does what the ``Snapshot`` did (it sums a buffer in place only when its
    reference is the only one, else a copy), and Grappler folds or merges neither it nor its
    inputs, so the ``DebugIdentityV2`` has nothing to guard: both are dropped (~10 us a tensor).
    """
    from parallax.comm.native import OP_NAME

    nodes = {node.name: node for node in graph_def.node}
    readers = Counter(_producer(name) for node in graph_def.node for name in node.input)

    def owned_pair(name: str):
        """``(Snapshot, DebugIdentityV2)`` when ``name`` is :func:`parallax.comm.mpi._owned`'s output and nothing
        else reads either, else ``None``."""
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
