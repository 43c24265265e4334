"""Pass: a worker reads its small server variables in one transfer per server.

Each value that crosses from a parameter server to a worker is a transfer of
its own (a gRPC ``RecvTensor``), with a fixed cost beside its bytes. For
every server and dtype, this pass packs the worker's reads of the dense
variables there below :data:`parallax.comm.packing.PACK_BELOW_BYTES` (static
shapes only):

* ``parallax_reads/<k>/pack`` concatenates them on the server;
* ``parallax_reads/<k>/unpack`` takes them apart on the worker's shared device,
  and the worker's ops that read the variables (a replica's refresh of its
  local copy, or its forward pass when variables are not replicated) read
  the pieces instead.

A read is packed only when it waits on nothing (no control inputs: a read
placed after an update keeps its own transfer) and reads the variable itself
(a read inside a loop or a branch takes the variable through the loop's
``Enter`` or the branch's ``Switch``, and is left alone). Readers on the
server (the update, an EMA) keep reading the variable there. The values are
the same: a read that waits on nothing runs when the step starts, packed or
not.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from parallax.comm.packing import pack, packed_groups, static_nbytes, unpack
from parallax.graph.graph_ops import add_nodes, consumers, format_input, node_map, parse_input
from parallax.graph.names import packed_reads_scope
from parallax.plan.model import Plan, TaskSpec
from parallax.rewrite.aggregate import build_subgraph

__all__ = ["pack_server_reads"]

_REF_VARIABLES = ("VariableV2", "Variable")
_READ_OPS = ("ReadVariableOp", "Identity")


def pack_server_reads(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec
                      ) -> meta_graph_pb2.MetaGraphDef:
    """Pack the worker's reads of small server variables (see the module docstring). Returns a new
    MetaGraphDef (unchanged without servers or with fewer than two such variables on a server)."""
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    if not plan.server_devices:
        return out
    worker = plan.workers[task.worker_index]
    reads = _worker_reads(out, plan)
    groups, _ = packed_groups(sorted(reads), key=lambda v: (reads[v].server, reads[v].dtype),
                              nbytes=lambda v: reads[v].nbytes)
    if not groups:
        return out
    added = []
    for k, names in enumerate(groups):
        server = reads[names[0]].server
        scope = packed_reads_scope(k)

        def builder(inputs, names=names, scope=scope):
            packed = pack(inputs, name=f"{scope}pack")
            return unpack(packed, [reads[v].shape for v in names], name=f"{scope}unpack")

        nodes, pieces = build_subgraph(builder, [reads[v].dtype for v in names],
                                       [reads[v].tensor for v in names], "")
        for node in nodes:
            node.device = server if node.name.startswith(f"{scope}pack") else worker.shared_device
        for v, piece in zip(names, pieces):
            op, index, _ = parse_input(piece)
            for node, i in reads[v].uses:
                node.input[i] = format_input(op, index, False)
        added.extend(nodes)
    add_nodes(out.graph_def, added)
    return out


class _Read:
    """A server variable's read that the worker's ops use: the tensor, where the variable lives,
    its dtype, shape and size, and the worker-side inputs that read it (node, input index)."""

    def __init__(self, tensor: str, server: str, dtype: tf.DType, shape: list[int], nbytes: int) -> None:
        self.tensor, self.server, self.dtype, self.shape, self.nbytes = tensor, server, dtype, shape, nbytes
        self.uses: list[tuple] = []


def _worker_reads(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan) -> dict[str, _Read]:
    """Per server variable that can be packed, its read and the worker-side inputs that use it
    (one read per variable: several reads that wait on nothing all give the step's value)."""
    nodes = node_map(meta_graph.graph_def)
    sizes = {v.name: static_nbytes(v.shape, v.dtype) for v in plan.variables if v.server is not None}
    servers = {v.name: (plan.server_devices[v.server], v, sizes[v.name]) for v in plan.variables
               if sizes.get(v.name) is not None}
    users = consumers(meta_graph.graph_def)
    reads: dict[str, _Read] = {}
    for node in meta_graph.graph_def.node:
        if node.op not in _READ_OPS or not node.input:
            continue
        variable = parse_input(node.input[0])[0]
        if variable not in servers or not _is_whole_read(node, nodes[variable].op) \
                or any(parse_input(i)[2] for i in node.input):
            continue
        server, placement, nbytes = servers[variable]
        tensor = format_input(node.name, 0, False)
        for user in users.get(node.name, ()):
            reader = nodes[user]
            if not reader.device or reader.device == server:
                continue  # the server's own readers (updates, an EMA), or a reader placed by TensorFlow
            for i, text in enumerate(reader.input):
                op, index, control = parse_input(text)
                if op == node.name and index == 0 and not control:
                    if variable not in reads:
                        dtype = tf.dtypes.as_dtype(placement.dtype).base_dtype
                        reads[variable] = _Read(tensor, server, dtype, [int(d) for d in placement.shape], nbytes)
                    reads[variable].uses.append((reader, i))
    return reads


def _is_whole_read(node, variable_op: str) -> bool:
    """Whether ``node`` reads a whole variable's value: a resource variable's ``ReadVariableOp``,
    or a reference variable's ``Identity`` (``<v>/read``)."""
    if node.op == "ReadVariableOp":
        return variable_op == "VarHandleOp"
    return node.op == "Identity" and variable_op in _REF_VARIABLES
