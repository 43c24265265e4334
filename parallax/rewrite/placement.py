"""Pass: put variables (and what must live with them) on their parameter servers.

No ops are added. Every variable the plan assigns to a server gets that
server's device, and so does every op colocated with it (``_class`` =
``loc:@<variable>``): its initializer, its optimizer slots, and its update
ops, so the update runs where the variable is. A traced step's initial values
read from the program's eager variables (``parallax_initial/``) run on the
worker, whose Python holds those variables.

With ``boundary_between_workers_and_servers`` (default on) a replica's
gather of rows from a server variable runs on the server, so only the rows
travel, and each row once: the replica finds the distinct indices
(``<gather>/parallax_unique/``), the server gathers those (the original op,
renamed ``<gather>/parallax_rows``), and an op of the original's name on the
replica spreads them back to the original shape (a batch of
Zipf-distributed words repeats a third of its ids). A gather is TF1's
``embedding_lookup`` (``ResourceGather``), or a ``GatherV2`` along the first
axis of a read of the variable (Keras 3's ``Embedding``: ``ops.take`` of the
table's value), which would otherwise carry the whole table to the replica
every step. Off, the gather runs on the replica's device: a
``ResourceGather``'s ``<gather>/parallax_read`` reads the whole variable from
the server and a ``GatherV2`` of the same name as the original picks the
rows there.

With ``boundary_among_servers`` (``PSConfig``, default on), the other ops
between the gradients and the update (clipping, scaling) also move to a
server: the server of the variable whose update they feed, or, for ops that
feed several (a global norm), of the first such variable by name. Otherwise
they stay on the worker. Does nothing for plans without servers.

When some variables stay on the workers (HYBRID, AUTO), their ops stay there
too, even when TensorFlow colocated them with a server variable (Adam's
``beta1_power`` is colocated with the first variable), and, on workers other
than the chief, they move from the ``variables`` collection to
``local_variables``: each initializes its own copy instead of waiting for the
chief to (the chief's stay global, so a restored checkpoint is not
re-initialized).
"""

from __future__ import annotations

from tensorflow.core.framework import node_def_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.python.framework import tensor_util

from parallax.graph.graph_ops import add_nodes, colocated_with, consumers, descendants, node_map, parse_input
from parallax.graph.names import INITIAL_VALUE_PREFIX, copy_replica, is_parallax_op
from parallax.plan.model import Plan, TaskSpec
from parallax.rewrite.classify import classify

__all__ = ["place_variables"]


def place_variables(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec
                    ) -> meta_graph_pb2.MetaGraphDef:
    """Assign server devices (see the module docstring). Returns a new MetaGraphDef."""
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    if not plan.server_devices:
        return out
    device_of = {v.name: plan.server_devices[v.server] for v in plan.variables if v.server is not None}
    on_workers = {v.name for v in plan.variables if v.server is None}
    worker_device = plan.workers[task.worker_index].shared_device
    for node in out.graph_def.node:
        if node.name in device_of:
            node.device = device_of[node.name]
            continue
        if node.name.startswith(INITIAL_VALUE_PREFIX + "/"):  # reads the program's eager variable: not on a server
            node.attr.pop("_class", None)
            node.device = worker_device
            continue
        if "_class" in node.attr:
            for target in colocated_with(node.attr["_class"].list.s):
                if target in device_of:
                    if _belongs_to_worker_variable(node, on_workers):
                        del node.attr["_class"]  # e.g. Adam's beta1_power, colocated with a server variable
                        node.device = worker_device
                    else:
                        node.device = device_of[target]
                    break
    if on_workers and task.worker_index != 0:  # the chief initializes (or restores) its own as usual
        _make_worker_variables_local(out, on_workers)
    if plan.ps.boundary_among_servers:
        _place_boundary_ops(out, plan, device_of)
    if plan.ps.boundary_between_workers_and_servers:
        _distinct_rows_from_servers(out, plan, task, device_of)
    else:
        _gather_on_workers(out, plan, task, device_of)
    return out


def _belongs_to_worker_variable(node, on_workers: set[str]) -> bool:
    """Whether ``node`` is a worker-held variable, one of its own ops (``<v>/...``),
    or reads or writes one (its first input is the variable)."""
    if node.name in on_workers or (node.input and parse_input(node.input[0])[0] in on_workers):
        return True
    return any(node.name.startswith(v + "/") for v in on_workers)


def _make_worker_variables_local(meta_graph: meta_graph_pb2.MetaGraphDef, on_workers: set[str]) -> None:
    """Variables every worker holds itself, beside others on servers, become local
    variables: each worker initializes its own (then worker 0's values are copied
    to all), and nobody waits for the chief to initialize them."""
    import tensorflow as tf
    from tensorflow.core.framework import variable_pb2

    global_key, local_key = tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.LOCAL_VARIABLES
    if global_key not in meta_graph.collection_def:
        return
    kept, moved = [], []
    for raw in meta_graph.collection_def[global_key].bytes_list.value:
        proto = variable_pb2.VariableDef()
        proto.ParseFromString(raw)
        name = proto.variable_name.split(":")[0]
        (moved if name in on_workers else kept).append(raw)
    if not moved:
        return
    del meta_graph.collection_def[global_key].bytes_list.value[:]
    meta_graph.collection_def[global_key].bytes_list.value.extend(kept)
    meta_graph.collection_def[local_key].bytes_list.value.extend(moved)


