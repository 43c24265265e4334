"""Pass: pipeline stages and micro-batches inside a replica (``Plan.pipeline``).

Stages. Every op that computes a replica's step gets the device of its stage:

* a forward op (an ancestor of the gradients outside ``gradients`` scopes) that
  computes with a variable (a ``MatMul`` with its kernel) the variable's stage
  (model parallelism: the layer runs where its weights are); another the stage
  its position in the forward order falls in, between the plan's cuts
  (:mod:`parallax.plan.stages`);
* a backward op ``gradients/<forward op>_grad/...`` its forward op's stage;
  other backward ops (sums of gradient contributions) the latest stage of
  their inputs;
* a variable the stage the plan gives it, and so do the ops colocated with it
  (its slots, initializers and update ops: the update runs where the variable is).

Micro-batches (``micro_batches = m > 1``). Each batch input of the replica (an
output of a placeholder or of ``IteratorGetNext`` that is not a scalar) is split
along its first axis into ``m`` parts (``parallax_pipeline/split/<op>_<k>``);
every op computed from them is copied once per micro-batch
(``parallax_micro_<j>/<name>``, loop frames renamed with it), each copy on its
stage's device. Variable reads, constants and other ops computed from no
batch input are shared by the copies. Then each original op name is taken by
an op that combines its copies, so that everything outside reads the whole
batch's value as before:

* a variable's gradient: the mean of the micro-batches' gradients (a sparse
  one: their values, divided by ``m``, and indices concatenated), so that the
  one update sees the gradient of the whole batch, as on one device, when the
  loss is a mean over the batch;
* another tensor whose first dimension is the batch's (statically unknown, or
  the input's): the copies concatenated in micro-batch order (predictions);
* another floating-point tensor: their mean (a loss, an accuracy);
* anything else (shapes, counts, handles): micro-batch 0's value.

A traced step's random draws that take their part's rows of one device's draw
(:mod:`parallax.tf2.draws`) take, in micro-batch ``j``, its own rows: from the
part's first row plus ``j`` times the micro-batch's rows, of the whole batch's
examples (the part's marks by their original names, which the first step's
check feeds).

Ops inside a ``tf.while_loop`` get no combiner (nothing outside a loop may
read them). The copies of micro-batches ``1 .. m-1`` of an op that writes a
shared variable (batch-norm moving statistics) become ``NoOp``s: micro-batch
0 writes it, as replica 0 does for replicas.

TensorFlow runs each op once its inputs are there, so while stage ``s`` works
on micro-batch ``j``, stage ``s+1`` can work on ``j-1``: the pipeline comes from
the dataflow, without a hand-made schedule.
"""

from __future__ import annotations

import re

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import node_def_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.python.framework import tensor_util

from parallax.analysis import VARIABLE_OP_TYPES
from parallax.errors import RewriteError
from parallax.graph.graph_ops import (
    add_nodes,
    ancestors,
    colocated_with,
    consumers,
    copy_op,
    descendants,
    format_input,
    make_no_op,
    node_map,
    op_of,
    parse_input,
    replica_device,
    written_variable,
)
from parallax.graph.names import PART_MARKS, PIPELINE_PREFIX, micro_op_name
from parallax.logs import log as logger
from parallax.plan.model import Plan, TaskSpec
from parallax.plan.stages import stage_of
from parallax.rewrite.classify import classify, is_input_op

__all__ = ["split_micro_batches", "op_stages"]

_GRADIENT_SCOPE = re.compile(r"(^|/)gradients(_\d+)?/")
_BATCH_SOURCES = ("Placeholder", "PlaceholderV2", "IteratorGetNext", "IteratorGetNextSync")
_UNCOMBINED = (tf.resource, tf.variant)
_READS = ("Identity", "ReadVariableOp")


