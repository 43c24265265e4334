"""Pass: shard the optimizer's state over the workers that all-reduce (ZeRO stages 1 and 2).

For every variable the plan marks ``sharded`` (dense, all-reduced, with optimizer slots;
:func:`parallax.plan.policies.shardable`) of ``n`` elements, with ``W`` workers and
``m = ceil(n / W)``, worker ``k`` owns elements ``[k m, (k+1) m)`` of the variable
flattened (the last part padded with zeros). In each worker's graph:

1. ``parallax_zero/<v>/part``: a variable of ``m`` elements, this worker's part of
   ``<v>``, refreshed from ``<v>`` at each step (``.../refresh``: so it follows every
   other write of ``<v>``: the start-up broadcast, a restore, the user's own assignments);
2. ``parallax_zero/<v>/slot_<i>``: this worker's part of each of the update's slots
   (Adam's two moments, momentum's accumulator, ...), initialised as the slot was (a
   constant fill). The whole slot stays in the graph but is never initialised or run:
   a resource variable takes no memory until it is assigned, and it is taken out of the
   graph's variable collections (so neither the initialisation, the readiness check nor
   the checkpoint saver touch it);
3. ``parallax_zero/<v>/apply``: the update op, copied, on these parts, with this worker's
   part of the gradient: stage 1 slices it out of the all-reduced gradient
   (``.../grad_part``); at stage 2 the aggregation pass already reduce-scattered it
   (:mod:`parallax.rewrite.aggregate`), and the ops between it and the update (clipping
   by global norm, a scale) run on the part: an ``L2Loss`` of it (a global norm's term)
   is summed over the workers (``parallax_zero/norms/``), so it is the whole gradient's;
4. ``parallax_zero/allgather/``: every worker's updated parts, gathered (one call per variable,
   after the step's other collectives; no buffer of all of them is ever made); each variable
   then takes its new value
   (``parallax_zero/<v>/assign``). The original update op becomes a ``NoOp`` that waits
   for the assignment, so whatever waited for the update (the global step's increment,
   Adam's powers, the training op) still does.

Dense ``Apply*``/``ResourceApply*`` updates are supported whatever the optimizer: the op's own signature says
which inputs are slots (references or resources other than ``var``), which is the gradient (``grad``, ``delta``)
and which are hyperparameters (scalars). An update of element-wise ops (Keras 3's) is copied onto the parts
instead of one op (:mod:`parallax.rewrite.zero_regions`).
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2, types_pb2
from tensorflow.core.protobuf import meta_graph_pb2
from tensorflow.python.framework import op_def_registry

from parallax.comm.base import NO_SHARDS
from parallax.comm.registry import backend_for
from parallax.errors import RewriteError
from parallax.graph.graph_ops import add_nodes, canonical, consumers, node_map, parse_input, rewire_inputs
from parallax.graph.names import AGGREGATE_PREFIX, ZERO_PREFIX, aggregate_outputs, zero_scope
from parallax.plan.model import Plan, TaskSpec, VariablePlacement, part_sizes
from parallax.rewrite.aggregate import build_subgraph
from parallax.rewrite.zero_regions import (
    RegionUpdate,
    copy_region,
    find_region,
    retire_region,
    rows_part,
    static_shapes,
)

__all__ = ["shard_optimizer_states", "held_in_parts", "sharded_slots", "ELEMENTWISE_OPS", "ZERO_SLOTS"]

#: The collection of the rewritten graph naming each sharded slot and this worker's part of it.
ZERO_SLOTS = "parallax_zero_slots"

#: Ops a gradient's part may pass through between the reduce-scatter and the update at stage 2
#: (their other inputs must be scalars): what clipping and scaling do.
ELEMENTWISE_OPS = frozenset({"Identity", "Mul", "RealDiv", "Div", "Neg", "Cast", "Maximum", "Minimum",
                             "ClipByValue", "AddV2", "Add", "Sub", "Snapshot"})
_RESOURCE_VARIABLES = frozenset({"VarHandleOp"})
_REF_VARIABLES = frozenset({"VariableV2", "Variable"})
_COLLECTIVE_OPS = ("PyFunc", "Collective", "Horovod", "ParallaxMpi")


class _Update:
    """A sharded variable's update op, read through its signature."""

    def __init__(self, var: VariablePlacement, node: node_def_pb2.NodeDef, nodes: dict) -> None:
        self.var = var
        self.node = node
        op_def = op_def_registry.get(node.op)
        data = [t for t in node.input if not t.startswith("^")]
        if op_def is None or len(data) != len(op_def.input_arg):
            raise RewriteError(f'zero_stage: cannot read the update "{node.name}" ({node.op}) of "{var.name}"')
        self.slots: list[tuple[int, str]] = []
        self.grad_index = -1
        for i, arg in enumerate(op_def.input_arg):
            if arg.name in ("grad", "delta"):
                self.grad_index = i
            elif i > 0 and (arg.is_ref or arg.type == types_pb2.DT_RESOURCE):
                self.slots.append((i, _variable_source(data[i], nodes)))
        if self.grad_index < 0 or any(s is None for _, s in self.slots):
            raise RewriteError(f'zero_stage: the update "{node.name}" ({node.op}) of "{var.name}" has no gradient '
                               "input or a slot that is not a variable")
        source = nodes[var.name]
        self.resource = source.op in _RESOURCE_VARIABLES
        self.dtype = tf.dtypes.as_dtype(source.attr["dtype"].type)
        self.grad = data[self.grad_index]


