"""Pass: copy the per-replica part of the graph onto every local replica.

Ops added: for local replica ``r >= 1`` of this worker, a copy of every
replicated op (see :mod:`parallax.rewrite.classify`) named
``parallax_replica_<r>/<original name>``; replica 0 keeps the original names.

Wiring:

* a copy's inputs from replicated ops point at the same replica's copies;
  inputs from shared ops (variables, a learning-rate placeholder) are kept;
* a shared op's control input on a replicated op waits for every replica's
  copy; its data inputs from replicated ops read replica 0 (the gradient
  inputs of the update ops are rewired later by the aggregation pass);
* colocation (``_class``) and v1 while-loop frame names follow the copy;
* ``parallax.shard`` ids become constants: the global replica index and the
  total number of replicas; so do a custom loop's marks of its part
  (:data:`~parallax.graph.names.REPLICA_INDEX`, ``REPLICA_COUNT``);
* a replicated op that writes a shared variable outside the optimizer (the
  moving statistics of batch norm in ``UPDATE_OPS``) writes it from replica 0
  only: the copies of other replicas become ``NoOp``s that wait for the same
  inputs and replica 0's write, which waits for every replica's copies of
  what it waits for (a ``SeedGenerator``'s reads of its state before it
  advances it). So such a variable is updated once per step, from replica 0's
  batch, as each process does under Horovod;
* each replica draws its own random numbers (dropout masks, augmentation):
  the copy for the replica of global index ``g > 0`` of a stateless random
  op takes its seed plus ``[g * 933199, 0]`` (Keras 3's ``SeedGenerator``
  keeps its seeds below 933199, or advances the second element only), and
  of a seeded stateful op (a TF1 ``tf.random.uniform(seed=...)``) has
  ``seed2 + g * 7919``: otherwise every replica, each worker's first too,
  would draw the same numbers from the same seed. A traced step's draws of
  the union batch's rows (:data:`~parallax.graph.names.EXACT_DRAWS`,
  :mod:`parallax.tf2.draws`) keep one device's seed: each replica takes its
  rows of one device's draw.

Devices: a replica's ops go on its device (an op the user pinned to the CPU
stays on the CPU when the replica is a GPU); shared ops without a device go
on the worker's shared device.
"""

from __future__ import annotations

from tensorflow.core.framework import node_def_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from parallax.errors import RewriteError
from parallax.graph.graph_ops import (
    STATEFUL_DRAWS,
    add_nodes,
    added_to_itself,
    consumers,
    copy_op,
    descendants,
    format_input,
    make_no_op,
    node_map,
    parse_input,
    replica_device,
    written_variable,
)
from parallax.graph.names import (
    EXACT_DRAWS,
    MICRO_PREFIX,
    REPLICA_COUNT,
    REPLICA_INDEX,
    REPLICA_PREFIX,
    copy_replica,
    replica_frame_name,
    replica_function_name,
    replica_op_name,
    replica_seed_ops,
)
from parallax.plan.model import Plan, TaskSpec
from parallax.rewrite.classify import classify
from parallax.shard import NUM_SHARDS_COLLECTION, SHARD_ID_COLLECTION

__all__ = ["replicate_graph", "shard_op_names"]


def shard_op_names(meta_graph: meta_graph_pb2.MetaGraphDef) -> tuple[str | None, str | None]:
    """The op names of the ``parallax.shard`` count and id constants, if the graph has them."""
    def first(key: str) -> str | None:
        if key not in meta_graph.collection_def:
            return None
        values = meta_graph.collection_def[key].node_list.value
        return parse_input(values[0])[0] if values else None
    return first(NUM_SHARDS_COLLECTION), first(SHARD_ID_COLLECTION)


def _collected(meta_graph: meta_graph_pb2.MetaGraphDef, key: str) -> frozenset[str]:
    """The op names of collection ``key`` (empty where the graph has none)."""
    if key not in meta_graph.collection_def:
        return frozenset()
    return frozenset(parse_input(v)[0] for v in meta_graph.collection_def[key].node_list.value)