def split_micro_batches(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec
                        ) -> meta_graph_pb2.MetaGraphDef:
    """Place stages and copy micro-batches (see the module docstring). Returns a new MetaGraphDef.

    Raises:
        RewriteError: a batch input's static size is not a multiple of ``micro_batches``, the
            gradients come from no batch input, or an op outside the micro-batches reads a
            loop's op that is copied.
    """
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    spec = plan.pipeline
    if not spec.active:
        return out
    graph_def = out.graph_def
    nodes = node_map(graph_def)
    roles = classify(graph_def, plan)
    devices = plan.stage_devices(task.worker_index)[0]
    stages = op_stages(graph_def, plan, roles.replicated)
    for node in graph_def.node:
        if node.name in stages:
            node.device = replica_device(node.device, devices[stages[node.name]])
    if spec.micro_batches == 1:
        return out
    m = spec.micro_batches
    inputs = {n for n in roles.replicated if is_input_op(nodes[n].op)}
    input_side = ancestors(nodes, inputs) & roles.replicated
    sources = sorted(n for n in input_side if nodes[n].op in _BATCH_SOURCES)
    copied = descendants(consumers(graph_def), sources) & roles.replicated - input_side
    info = _tensor_info(graph_def)
    splits, split_nodes = _splits(nodes, sources, copied, info, m, devices[0])
    if not splits:
        raise RewriteError(f"micro_batches={m} splits each batch input (a placeholder or a tf.data iterator's "
                           "get_next() that is not a scalar) along its first axis, but the gradients are computed "
                           "from none; feed the batch through one, or leave micro_batches at 1")
    loops = _in_loops(graph_def)
    gradient_means, sparse_values, sparse_indices = _gradient_tensors(plan)
    batch = {info[f"{s}:{k}"][1][0] for s, k in splits if info[f"{s}:{k}"][1]}
    writers = {name for name in copied if (v := written_variable(nodes[name], nodes)) is not None
               and v not in copied}
    new_nodes = []
    for node in graph_def.node:
        if node.name not in copied:
            new_nodes.append(node)
            continue
        for j in range(m):
            new_nodes.append(_micro_copy(node, j, copied, splits))
        if node.name not in loops:
            new_nodes.extend(_combiner(node, info, m, batch, gradient_means, sparse_values, sparse_indices))
    if task.worker_index == 0:
        _warn_batch_statistics(nodes, copied, m)
    del graph_def.node[:]
    graph_def.node.extend(split_nodes + new_nodes)
    _check_loop_readers(graph_def, copied & loops)
    _micro_parts(out, copied, m, devices[0])
    _write_from_first_micro_batch(graph_def, writers, m)
    if spec.schedule == "1f1b" and spec.stages > 1:
        _one_forward_one_backward(graph_def, copied, stages, loops, spec.stages, m)
    return out


def op_stages(graph_def, plan: Plan, replicated) -> dict[str, int]:
    """The stage of every op that runs on a stage's device (see the module docstring)."""
    spec = plan.pipeline
    nodes = node_map(graph_def)
    variables = {n.name for n in graph_def.node if n.op in VARIABLE_OP_TYPES}
    gradient_ops = {op_of(t) for v in plan.variables if v.gradient for t in (v.gradient.tensor, v.gradient.indices)
                    if t}
    forward_set = ancestors(nodes, gradient_ops, stop=variables)
    forward = [n.name for n in graph_def.node if n.name in forward_set and not _GRADIENT_SCOPE.search(n.name)]
    position = {name: i for i, name in enumerate(forward)}
    missing = [c for c in spec.cuts if c not in position]
    if missing:
        raise RewriteError(f"the plan cuts the pipeline at {missing}, which are not forward ops of this graph")
    cut_positions = [position[c] for c in spec.cuts]
    stages: dict[str, int] = {name: stage_of(position, cut_positions, name) for name in position}
    held = {v.name: v.stage for v in plan.variables}
    for name in forward:  # the ops that compute with a variable run where it is (model parallelism)
        read = [held[v] for v in _variables_read(nodes[name], nodes) if v in held]
        if read and nodes[name].op not in _READS:
            stages[name] = max(read)
    stages.update(held)
    for node in graph_def.node:
        target = colocated_with(node.attr["_class"].list.s) if "_class" in node.attr else []
        handle = [parse_input(t)[0] for t in node.input[:1] if parse_input(t)[0] in held]
        if handle and nodes[handle[0]].op in VARIABLE_OP_TYPES:
            stages[node.name] = held[handle[0]]  # reads, writes and initializers of a variable sit with it
        elif node.name in stages:
            continue
        elif target and target[0] in held:
            stages[node.name] = held[target[0]]
        elif node.name in replicated:
            stages[node.name] = _backward_stage(node, stages, spec.stages)
    return stages