def _variable_source(text: str, nodes: dict) -> str | None:
    name = parse_input(text)[0]
    while name in nodes:
        node = nodes[name]
        if node.op in _RESOURCE_VARIABLES | _REF_VARIABLES:
            return name
        if node.op not in ("Identity", "RefIdentity") or not node.input:
            return None
        name = parse_input(node.input[0])[0]
    return None


def _find_updates(graph_def: graph_pb2.GraphDef, nodes: dict, plan: Plan,
                  sharded: list[VariablePlacement]) -> list[_Update | RegionUpdate]:
    found: dict[str, list[node_def_pb2.NodeDef]] = {v.name: [] for v in sharded}
    for node in graph_def.node:
        if node.op.startswith(("Apply", "ResourceApply")) and node.input:
            target = _variable_source(node.input[0], nodes)
            if target in found:
                found[target].append(node)
    updates: list[_Update | RegionUpdate] = []
    shapes = None
    for v in sharded:
        if not found[v.name]:  # an update of element-wise ops (Keras 3's optimizers)
            shapes = shapes if shapes is not None else static_shapes(graph_def)
            region = find_region(graph_def, nodes, v, [s.name for s in plan.variables if s.slot_of == v.name],
                                 shapes)
            if region is not None:
                if plan.zero_stage == 2:
                    raise RewriteError(f'zero_stage=2: the update of "{v.name}" is made of element-wise ops (a '
                                       "Keras 3 optimizer), whose gradient is all-reduced whole: use zero_stage=1")
                updates.append(region)
                continue
        if len(found[v.name]) != 1:
            what = ("no dense Apply/ResourceApply op and no update scope of its own") if not found[v.name] else \
                f"{len(found[v.name])} ops ({', '.join(n.name for n in found[v.name])})"
            raise RewriteError(f'zero_stage: "{v.name}" is updated by {what}; sharding its optimizer state needs '
                               "exactly one. Leave it whole with plan_overrides, or use zero_stage=0")
        updates.append(_Update(v, found[v.name][0], nodes))
    return updates


def _fill_value(slot: str, nodes: dict, graph_def: graph_pb2.GraphDef, tensor_ok: bool = False) -> float | str:
    """The constant a slot starts at (its initializer's value); with ``tensor_ok``, else the tensor its initializer
    assigns (a TensorFlow 2 step's slot starts at the program's value); else a RewriteError."""
    assign = next((n for n in graph_def.node if n.op in ("Assign", "AssignVariableOp") and n.input
                   and parse_input(n.input[0])[0] == slot and n.name.startswith(slot + "/")), None)
    name = parse_input(assign.input[1])[0] if assign is not None and len(assign.input) > 1 else ""
    while name in nodes:
        node = nodes[name]
        if node.op == "Const":
            values = np.unique(tf.make_ndarray(node.attr["value"].tensor))
            if values.size == 1:
                return float(values[0])
            break
        if node.op == "Fill" and len(node.input) > 1:
            name = parse_input(node.input[1])[0]
        elif node.op == "Identity" and node.input:
            name = parse_input(node.input[0])[0]
        else:
            break
    if tensor_ok and assign is not None and len(assign.input) > 1:
        op, index, _ = parse_input(assign.input[1])
        return f"{op}:{index}"
    raise RewriteError(f'zero_stage: the optimizer slot "{slot}" does not start at a constant, so its parts cannot '
                       "be initialised on their own; use zero_stage=0")