def _set_const(node: node_def_pb2.NodeDef, value: int) -> None:
    tensor = node.attr["value"].tensor
    dtype = tensor.dtype
    tensor.Clear()
    tensor.dtype = dtype
    if dtype == 9:  # DT_INT64
        tensor.int64_val.append(value)
    else:
        tensor.int_val.append(value)


def replicate_graph(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec
                    ) -> meta_graph_pb2.MetaGraphDef:
    """Copy the per-replica ops onto every replica of ``task``'s worker.

    Args:
        meta_graph: the single-device graph (not modified).
        plan: the job's plan.
        task: the worker to rewrite for.

    Returns:
        A new MetaGraphDef.

    Raises:
        RewriteError: an original op name already uses the replica prefix.
    """
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    worker = plan.workers[task.worker_index]
    devices = worker.replica_devices
    num_shards_op, shard_id_op = shard_op_names(meta_graph)
    shard_ops = frozenset(n for n in (num_shards_op, shard_id_op) if n)
    sharded_functions = _sharded_functions(meta_graph, shard_ops)
    if shard_ops:
        types = {n.name: n.op for n in meta_graph.graph_def.node}
        reached = descendants(consumers(meta_graph.graph_def), shard_ops) - shard_ops
        if all("Dataset" in types[name] for name in reached) and not sharded_functions:
            raise RewriteError(
                "parallax.shard() was used, but no op of the graph reads its shard id, not even a one-shot "
                "iterator's dataset function, so every replica would read the same data. Build the iterator "
                "from the sharded dataset (tf.compat.v1.data.make_initializable_iterator or make_one_shot_iterator)")
    indices = _collected(meta_graph, REPLICA_INDEX) | ({shard_id_op} if shard_id_op else set())
    counts = _collected(meta_graph, REPLICA_COUNT) | ({num_shards_op} if num_shards_op else set())
    roles = classify(meta_graph.graph_def, plan, extra_inputs=shard_ops | indices | counts)
    replicated = roles.replicated | shard_ops | indices | counts
    first_replica = plan.first_replica(task.worker_index)
    stage_devices = plan.stage_devices(task.worker_index)
    # with pipeline stages, an op on stage s of replica 0 goes to stage s of its replica
    stage_maps = [dict(zip(stage_devices[0], r)) if plan.pipeline.stages > 1 else {} for r in stage_devices]

    new_nodes = []
    for node in meta_graph.graph_def.node:
        if node.name.startswith(REPLICA_PREFIX):
            raise RewriteError(f'op "{node.name}" already uses the prefix "{REPLICA_PREFIX}" '
                               "that Parallax reserves for replica copies; rename it")
        if node.name not in replicated:
            shared = node_def_pb2.NodeDef()
            shared.CopyFrom(node)
            if not shared.device:
                shared.device = worker.shared_device
            inputs = []
            for text in node.input:
                name, index, control = parse_input(text)
                if control and name in replicated:
                    inputs.extend(format_input(replica_op_name(name, r), 0, True)
                                  for r in range(len(devices)))
                else:
                    inputs.append(text)
            del shared.input[:]
            shared.input.extend(inputs)
            new_nodes.append(shared)
            continue
        for r, device in enumerate(devices):
            copy = copy_op(node, replica_op_name(node.name, r),
                           lambda op: replica_op_name(op, r) if op in replicated else None,  # noqa: B023 (used now)
                           lambda frame: replica_frame_name(frame, r))  # noqa: B023
            copy.device = stage_maps[r].get(node.device) or replica_device(node.device, device)
            if node.name in counts:
                _set_const(copy, plan.num_replicas)
            elif node.name in indices:
                _set_const(copy, first_replica + r)
            new_nodes.append(copy)
    del out.graph_def.node[:]
    out.graph_def.node.extend(new_nodes)
    _shard_dataset_functions(out, sharded_functions, (num_shards_op, shard_id_op), replicated, plan.num_replicas,
                             first_replica, len(devices))
    _write_from_first_replica(out, replicated, devices, frozenset(v.name for v in plan.variables if v.summed))
    _own_random_streams(out, replicated, first_replica, len(devices))
    _extend_table_initializers(out, replicated, len(devices))
    return out


