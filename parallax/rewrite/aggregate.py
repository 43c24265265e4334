"""Pass: aggregate the replicas' gradients of a worker before the update.

Ops added, under ``parallax_aggregate/<variable>/`` on the worker's shared
device, for every variable with a gradient:

* dense: ``AddN`` of the replicas' gradients, divided by the number of
  replicas when the plan says ``mean``;
* sparse: ``ConcatV2`` of the replicas' values and of their indices (the
  update ops add duplicate rows up), values divided by the number of
  replicas when the plan says ``mean``.

The update ops (the shared ops on the path to the training op) then read
the aggregate instead of replica 0's gradient. Other readers of a gradient
(say, a logged gradient norm) keep their own replica's value.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from parallax.plan.model import Plan, TaskSpec, VariablePlacement
from parallax.rewrite.classify import classify
from parallax.rewrite.graph_ops import format_input, node_map, parse_input
from parallax.rewrite.names import aggregate_scope, replica_tensor_name

__all__ = ["aggregate_gradients", "build_subgraph"]


def build_subgraph(builder, input_dtypes: list[tf.DType], input_names: list[str], scope: str):
    """Build ops with real TF code in a scratch graph and return their NodeDefs.

    ``builder`` gets one placeholder per input and returns output tensors; the
    placeholders are then replaced by ``input_names`` (tensor names of the
    graph being rewritten). Returns ``(nodes, output tensor names)``.
    """
    graph = tf.Graph()
    with graph.as_default():
        placeholders = [tf.compat.v1.placeholder(d, name=f"parallax_input_{i}")
                        for i, d in enumerate(input_dtypes)]
        with tf.name_scope(scope):
            outputs = builder(placeholders)
    replace = {p.op.name: input_names[i] for i, p in enumerate(placeholders)}
    nodes = []
    for node in graph.as_graph_def().node:
        if node.name in replace:
            continue
        del_inputs = list(node.input)
        del node.input[:]
        for text in del_inputs:
            name, index, control = parse_input(text)
            if name in replace:
                if control:
                    node.input.append(format_input(parse_input(replace[name])[0], 0, True))
                else:
                    node.input.append(replace[name])
            else:
                node.input.append(text)
        nodes.append(node)
    return nodes, [t.name for t in outputs]


def _aggregate_fn(var: VariablePlacement, num: int):
    def dense(ins):
        total = tf.math.add_n(ins) if num > 1 else tf.identity(ins[0])
        if var.aggregation == "mean" and num > 1:
            total = total / tf.constant(num, dtype=total.dtype)
        return [total]

    def sparse(ins):
        values, indices = ins[:num], ins[num:]
        values = tf.concat(values, 0) if num > 1 else tf.identity(values[0])
        indices = tf.concat(indices, 0) if num > 1 else tf.identity(indices[0])
        if var.aggregation == "mean" and num > 1:
            values = values / tf.constant(num, dtype=values.dtype)
        return [values, indices]

    return sparse if var.sparse else dense


def aggregate_gradients(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec
                        ) -> meta_graph_pb2.MetaGraphDef:
    """Aggregate every variable's gradient over ``task``'s local replicas.

    Args:
        meta_graph: the graph after :func:`replicate_graph` (not modified).
        plan: the job's plan.
        task: the worker to rewrite for.

    Returns:
        A new MetaGraphDef.
    """
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    worker = plan.workers[task.worker_index]
    num = len(worker.replica_devices)
    update_path = classify(out.graph_def, plan).update_path
    rewire: dict[str, str] = {}
    added = []
    for var in plan.variables:
        if var.gradient is None:
            continue
        parts = [var.gradient.tensor] + ([var.gradient.indices] if var.sparse else [])
        names = [replica_tensor_name(t, r) for t in parts for r in range(num)]
        part_dtypes = [var.gradient.dtype] + ([var.gradient.indices_dtype] if var.sparse else [])
        in_dtypes = [tf.dtypes.as_dtype(d) for d in part_dtypes for _ in range(num)]
        nodes, outputs = build_subgraph(_aggregate_fn(var, num), in_dtypes, names,
                                        aggregate_scope(var.name))
        for node in nodes:
            node.device = worker.shared_device
        added.extend(nodes)
        for original, aggregated in zip(parts, outputs):
            op, index, _ = parse_input(aggregated)
            rewire[_canonical(original)] = format_input(op, index, False)
    nodes = node_map(out.graph_def)
    for name in sorted(update_path):
        node = nodes[name]
        for i, text in enumerate(node.input):
            op, index, control = parse_input(text)
            key = _canonical(format_input(op, index, False))
            if not control and key in rewire:
                node.input[i] = rewire[key]
    out.graph_def.node.extend(added)
    return out


def _canonical(tensor: str) -> str:
    op, index, _ = parse_input(tensor)
    return f"{op}:{index}"