def _gather_on_workers(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec,
                       device_of: dict[str, str]) -> None:
    added = []
    for node, device, _ in _server_gathers(meta_graph, plan, task, device_of):
        dtype, tindices = node.attr["dtype"].type, node.attr["Tindices"].type
        read = node_def_pb2.NodeDef(name=f"{node.name}/parallax_read", op="ReadVariableOp", input=[node.input[0]])
        read.attr["dtype"].type = dtype
        axis = node_def_pb2.NodeDef(name=f"{node.name}/parallax_axis", op="Const", device=device)
        axis.attr["dtype"].type = types_pb2.DT_INT32
        axis.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(0, dtype=types_pb2.DT_INT32))
        batch_dims = node.attr["batch_dims"].i
        indices = [i for i in node.input[1:]]
        node.op = "GatherV2"
        del node.input[:]
        node.input.extend([read.name, indices[0], axis.name, *indices[1:]])
        for key in list(node.attr):
            del node.attr[key]
        node.attr["Tparams"].type = dtype
        node.attr["Tindices"].type = tindices
        node.attr["Taxis"].type = types_pb2.DT_INT32
        node.attr["batch_dims"].i = batch_dims
        node.device = device
        added.extend([read, axis])
    add_nodes(meta_graph.graph_def, added)


def _server_gathers(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec,
                    device_of: dict[str, str], of_reads: bool = False):
    """``(gather node, the device of its replica, what it gathers from)`` for every ``ResourceGather`` of rows
    from a server variable (what: ``None``), and with ``of_reads`` every ``GatherV2`` of a read of one (what:
    :func:`_gathered_read`'s)."""
    worker = plan.workers[task.worker_index]
    nodes = node_map(meta_graph.graph_def) if of_reads else {}
    for node in list(meta_graph.graph_def.node):
        read = _gathered_read(node, nodes, device_of) if of_reads else None
        if read is not None or node.op == "ResourceGather" and node.input \
                and parse_input(node.input[0])[0] in device_of:
            replica = copy_replica(node.name)
            yield node, worker.replica_devices[min(replica, len(worker.replica_devices) - 1)], read


def _gathered_read(node: node_def_pb2.NodeDef, nodes: dict[str, node_def_pb2.NodeDef],
                   device_of: dict[str, str]) -> tuple[str, node_def_pb2.NodeDef] | None:
    """The server variable whose rows ``node`` gathers and the gather's axis (a constant 0), where ``node`` is a
    ``GatherV2`` along axis 0, without batch dimensions, of a ``ReadVariableOp`` of the variable itself; else
    ``None``."""
    if node.op != "GatherV2" or len(node.input) != 3 or node.attr["batch_dims"].i:
        return None
    read, axis = nodes.get(parse_input(node.input[0])[0]), nodes.get(parse_input(node.input[2])[0])
    if read is None or read.op != "ReadVariableOp" or parse_input(read.input[0])[0] not in device_of:
        return None
    if axis is None or axis.op != "Const" or tensor_util.MakeNdarray(axis.attr["value"].tensor).tolist() != 0:
        return None
    return parse_input(read.input[0])[0], axis


def _distinct_rows_from_servers(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec,
                                device_of: dict[str, str]) -> None:
    import tensorflow as tf

    from parallax.rewrite.aggregate import build_subgraph

    added = []
    for node, device, read in _server_gathers(meta_graph, plan, task, device_of, of_reads=True):
        if node.attr["batch_dims"].i:
            continue
        name, server_name = node.name, f"{node.name}/parallax_rows"
        dtype = node.attr["Tparams" if read is not None else "dtype"].type
        if read is not None:  # a GatherV2 of the variable's value: on the server, its axis there too
            variable, original = read
            axis = node_def_pb2.NodeDef(name=f"{name}/parallax_axis", op="Const", device=device_of[variable])
            axis.attr["dtype"].CopyFrom(original.attr["dtype"])
            axis.attr["value"].CopyFrom(original.attr["value"])
            node.input[2] = axis.name
            node.device = device_of[variable]
            added.append(axis)

        def builder(inputs):
            ids, rows = inputs
            with tf.control_dependencies([ids]):  # constants in the frame of the ids (a while loop's body)
                unique, position = tf.unique(tf.reshape(ids, [-1]))
                shape = tf.concat([tf.shape(ids), tf.shape(rows)[1:]], 0)
                return [unique, tf.reshape(tf.gather(rows, position), shape, name="spread")]

        nodes, (unique, spread) = build_subgraph(
            builder, [tf.dtypes.as_dtype(node.attr["Tindices"].type), tf.dtypes.as_dtype(dtype)],
            [node.input[1], f"{server_name}:0"], f"{name}/parallax_unique/")
        for new in nodes:
            new.device = device
            if new.name == parse_input(spread)[0]:
                new.name = name  # the spread rows keep the original's name: its readers and fetches stay as they are
        node.name = server_name
        node.input[1] = unique
        added.extend(nodes)
    add_nodes(meta_graph.graph_def, added)


def _place_boundary_ops(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, device_of: dict[str, str]) -> None:
    update_ops = {}
    for n in meta_graph.graph_def.node:
        for target in colocated_with(n.attr["_class"].list.s if "_class" in n.attr else ()):
            if target in device_of:
                update_ops[n.name] = target
    cons = consumers(meta_graph.graph_def)
    nodes = {n.name: n for n in meta_graph.graph_def.node}
    for name in sorted(classify(meta_graph.graph_def, plan).update_path):
        if name in device_of or name in update_ops or is_parallax_op(name):
            continue
        fed = sorted({update_ops[d] for d in descendants(cons, [name]) if d in update_ops})
        if fed:
            nodes[name].device = device_of[fed[0]]
            if "_class" in nodes[name].attr:  # colocated with a worker-side gradient: no longer
                del nodes[name].attr["_class"]