def held_in_parts(plan: Plan) -> dict[str, str]:
    """The optimizer slots no worker holds whole (each keeps its part), and what to say when a
    program fetches one."""
    if not plan.zero_stage or plan.num_workers < 2:
        return {}
    return {v.name: f"zero_stage={plan.zero_stage} keeps this optimizer slot of {v.slot_of!r} in {plan.num_workers} "
                    f"parts, one on each worker ({ZERO_PREFIX}/{v.slot_of}/slot_<i>), so no worker can fetch it "
                    "whole; use zero_stage=0 to fetch slots"
            for v in plan.variables if v.sharded and v.slot_of is not None}


def _part_of(flat_length: int, workers: int, index: int):
    """A builder: this worker's part of a tensor of ``flat_length`` elements, flattened (elements
    ``[index m, (index+1) m)``, the last parts padded with zeros to ``m``), and ``m``. No copy of the
    whole tensor is made: the part is sliced, then padded."""
    sizes = part_sizes(flat_length, workers)
    m, begin, size = sizes[0], sum(sizes[:index]), sizes[index]

    def part(tensor: tf.Tensor) -> tf.Tensor:
        piece = tf.slice(tf.reshape(tensor, [flat_length]), [begin], [size])
        return tf.pad(piece, [[0, m - size]]) if size < m else piece

    return part, m


def shard_optimizer_states(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec
                           ) -> meta_graph_pb2.MetaGraphDef:
    """Shard the slots of the plan's ``sharded`` variables over the workers (see the module docstring).

    Raises:
        RewriteError: a sharded variable's update cannot be sharded (several updates, a slot
            that does not start at a constant, at stage 2 an op that needs its gradient whole).
    """
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    sharded = [v for v in plan.variables if v.sharded and v.slot_of is None]
    if not plan.zero_stage or not sharded or plan.num_workers < 2:
        return out
    backend = backend_for(plan.comm, plan.num_workers, plan.comm.backend)
    if not backend.supports_shards:
        raise RewriteError(NO_SHARDS.format(backend.name))
    graph_def = out.graph_def
    nodes = node_map(graph_def)
    updates = _find_updates(graph_def, nodes, plan, sharded)
    workers, index = plan.num_workers, task.worker_index
    device = plan.workers[index].shared_device
    norms = _stage2_norms(graph_def, nodes, updates) if plan.zero_stage == 2 else []

    made, slot_parts, outputs, defs = _build_parts(plan, updates, nodes, graph_def, workers, index)
    reads = []
    for u in updates:
        scope = zero_scope(u.var.name)
        refresh = parse_input(outputs[u.var.name]["refresh"])[0]
        if isinstance(u, RegionUpdate):  # its element-wise ops, copied onto the parts
            copies, done = copy_region(u, nodes, scope + "part", slot_parts[u.var.name], outputs[u.var.name]["cut"],
                                       refresh, device)
            reads.append(_read_after(u, scope, done))
            made += [*copies, reads[-1]]
            continue
        apply = node_def_pb2.NodeDef()
        apply.CopyFrom(u.node)
        apply.name = scope + "apply"
        apply.device = device
        data = [t for t in u.node.input if not t.startswith("^")]
        control = [t for t in u.node.input if t.startswith("^")]
        data[0] = scope + "part"
        for (i, _), part in zip(u.slots, slot_parts[u.var.name]):
            data[i] = part
        data[u.grad_index] = outputs[u.var.name]["cut"][u.grad]
        del apply.input[:]
        apply.input.extend(data + control + ["^" + refresh])
        reads.append(_read_after(u, scope, apply.name))
        made += [apply, reads[-1]]
    gathered, values = _gather(plan, updates, [r.name + ":0" for r in reads], norms, graph_def)
    assigns = [_assign(u, zero_scope(u.var.name) + "assign", value, device) for u, value in zip(updates, values)]
    for u, assign in zip(updates, assigns):  # the new value after the forward pass's reads of the old
        if isinstance(u, RegionUpdate):
            assign.input.extend(u.after)
    for node in made + gathered:
        node.device = device
    add_nodes(graph_def, made + gathered + assigns)
    data_read = {parse_input(t)[0] for n in graph_def.node for t in n.input if not t.startswith("^")}
    ops = node_map(graph_def)
    for u, assign in zip(updates, assigns):
        if isinstance(u, RegionUpdate):
            retire_region(u, ops, assign.name)
        else:
            _replace_update(u, assign.name, data_read)
    _drop_slots(out, [s for u in updates for _, s in u.slots], defs)
    out.collection_def[ZERO_SLOTS].bytes_list.value.extend(
        f"{slot}\0{part}".encode() for u in updates for (_, slot), part in zip(u.slots, slot_parts[u.var.name]))
    return out