def _sharded_functions(meta_graph: meta_graph_pb2.MetaGraphDef, shard_ops) -> set[str]:
    """The library functions that hold copies of the shard constants (a one-shot iterator's
    ``dataset_factory`` captures them by value)."""
    return {f.signature.name for f in meta_graph.graph_def.library.function
            if any(n.op == "Const" and n.name in shard_ops for n in f.node_def)}


def _shard_dataset_functions(meta_graph: meta_graph_pb2.MetaGraphDef, functions: set[str],
                             shard_ops: tuple[str | None, str | None], replicated: frozenset[str],
                             num_replicas: int, first_replica: int, num_local: int) -> None:
    """A one-shot iterator's dataset function gets one copy per local replica, with the shard
    count and that replica's global index in place of ``parallax.shard``'s constants, and each
    replica's iterator uses its copy (``<function>_parallax_replica_<r>``)."""
    num_shards_op, shard_id_op = shard_ops
    if not functions:
        return
    library = {f.signature.name: f for f in meta_graph.graph_def.library.function}
    copies = []
    for name in sorted(functions):
        for r in range(num_local):
            copy = type(library[name])()
            copy.CopyFrom(library[name])
            copy.signature.name = replica_function_name(name, r)
            for node in copy.node_def:
                if node.op == "Const" and node.name == num_shards_op:
                    _set_const(node, num_replicas)
                elif node.op == "Const" and node.name == shard_id_op:
                    _set_const(node, first_replica + r)
            copies.append(copy)
    meta_graph.graph_def.library.function.extend(copies)
    for node in meta_graph.graph_def.node:
        for value in node.attr.values():
            if value.HasField("func") and value.func.name in functions:
                original = node.name
                r = copy_replica(original)
                if r == 0 and original not in replicated:
                    raise RewriteError(f'op "{original}" reads a dataset sharded with parallax.shard() but is not '
                                       "copied per replica; build its iterator from the replicas' input")
                value.func.name = replica_function_name(value.func.name, r)


#: Stateless random ops: the index of their ``seed`` input.
_STATELESS_SEED_INPUT = {"StatelessRandomGetKeyCounter": 0, "StatelessRandomGetKeyCounterAlg": 0,
                         "StatelessRandomUniform": 1, "StatelessRandomNormal": 1, "StatelessTruncatedNormal": 1,
                         "StatelessRandomUniformInt": 1, "StatelessRandomUniformFullInt": 1,
                         "StatelessRandomBinomial": 1, "StatelessRandomGammaV2": 1, "StatelessRandomPoisson": 1,
                         "StatelessParameterizedTruncatedNormal": 1, "StatelessMultinomial": 2}
_SEED_STRIDE, _SEED2_STRIDE = 933199, 7919


