"""Pass: replicas read local copies of the server-held variables (``PSConfig.replicate_variables``).

Ops added, for every dense variable ``<v>`` the plan keeps on a parameter
server, and every local replica ``r`` of this worker (synchronous PS only):

* ``parallax_local/replica_<r>/<v>``: a local (non-trainable) variable on the
  replica's device, in the ``local_variables`` collection, so every worker
  initializes its own;
* ``parallax_local/replica_<r>/<v>/refresh``: assigns the server's current
  value to the copy.

The replica's own reads of ``<v>`` (its forward pass) then read the copy,
each after the refresh. The token protocol of :mod:`parallax.rewrite.ps_sync`
guarantees that the server holds the previous step's result when a step
starts, so every replica computes with exactly the values it would read from
the server, fetched once per replica and step. Sparse variables (embeddings)
are not copied: their rows are gathered on the server. Reads outside the
replicas (the update, a fetch of the variable) still read the server.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.framework import variable_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from parallax.plan.model import Plan, TaskSpec
from parallax.rewrite.aggregate import build_subgraph
from parallax.rewrite.classify import classify
from parallax.rewrite.graph_ops import add_nodes, enclosing_scope
from parallax.rewrite.names import REPLICA_PREFIX, copy_replica, local_copy_scope

__all__ = ["use_local_copies"]


def _replica_of(name: str, replicated: frozenset[str]) -> int | None:
    if name.startswith(REPLICA_PREFIX):
        return copy_replica(name)
    return 0 if name in replicated else None


def _local_copy(scope: str, server_handle: tf.Tensor, dtype: tf.DType, shape
                ) -> tuple[variable_pb2.VariableDef, tf.Tensor, tf.Operation]:
    """A local resource variable named ``scope``, zero until refreshed: its ``VariableDef``, its
    handle and its refresh from the server's variable.

    Built from the ops a ``tf.Variable`` would make (handle, initial value, initializer, a read)
    and described by a ``VariableDef`` that ``import_meta_graph`` turns back into a variable; the
    ``tf.Variable`` class itself took a third of the time of a PS rewrite of 320 variables.
    """
    handle = tf.raw_ops.VarHandleOp(dtype=dtype, shape=shape, shared_name=scope, name=scope)
    with tf.name_scope(f"{scope}/"):  # every op under the copy's own scope: no clash with the graph
        initial = tf.zeros(shape, dtype, name="initial_value")
        initializer = tf.raw_ops.AssignVariableOp(resource=handle, value=initial, name="Assign")
        with tf.name_scope("Read"):
            read = tf.raw_ops.ReadVariableOp(resource=handle, dtype=dtype, name="ReadVariableOp")
        value = tf.raw_ops.ReadVariableOp(resource=server_handle, dtype=dtype, name="server_value")
        refresh = tf.raw_ops.AssignVariableOp(resource=handle, value=value, name="refresh")
    proto = variable_pb2.VariableDef(variable_name=handle.name, initializer_name=initializer.name,
                                     snapshot_name=read.name, initial_value_name=initial.name, trainable=False,
                                     is_resource=True)
    return proto, handle, refresh


def use_local_copies(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec
                     ) -> meta_graph_pb2.MetaGraphDef:
    """Give each replica local copies of the dense server variables (see the module docstring).

    Returns:
        A new MetaGraphDef (unchanged unless PS, sync and ``replicate_variables``).
    """
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    if not (plan.server_devices and plan.sync and plan.ps.replicate_variables):
        return out
    node_types = {n.name: n.op for n in out.graph_def.node}
    variables = [v for v in plan.variables if v.sync == "ps" and v.gradient is not None and not v.sparse
                 and node_types.get(v.name) == "VarHandleOp"]
    if not variables:
        return out
    worker = plan.workers[task.worker_index]
    replicated = classify(out.graph_def, plan).replicated
    reads: dict[tuple[str, int], list] = {}
    copied = {v.name for v in variables}
    for node in out.graph_def.node:
        if node.op != "ReadVariableOp" or not node.input:
            continue
        r = _replica_of(node.name, replicated)
        if r is not None and node.input[0] in copied:
            reads.setdefault((node.input[0], r), []).append(node)
    if not reads:
        return out
    keys = sorted(reads)
    dtype_of = {v.name: tf.dtypes.as_dtype(v.dtype) for v in variables}
    shape_of = {v.name: v.shape for v in variables}
    protos: list[bytes] = []

    def builder(handles):
        outputs = []
        for (name, r), handle in zip(keys, handles):
            proto, copy, refresh = _local_copy(local_copy_scope(name, r), handle, dtype_of[name], shape_of[name])
            protos.append(proto.SerializeToString())
            outputs.append(copy)
            outputs.append(refresh)
        return outputs

    nodes, names = build_subgraph(builder, [tf.resource] * len(keys), [name for name, _ in keys], "")
    devices = {local_copy_scope(name, r): worker.replica_devices[r] for name, r in keys}
    for node in nodes:
        owner = enclosing_scope(node.name, devices)
        if owner is not None and not node.name.endswith("/server_value"):
            node.device = devices[owner]
    for i, key in enumerate(keys):
        handle_op = names[2 * i].split(":")[0]
        refresh_op = names[2 * i + 1].split(":")[0]
        for node in reads[key]:
            node.input[0] = handle_op
            node.input.append(f"^{refresh_op}")
            if "_class" in node.attr:
                del node.attr["_class"]
    add_nodes(out.graph_def, nodes)
    out.collection_def[tf.compat.v1.GraphKeys.LOCAL_VARIABLES].bytes_list.value.extend(protos)
    return out