def sharded_slots(graph) -> list[tuple[str, str]]:
    """``(slot, this worker's part of it)`` of every slot the rewrite sharded, by variable name, from the
    rewritten graph (a ``tf.Graph``) the session runs: what a checkpoint gathers and restores
    (:mod:`parallax.runtime.zero_checkpoint`)."""
    return [tuple((e.decode() if isinstance(e, bytes) else e).split("\0")) for e in graph.get_collection(ZERO_SLOTS)]


def _build_parts(plan: Plan, updates: list, nodes: dict, graph_def, workers: int, index: int):
    """The parts (variables and their refresh), and each update's parts of the tensors it cuts (an ``Apply*``
    op's gradient; a region's whole tensors), built with TF code."""
    names, dtypes, reads = [], [], []
    cuts: dict[str, list[str]] = {}
    starts: dict[str, list[float | str]] = {}
    for u in updates:
        value = u.var.name + ":0"
        if u.resource:  # the whole variable's value, read for its parts
            reads.append(_read(zero_scope(u.var.name) + "whole", u.var.name, u))
            value = reads[-1].name + ":0"
        region = isinstance(u, RegionUpdate)
        cuts[u.var.name] = list(u.whole) if region else [u.grad]
        starts[u.var.name] = [_fill_value(s, nodes, graph_def, tensor_ok=region) for _, s in u.slots]
        summed = u.summed if region else {}
        for t in [value, *cuts[u.var.name], *[t for t in starts[u.var.name] if isinstance(t, str)]]:
            if t in summed:  # a sparse gradient's rows and their indices, which each worker sums into its part
                names += list(summed[t])
                uss = nodes[parse_input(t)[0]]
                dtypes += [tf.dtypes.as_dtype(uss.attr["T"].type), tf.dtypes.as_dtype(uss.attr["Tindices"].type)]
            else:
                names.append(t)
                dtypes.append(u.dtype)
    outputs: dict[str, dict] = {}
    slot_parts: dict[str, list[str]] = {}
    variables: list = []

    def builder(inputs: list[tf.Tensor]) -> list[tf.Tensor]:
        tensors, given = [], iter(inputs)
        for u in updates:
            value = next(given)
            part, m = _part_of(u.var.num_elements, workers, index)
            summed = u.summed if isinstance(u, RegionUpdate) else {}
            # stage 2: the aggregation already left this worker's part of a gradient (flat, m elements)
            cut = [rows_part(next(given), next(given), u.var.shape, workers, index) if t in summed else
                   next(given) if plan.zero_stage == 2 else part(next(given)) for t in cuts[u.var.name]]
            with tf.name_scope(zero_scope(u.var.name)):
                param = tf.compat.v1.Variable(tf.zeros([m], u.dtype), name="part", trainable=False, collections=[],
                                              use_resource=u.resource)
                refresh = tf.compat.v1.assign(param, part(value), name="refresh") if not u.resource else \
                    tf.raw_ops.AssignVariableOp(resource=param.handle, value=part(value), name="refresh")
                slots = [tf.compat.v1.Variable(part(next(given)) if isinstance(start, str) else
                                               tf.fill([m], tf.constant(start, u.dtype)), name=f"slot_{j}",
                                               trainable=False, collections=[], use_resource=u.resource)
                         for j, start in enumerate(starts[u.var.name])]
                parts = [tf.identity(t, name=f"grad_part_{k}" if k else "grad_part") for k, t in enumerate(cut)]
            variables.extend(v.to_proto() for v in (param, *slots))
            slot_parts[u.var.name] = [s.op.name for s in slots]
            outputs[u.var.name] = {"refresh": parse_input(refresh.name)[0]}
            tensors += parts
        return tensors

    made, grads = build_subgraph(builder, dtypes, names, ZERO_PREFIX + "/")
    grads = iter(grads)
    for u in updates:
        outputs[u.var.name]["cut"] = {t: next(grads) for t in cuts[u.var.name]}
    return reads + made, slot_parts, outputs, variables