def _variables_read(node, nodes) -> list[str]:
    """The variables ``node`` takes as data inputs, directly or through a read op."""
    out = []
    for text in node.input:
        name, _, control = parse_input(text)
        if control or name not in nodes:
            continue
        source = nodes[name]
        if source.op in _READS and source.input:
            source = nodes.get(parse_input(source.input[0])[0], source)
        if source.op in VARIABLE_OP_TYPES:
            out.append(source.name)
    return out


def _backward_stage(node, stages: dict[str, int], count: int) -> int:
    """A backward op's forward op's stage, or the latest stage of its inputs (the last stage when
    none has one: the loss's gradient starts there)."""
    match = _GRADIENT_SCOPE.search(node.name)
    if match:
        rest = node.name[match.end():]
        at = rest.find("_grad/")
        while at >= 0:
            if rest[:at] in stages:
                return stages[rest[:at]]
            at = rest.find("_grad/", at + 1)
    known = [stages[parse_input(t)[0]] for t in node.input if parse_input(t)[0] in stages]
    return max(known) if known else count - 1


def _tensor_info(graph_def) -> dict[str, tuple[tf.DType, list | None]]:
    """Dtype and static shape of every output, by tensor name (from the graph, imported)."""
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return {t.name: (t.dtype, t.shape.as_list() if t.shape.rank is not None else None)
            for op in graph.get_operations() for t in op.outputs}


def _splits(nodes, sources, copied, info, m: int, device: str):
    """The split of each batch input the copies read: ``{(op, output): split op name}`` and the ops."""
    wanted = sorted({(name, index) for c in copied for name, index, control in map(parse_input, nodes[c].input)
                     if name in sources and not control})
    splits, made = {}, []
    for name, index in wanted:
        dtype, shape = info[f"{name}:{index}"]
        if shape is not None and len(shape) == 0:
            continue  # a scalar (a keep-probability): every micro-batch reads it whole
        if shape and shape[0] is not None and shape[0] % m:
            raise RewriteError(f'micro_batches={m} splits the batch of "{name}:{index}" along its first axis, '
                               f"but its static size is {shape[0]}; feed a multiple of {m} (or a shape of None)")
        split = f"{PIPELINE_PREFIX}/split/{name}_{index}"
        axis = node_def_pb2.NodeDef(name=split + "/axis", op="Const", device=device)
        axis.attr["dtype"].type = types_pb2.DT_INT32
        axis.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(0, tf.int32))
        node = node_def_pb2.NodeDef(name=split, op="Split", device=device,
                                    input=[axis.name, format_input(name, index, False)])
        node.attr["num_split"].i = m
        node.attr["T"].type = dtype.as_datatype_enum
        made.extend([axis, node])
        splits[name, index] = split
    return splits, made


def _micro_copy(node, j: int, copied, splits) -> node_def_pb2.NodeDef:
    return copy_op(node, micro_op_name(node.name, j), lambda op: micro_op_name(op, j) if op in copied else None,
                   lambda frame: micro_op_name(frame, j),
                   lambda op, index: format_input(splits[op, index], j, False) if (op, index) in splits else None)


def _gradient_tensors(plan: Plan) -> tuple[set[str], set[str], set[str]]:
    means, values, indices = set(), set(), set()
    for v in plan.variables:
        if v.gradient is None:
            continue
        if v.sparse:
            values.add(v.gradient.tensor)
            indices.add(v.gradient.indices)
        else:
            means.add(v.gradient.tensor)
    return means, values, indices