def _own_random_streams(meta_graph: meta_graph_pb2.MetaGraphDef, replicated: frozenset[str], first_replica: int,
                        num_local: int) -> None:
    """Each replica its own random numbers (see the module docstring)."""
    import tensorflow as tf
    from tensorflow.python.framework import tensor_util

    added = []
    exact = _collected(meta_graph, EXACT_DRAWS)  # draws of the union batch's shape, each replica its rows: one seed
    for node in meta_graph.graph_def.node:
        original = node.name.split("/", 1)[1] if node.name.startswith(REPLICA_PREFIX) else node.name
        drawn = original.split("/", 1)[1] if original.startswith(MICRO_PREFIX) else original  # a micro-batch's copy
        if original not in replicated or drawn in exact:
            continue
        index = first_replica + copy_replica(node.name)
        if index == 0:
            continue
        if node.op in STATEFUL_DRAWS and (node.attr["seed"].i or node.attr["seed2"].i):
            node.attr["seed2"].i = (node.attr["seed2"].i + index * _SEED2_STRIDE) % (2**31 - 1)
        elif node.op in _STATELESS_SEED_INPUT:
            position = _STATELESS_SEED_INPUT[node.op]
            dtype = tf.dtypes.as_dtype(node.attr["Tseed"].type)
            offset_name, seed_name = replica_seed_ops(node.name)
            offset = node_def_pb2.NodeDef(name=offset_name, op="Const", device=node.device)
            offset.attr["dtype"].type = dtype.as_datatype_enum
            offset.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto([index * _SEED_STRIDE, 0], dtype=dtype))
            seeded = node_def_pb2.NodeDef(name=seed_name, op="AddV2", device=node.device,
                                          input=[node.input[position], offset.name])
            seeded.attr["T"].type = dtype.as_datatype_enum
            node.input[position] = seeded.name
            added.extend([offset, seeded])
    add_nodes(meta_graph.graph_def, added)


#: Writes that add to a variable: every replica's counts in a summed variable (a metric's state).
_ADDS = ("AssignAddVariableOp", "AssignSubVariableOp")


def _adds_to_summed(nodes: dict, summed: frozenset[str], names: list[str]) -> None:
    """Make ``assign(v, v + delta)`` of a summed variable (how a Keras 3 metric adds to its state)
    ``assign_add(v, delta)``, in place: several replicas' adds to one variable in one step then all count
    (an add is atomic; a read then an assign would lose one of two)."""
    for name in names:
        node = nodes.get(name)
        if node is None or written_variable(node, nodes) not in summed:
            continue
        delta = added_to_itself(node, nodes)
        if delta is not None:
            node.op = "AssignAddVariableOp"
            node.input[1] = delta
            node.attr.pop("validate_shape", None)


def _write_from_first_replica(meta_graph: meta_graph_pb2.MetaGraphDef, replicated: frozenset[str],
                              devices: tuple[str, ...], summed: frozenset[str]) -> None:
    """Replicas other than 0 do not write shared variables (see the module docstring), except their adds to a
    ``summed`` variable (a metric's state, :attr:`parallax.plan.model.VariablePlacement.summed`), each replica's
    part counted as one device counts it."""
    if len(devices) < 2:
        return
    nodes = node_map(meta_graph.graph_def)  # replica 0's copies keep the original names
    if summed:
        copies = [replica_op_name(name, r) for name in replicated for r in range(1, len(devices))]
        _adds_to_summed(nodes, summed, [*replicated, *copies])
    writers = [name for name in replicated
               if (var := written_variable(nodes[name], nodes)) is not None and var not in replicated
               and not (var in summed and nodes[name].op in _ADDS)]
    for r in range(1, len(devices)):  # a copy that returns its variable reads it after replica 0's write
        make_no_op(meta_graph.graph_def, {replica_op_name(name, r) for name in writers}, devices[r],
                   "a write of a shared variable that only replica 0 runs; read the variable instead",
                   after={replica_op_name(name, r): name for name in writers})
    for name in writers:  # and replica 0's write waits for what every replica's would wait for (their reads)
        node = nodes[name]
        waited = [op for op, _, control in map(parse_input, node.input) if control and op in replicated]
        node.input.extend(format_input(replica_op_name(op, r), 0, True)
                          for op in waited for r in range(1, len(devices)))


def _extend_table_initializers(meta_graph: meta_graph_pb2.MetaGraphDef, replicated: frozenset[str],
                               num_replicas: int) -> None:
    key = "table_initializer"
    if key not in meta_graph.collection_def:
        return
    values = meta_graph.collection_def[key].node_list.value
    extra = [replica_op_name(parse_input(v)[0], r) for v in values if parse_input(v)[0] in replicated
             for r in range(1, num_replicas)]
    values.extend(extra)