def _variable_op(u: _Update, name: str, ops: tuple[str, str], inputs: list[str]) -> node_def_pb2.NodeDef:
    """An op on a variable like ``u``'s: ``ops[0]`` for a resource variable (its ``dtype``), ``ops[1]``
    for a ref variable (its ``T``)."""
    node = node_def_pb2.NodeDef(name=name, op=ops[0] if u.resource else ops[1], input=inputs)
    node.attr["dtype" if u.resource else "T"].type = u.dtype.as_datatype_enum
    return node


def _read(name: str, variable: str, u: _Update, control: str | None = None) -> node_def_pb2.NodeDef:
    """A read of ``variable`` (u's dtype): ``ReadVariableOp`` of a resource, ``Identity`` of a ref."""
    return _variable_op(u, name, ("ReadVariableOp", "Identity"), [variable] + (["^" + control] if control else []))


def _read_after(u: _Update, scope: str, apply: str) -> node_def_pb2.NodeDef:
    """The updated part's value, read once the update is done."""
    return _read(scope + "updated", scope + "part", u, control=apply)


def _assign(u: _Update, name: str, value: str, device: str) -> node_def_pb2.NodeDef:
    node = _variable_op(u, name, ("AssignVariableOp", "Assign"), [u.var.name, value])
    node.device = device
    if not u.resource:
        node.attr["use_locking"].b = True
        node.attr["validate_shape"].b = True
    return node


def _gather(plan: Plan, updates: list[_Update], parts: list[str], norms: list[str], graph_def):
    """Sum the norms' terms (stage 2), then gather every worker's updated parts: the new whole values."""
    backend = backend_for(plan.comm, plan.num_workers, plan.comm.backend)
    graph_def_nodes = node_map(graph_def)
    after = [n.name for n in graph_def.node if n.name.startswith(AGGREGATE_PREFIX + "/")
             and n.op.startswith(_COLLECTIVE_OPS)]

    def builder(inputs: list[tf.Tensor]) -> list[tf.Tensor]:
        parts_in, norm_in = inputs[:len(parts)], inputs[len(parts):]
        for t, u in zip(parts_in, updates):
            t.set_shape([u.var.shard_elements(plan.num_workers)])
        for t in norm_in:
            t.set_shape([])
        outs = []
        with tf.control_dependencies([tf.no_op(name="after_aggregation")]):
            if norm_in:
                with tf.name_scope("norms"):
                    outs += [tf.identity(t, name=f"sum_{i}") for i, t in enumerate(backend.allreduce_sum(norm_in))]
            with tf.name_scope("allgather"):
                gathered = backend.allgather_parts(parts_in, [u.var.num_elements for u in updates],
                                                   plan.num_workers)
        for u, whole in zip(updates, gathered):
            with tf.name_scope(zero_scope(u.var.name) + "new/"):
                outs.append(tf.reshape(whole, [d for d in u.var.shape], name="value"))
        return outs

    dtypes = [u.dtype for u in updates] + [tf.dtypes.as_dtype(graph_def_nodes[parse_input(t)[0]].attr["T"].type)
                                           for t in norms]
    made, outs = build_subgraph(builder, dtypes, parts + norms, ZERO_PREFIX + "/")
    backend.finalize_nodes(made)
    for node in made:
        if node.name == f"{ZERO_PREFIX}/after_aggregation":
            node.input.extend("^" + a for a in after)
    summed, values = outs[:len(norms)], outs[len(norms):]
    if norms:
        skip = {n.name for n in made}
        rewire_inputs([n for n in graph_def.node if n.name not in skip], dict(zip(norms, summed)))
    return made, values