def _combiner(node, info, m: int, batch: set, means: set[str], values: set[str], indices: set[str]):
    """The ops that take ``node``'s name and combine its micro-batch copies (module docstring)."""
    outputs = []
    index = 0
    while f"{node.name}:{index}" in info:
        outputs.append(f"{node.name}:{index}")
        index += 1
    device = node.device
    waits = [format_input(micro_op_name(node.name, j), 0, True) for j in range(m)]
    if not outputs:
        return [node_def_pb2.NodeDef(name=node.name, op="NoOp", device=device, input=waits)]
    made, results = [], []
    for k, tensor in enumerate(outputs):
        dtype, shape = info[tensor]
        name = node.name if len(outputs) == 1 else f"{node.name}/parallax_output_{k}"
        copies = [format_input(micro_op_name(node.name, j), k, False) for j in range(m)]
        if tensor in means:
            how = "mean"
        elif tensor in values:
            how = "concat_mean"
        elif tensor in indices:
            how = "concat"
        elif dtype in _UNCOMBINED or dtype.base_dtype in _UNCOMBINED:
            how = "first"
        elif shape and (shape[0] is None or shape[0] in batch):
            how = "concat"
        elif dtype.is_floating:
            how = "mean"
        else:
            how = "first"
        made.extend(_combine(name, how, copies, dtype, device))
        results.append((format_input(name, 0, False), dtype))
    if len(outputs) > 1:
        identity = node_def_pb2.NodeDef(name=node.name, op="IdentityN", device=device,
                                        input=[t for t, _ in results])
        identity.attr["T"].list.type.extend([d.as_datatype_enum for _, d in results])
        made.append(identity)
    return made


def _op(name: str, op_type: str, inputs: list[str], device: str, **types) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op=op_type, device=device, input=inputs)
    for key, value in types.items():
        node.attr[key].type = value
    return node


def _const(name: str, value, dtype: tf.DType, device: str) -> node_def_pb2.NodeDef:
    node = _op(name, "Const", [], device, dtype=dtype.as_datatype_enum)
    node.attr["value"].tensor.CopyFrom(tensor_util.make_tensor_proto(np.array(value, dtype.as_numpy_dtype)))
    return node


def _micro_parts(meta_graph: meta_graph_pb2.MetaGraphDef, copied: set[str], m: int, device: str) -> None:
    """Each micro-batch's copies of the part's random draws read its own start (see the module docstring), in
    place; nothing where the step has no marks of its part. (Every copy of the union's examples is the whole
    batch's already: a scalar no split reaches.)"""
    _, start, rows = PART_MARKS
    if not all(mark in copied for mark in PART_MARKS):
        return
    graph_def = meta_graph.graph_def
    int32 = types_pb2.DT_INT32
    made, rewire = [], {}
    for j in range(m):
        scope = micro_op_name(f"{PIPELINE_PREFIX}/part", j)
        index = _const(f"{scope}/index", j, tf.int32, device)
        ahead = _op(f"{scope}/ahead", "Mul", [micro_op_name(rows, j), index.name], device, T=int32)
        mine = _op(f"{scope}/start", "AddV2", [start, ahead.name], device, T=int32)
        made.extend([index, ahead, mine])
        rewire[micro_op_name(start, j)] = mine.name
    prefixes = tuple(micro_op_name("", j) for j in range(m))
    for node in graph_def.node:
        if node.name.startswith(prefixes):
            for i, text in enumerate(node.input):
                op, index, control = parse_input(text)
                if op in rewire:
                    node.input[i] = format_input(rewire[op], index, control)
    add_nodes(graph_def, made)


def _combine(name: str, how: str, copies: list[str], dtype: tf.DType, device: str) -> list:
    def op(op_name: str, op_type: str, inputs: list[str], **types) -> node_def_pb2.NodeDef:
        return _op(op_name, op_type, inputs, device, **types)

    def const(op_name: str, value, const_dtype: tf.DType) -> node_def_pb2.NodeDef:
        return _const(op_name, value, const_dtype, device)

    t = dtype.as_datatype_enum
    m = len(copies)
    if how == "first":
        return [op(name, "Identity", copies[:1], T=t)]
    if how in ("concat", "concat_mean"):
        joined = name if how == "concat" else f"{name}/parallax_concat"
        axis = const(f"{joined}/parallax_axis", 0, tf.int32)
        concat = op(joined, "ConcatV2", copies + [axis.name], T=t, Tidx=types_pb2.DT_INT32)
        concat.attr["N"].i = m
        if how == "concat":
            return [axis, concat]
        scale = const(f"{name}/parallax_scale", 1.0 / m, dtype)
        return [axis, concat, scale, op(name, "Mul", [joined, scale.name], T=t)]
    total = op(f"{name}/parallax_sum", "AddN", copies, T=t)
    total.attr["N"].i = m
    scale = const(f"{name}/parallax_scale", 1.0 / m, dtype)
    return [total, scale, op(name, "Mul", [total.name, scale.name], T=t)]


_FUSED_NORMS = ("FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3")


