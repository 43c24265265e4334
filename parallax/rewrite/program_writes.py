"""The program's own writes of parameter-server variables, under synchronous PS training.

Called by :func:`parallax.rewrite.ps_sync.add_ps_sync`. Only the chief writes
server variables: on the other workers every other op that writes one (an EMA
of the weights, batch-norm moving statistics kept on a server, the program's
own increment of the global step or assignment of a learning rate, a saver's
restore; :func:`program_writes`) runs nothing, so that it runs once per step,
as on one device; it keeps its name and output, with the value one device
gives (:func:`drop_server_writes`). Ops whose value such a worker cannot give
as one device would in a run that also trains are in the collection
:data:`UNSYNCHRONISED`.

The program's writes outside a step take the writes barrier under
``parallax_sync/writes/`` (:func:`add_writes_barrier`): ``token_<w>`` queues
on server 0, the chief's ``release`` (a token to each other worker), each
other worker's ``wait``; the session runs ``release`` after, ``wait`` before,
a run that makes such a write and trains nothing
(:class:`parallax.runtime.session.WritesBarrier`), and the writes' names are in the
collection :data:`PROGRAM_WRITES`.

:func:`written_after` tells the protocol whether anything but a training op's
update writes a server variable (then the chief's release waits for the whole
step).
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from parallax.analysis import VARIABLE_OP_TYPES, update_scope_owner
from parallax.graph.graph_ops import (
    add_nodes,
    ancestors,
    computed_from,
    consumers,
    descendants,
    is_variable_write,
    make_no_op,
    node_map,
    parse_input,
    written_variable,
)
from parallax.graph.names import HOST_WRITES_PREFIX, SYNC_PREFIX, WRITES_SCOPE
from parallax.plan.model import Plan, TaskSpec
from parallax.rewrite.aggregate import build_subgraph

__all__ = ["program_writes", "written_after", "add_writes_barrier", "drop_server_writes", "server_variables",
           "UNSYNCHRONISED", "PROGRAM_WRITES"]

#: The collection of the ops whose value a worker other than the chief cannot give as one device would in a
#: run that also trains (see :func:`drop_server_writes`): the session refuses such a fetch there.
UNSYNCHRONISED = "parallax_unsynchronised"
#: The collection of the program's writes of server variables outside a training step: a ``run`` of any of
#: them takes the writes barrier (:func:`add_writes_barrier`).
PROGRAM_WRITES = "parallax_program_writes"


def server_variables(plan: Plan, slots: bool = True) -> set[str]:
    """The names of the variables on the servers (with ``slots=False``, not the optimizers' slots)."""
    return {v.name for v in plan.variables if v.server is not None and (slots or v.slot_of is None)}


def written_after(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, train_op: str) -> list[str]:
    """Server variables that an op outside ``train_op``'s update writes (an EMA, moving statistics
    in a ``tf.group`` with it, another training op), by name.

    While there are none, the chief may release the others as soon as the update is done: a
    worker that reads any server variable after its step sees the chief's whole step all the same.
    A traced step's writes of the program's values (under :data:`HOST_WRITES_PREFIX`) run alone, in a run the
    writes barrier orders, never beside a step: they are not counted.
    """
    nodes = node_map(meta_graph.graph_def)
    step = ancestors(nodes, [train_op])
    on_servers = server_variables(plan)
    initializers, saver_scope = _initializers_and_saver(meta_graph)
    restores = _restore_writes(meta_graph.graph_def, nodes)
    return sorted({written_variable(n, nodes) for n in meta_graph.graph_def.node
                   if n.name not in step and n.name not in initializers and n.name not in restores
                   and not n.name.startswith(HOST_WRITES_PREFIX + "/")
                   and not (saver_scope and n.name.startswith(saver_scope))} & on_servers)


def program_writes(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan) -> tuple[set[str], set[str]]:
    """The program's own writes of server variables (outside the optimizer's updates, initializers and the
    exported saver): those ordered after a training op (under its ``control_dependencies``), and the others."""
    servers = server_variables(plan)
    graph_def = meta_graph.graph_def
    nodes = node_map(graph_def)
    initializers, saver_scope = _initializers_and_saver(meta_graph)
    owner = update_scope_owner([v.name for v in plan.variables])  # the optimizer's updates: see add_ps_sync
    kept_scopes = (f"{SYNC_PREFIX}/",) + ((saver_scope,) if saver_scope else ())
    writes = {n.name for n in graph_def.node
              if n.name not in initializers and not n.name.startswith(kept_scopes)
              and owner(n.name) is None and written_variable(n, nodes) in servers}
    after_step = descendants(consumers(graph_def), [t for t in plan.train_ops if t in nodes]) & writes
    return after_step, writes - after_step


def add_writes_barrier(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec,
                       outside: set[str]) -> None:
    """The barrier that orders the program's writes of server variables outside a step (see
    :func:`drop_server_writes`): ``token_<w>`` queues on server 0, the chief's ``release`` (a token to
    each) and each other worker's ``wait``; the writes' names in the collection :data:`PROGRAM_WRITES`."""
    chief = task.worker_index == 0

    def builder(_inputs):
        with tf.name_scope(WRITES_SCOPE):
            queues = {w: tf.queue.FIFOQueue(-1, [tf.int64], shapes=[[]], shared_name=f"{WRITES_SCOPE}token_{w}",
                                            name=f"token_{w}") for w in range(1, plan.num_workers)
                      if chief or w == task.worker_index}
            if chief:
                token = tf.constant(0, tf.int64)
                tf.group(*[q.enqueue(token) for q in queues.values()], name="release")
            else:
                tf.group(queues[task.worker_index].dequeue(), name="wait")
        return []

    nodes, _ = build_subgraph(builder, [], [], "")
    for node in nodes:
        node.device = plan.server_devices[0]  # the queues and their tokens
    add_nodes(meta_graph.graph_def, nodes)
    meta_graph.collection_def[PROGRAM_WRITES].bytes_list.value.extend(n.encode() for n in sorted(outside))


def drop_server_writes(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, device: str,
                       after_step: set[str], outside: set[str]) -> None:
    """On a worker other than the chief, the program's writes of server variables (an EMA of the weights,
    moving statistics, its own increment of the global step or assignment of a learning rate, a saver's
    restore; :func:`program_writes`) run nothing: the chief runs them, once per step as on one device.

    What a write gives a program that fetches it stays (:func:`parallax.graph.graph_ops.make_no_op`),
    with the value one device gives:

    * a write ordered after a training op (under its ``control_dependencies``): the variable, read after
      this worker's token, so once the chief's whole step is done;
    * an assignment of a value that reads no variable (a learning rate from a placeholder): that value (a
      resource variable's ``read_value`` too);
    * any other write outside a step: the variable. A ``run`` that writes outside a step waits, before it
      runs, for the chief's run of the same writes (:func:`add_writes_barrier`; the session runs the
      barrier, :class:`parallax.runtime.session.ParallaxSession`), so every later read sees the chief's write. In a
      run that also trains, the variable is read without waiting for the chief: its name goes into the
      collection :data:`UNSYNCHRONISED`, and the session refuses such a fetch on this worker.
    """
    graph_def = meta_graph.graph_def
    nodes = node_map(graph_def)
    dropped = after_step | outside
    values, unsynchronised = {}, []
    for name in sorted(outside):
        node = nodes[name]
        value = node.input[1] if node.op in ("Assign", "AssignVariableOp") and len(node.input) > 1 else None
        if value is not None and not computed_from(
                nodes, value, lambda op: op in nodes and nodes[op].op in VARIABLE_OP_TYPES):
            values[name] = value
        else:
            unsynchronised.append(name)
    reads = _read_values(graph_def, nodes, dropped)
    make_no_op(graph_def, dropped, device,
               "a write of a variable on the parameter servers, which only the chief worker runs; read the "
               "variable itself instead", values=values)
    for read, write in reads.items():  # a resource variable's read_value of a dropped assignment
        if write in values:
            node = nodes[read]
            dtype = node.attr["dtype"].type
            waits = [t for t in node.input if t.startswith("^")]
            node.op = "Identity"
            del node.input[:]
            node.input.extend([values[write]] + waits)
            del node.attr["dtype"]
            node.attr["T"].type = dtype
        elif write in unsynchronised:
            unsynchronised.append(read)
    if unsynchronised:
        meta_graph.collection_def[UNSYNCHRONISED].bytes_list.value.extend(n.encode() for n in sorted(unsynchronised))


def _read_values(graph_def, nodes: dict, writes: set[str]) -> dict[str, str]:
    """The reads of a resource variable that wait for one of ``writes`` of it (what ``assign(...)``
    returns: a ``ReadVariableOp`` under the write's control dependency), each with its write."""
    found = {}
    for node in graph_def.node:
        if node.op != "ReadVariableOp" or not node.input:
            continue
        for text in node.input[1:]:
            write = parse_input(text)[0]
            if text.startswith("^") and write in writes and parse_input(node.input[0])[0] == \
                    parse_input(nodes[write].input[0])[0]:
                found[node.name] = write
    return found


def _restore_writes(graph_def, nodes: dict) -> set[str]:
    """The writes of a saver's restore (their value comes from a ``RestoreV2``), by name."""
    return {n.name for n in graph_def.node if is_variable_write(n.op) and len(n.input) > 1
            and _from_restore(nodes, n.input[1])}


def _from_restore(nodes: dict, tensor: str) -> bool:
    name = parse_input(tensor)[0]
    for _ in range(8):  # RestoreV2, maybe through an Identity or a reshape of its output
        node = nodes.get(name)
        if node is None:
            return False
        if node.op in ("RestoreV2", "Restore", "RestoreSlice"):
            return True
        data = [t for t in node.input if not t.startswith("^")]
        if not data:
            return False
        name = parse_input(data[0])[0]
    return False


def _initializers_and_saver(meta_graph: meta_graph_pb2.MetaGraphDef) -> tuple[set[str], str | None]:
    """The writes that are no training step: the variables' initializer ops (by name) and the
    saver's name scope (``save/``), or ``None`` when the graph has no saver."""
    from tensorflow.core.framework import variable_pb2

    initializers = set()
    for collection in meta_graph.collection_def.values():
        for raw in collection.bytes_list.value:
            proto = variable_pb2.VariableDef()
            try:
                proto.ParseFromString(raw)
            except Exception:  # noqa: BLE001 - not a VariableDef
                continue
            if proto.initializer_name:
                initializers.add(parse_input(proto.initializer_name)[0])
    restore = meta_graph.saver_def.restore_op_name
    return initializers, (restore.split("/")[0] + "/") if restore else None