def _replace_update(u: _Update, assign: str, data_read: set[str]) -> None:
    """The original update (``u.node``, in the graph) becomes a NoOp waiting for the new value (or, for
    a ref update whose output is read as data, in ``data_read``, an Identity of the assigned variable)."""
    node = u.node
    name, device = node.name, node.device
    read = name in data_read
    node.Clear()
    node.name, node.device = name, device
    if read and not u.resource:
        node.op = "Identity"
        node.attr["T"].type = u.dtype.as_datatype_enum
        node.input.extend([assign])
    else:
        node.op = "NoOp"
        node.input.extend(["^" + assign])


def _stage2_norms(graph_def, nodes: dict, updates: list[_Update]) -> list[str]:
    """At stage 2, check the path from each reduce-scattered gradient to its update and return the
    ``L2Loss`` outputs on it (a global norm's terms, which must be summed over the workers)."""
    cons = consumers(graph_def)
    norms: list[str] = []
    others: list[tuple[_Update, node_def_pb2.NodeDef, str]] = []  # a carrier's other inputs: must be scalars
    for u in updates:
        start = parse_input(aggregate_outputs(u.var.name, False)[0])[0]
        grad_op = parse_input(u.grad)[0]
        carriers, queue = {start}, [start]
        while queue:
            name = queue.pop()
            for c in cons.get(name, ()):
                node = nodes[c]
                if not any(parse_input(t)[0] == name and not t.startswith("^") for t in node.input):
                    continue  # waits only
                if c == u.node.name:
                    if parse_input(node.input[u.grad_index])[0] != name:
                        raise _whole(u, node, "reads it as another input than its gradient")
                    continue
                if node.op == "L2Loss":
                    norms.append(c + ":0")
                elif node.op in ELEMENTWISE_OPS:
                    if c not in carriers:
                        carriers.add(c)
                        queue.append(c)
                        others += [(u, node, t) for t in node.input
                                   if not t.startswith("^") and parse_input(t)[0] != name]
                else:
                    raise _whole(u, node, "needs it whole")
        if grad_op not in carriers:
            raise RewriteError(f'zero_stage=2: the update of "{u.var.name}" does not read its gradient through '
                               "clipping or scaling alone; use zero_stage=1")
    _check_scalars(graph_def, others)
    return sorted(set(norms))


def _check_scalars(graph_def, others: list) -> None:
    """The other inputs of the ops a gradient's part passes through must be scalars (what a clip's
    scale is): a tensor of the gradient's shape would not fit its part. Unknown shapes pass."""
    if not others:
        return
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    for u, node, text in others:
        if parse_input(text)[0].startswith(AGGREGATE_PREFIX + "/"):  # another part: already checked
            continue
        shape = graph.get_tensor_by_name(canonical(text)).shape
        if shape.num_elements() is not None and shape.num_elements() > 1:
            raise _whole(u, node, f"combines it with {text} of shape {shape}")


def _whole(u: _Update, node, why: str) -> RewriteError:
    return RewriteError(f'zero_stage=2 gives each worker a part of the gradient of "{u.var.name}", but '
                        f'"{node.name}" ({node.op}) {why}; use zero_stage=1, which all-reduces whole gradients')


def _drop_slots(meta_graph: meta_graph_pb2.MetaGraphDef, slots: list[str], parts: list) -> None:
    """The whole slots leave the variable collections and the initialisers; the parts join them."""
    from tensorflow.core.framework import variable_pb2

    graph_def = meta_graph.graph_def

    dropped = set(slots)
    for key in ("variables", "trainable_variables", "local_variables"):
        if key not in meta_graph.collection_def:
            continue
        values = meta_graph.collection_def[key].bytes_list.value
        kept = []
        for raw in values:
            proto = variable_pb2.VariableDef()
            proto.ParseFromString(raw)
            if parse_input(proto.variable_name)[0] not in dropped:
                kept.append(raw)
        del values[:]
        values.extend(kept)
    # every worker initialises its own parts (none waits for the chief, none is broadcast or saved)
    meta_graph.collection_def["local_variables"].bytes_list.value.extend(d.SerializeToString() for d in parts)
    initializers = {n.name for n in graph_def.node if n.op in ("Assign", "AssignVariableOp") and n.input
                    and parse_input(n.input[0])[0] in dropped}
    for node in graph_def.node:
        kept_inputs = [t for t in node.input if not (t.startswith("^") and t[1:] in initializers)]
        if len(kept_inputs) != len(node.input):
            del node.input[:]
            node.input.extend(kept_inputs)