def batch_statistics(nodes, names) -> list[str]:
    """Ops among ``names`` that normalise by the batch's own statistics: fused batch norm in training,
    and ``tf.nn.moments``."""
    found = []
    for name in sorted(names):
        node = nodes[name]
        if node.op in _FUSED_NORMS and node.attr["is_training"].b:
            found.append(name)
        elif node.op == "Mean" and re.search(r"(^|/)moments(_\d+)?/mean$", name):
            found.append(name)
    return found


def _warn_batch_statistics(nodes, copied: set[str], m: int) -> None:
    found = batch_statistics(nodes, copied)
    if found:
        logger.warning("Parallax: micro_batches=%d: the batch statistics of %s are computed per micro-batch: each "
                       "micro-batch is normalised by its own (as GPipe does), so training differs from one device "
                       "on the whole batch. micro_batches=1 (stages alone) keeps it equal", m, ", ".join(found[:3]) +
                       (f" and {len(found) - 3} more" if len(found) > 3 else ""))


def _one_forward_one_backward(graph_def, copied: set[str], stages: dict[str, int], loops: set[str], k: int,
                              m: int) -> None:
    """The 1F1B schedule: on stage ``s``, micro-batch ``j``'s forward waits for micro-batch
    ``j - (k - s)``'s backward there, so at most ``k - s`` micro-batches' activations are kept."""
    nodes = {n.name: n for n in graph_def.node}
    backward = {name for name in copied if _GRADIENT_SCOPE.search(name)}
    forward = copied - backward
    outside = {name for name in copied if name not in loops or nodes[micro_op_name(name, 0)].op in ("Enter",
                                                                                                     "RefEnter")}
    for s in range(k):
        stage_forward = {name for name in forward if stages.get(name) == s}
        entries = sorted(name for name in stage_forward & outside
                         if not any(parse_input(t)[0] in stage_forward for t in _original_inputs(nodes, name)))
        mine = {name for name in backward - loops if stages.get(name) == s}
        read = {parse_input(t)[0] for name in mine for t in _original_inputs(nodes, name)}
        exits = sorted(mine - read)
        ahead = k - s
        for j in range(ahead, m):
            waits = [format_input(micro_op_name(e, j - ahead), 0, True) for e in exits]
            for entry in entries:
                nodes[micro_op_name(entry, j)].input.extend(waits)


def _original_inputs(nodes, name: str) -> list[str]:
    """The inputs of micro-batch 0's copy of ``name``, by their original names."""
    prefix = micro_op_name("", 0)
    return [t.replace(prefix, "", 1) if t.lstrip("^").startswith(prefix) else t
            for t in nodes[micro_op_name(name, 0)].input]


def _in_loops(graph_def) -> set[str]:
    """Ops inside a ``tf.while_loop`` (from its ``Enter`` ops to, not including, its ``Exit`` ops)."""
    nodes = node_map(graph_def)
    exits = {n.name for n in graph_def.node if n.op in ("Exit", "RefExit")}
    enters = [n.name for n in graph_def.node if n.op in ("Enter", "RefEnter")]
    inside = descendants(consumers(graph_def), enters, stop=exits)
    return {n for n in inside if n in nodes}


def _check_loop_readers(graph_def, copied_in_loops: set[str]) -> None:
    for node in graph_def.node:
        for text in node.input:
            if parse_input(text)[0] in copied_in_loops:
                raise RewriteError(f'op "{node.name}" reads "{parse_input(text)[0]}" inside a loop that '
                                   "micro-batches copy; nothing outside the loop may read it")


def _write_from_first_micro_batch(graph_def, writers: set[str], m: int) -> None:
    """Micro-batches ``1 .. m-1`` do not write shared variables (see the module docstring)."""
    device_of = {n.name: n.device for n in graph_def.node}
    by_device: dict[str, set[str]] = {}
    for name in writers:
        for j in range(1, m):
            copy = micro_op_name(name, j)
            by_device.setdefault(device_of[copy], set()).add(copy)
    for device, names in sorted(by_device.items()):  # a copy that returns its variable reads it after micro-batch 0's
        make_no_op(graph_def, names, device,
                   "a write of a shared variable that only micro-batch 0 runs; read the variable instead",
                   after={micro_op_name(n, j): micro_op_name(n, 0) for n in writers for j in range(1, m)
                          if micro_op_name(n, j) in names})
