"""ZeRO for an update made of element-wise ops (Keras 3's optimizers), as :mod:`parallax.rewrite.zero` does
for one ``Apply*`` op.

A Keras 3 optimizer updates a variable with plain ops in its update scope (``<optimizer>/update_<variable>/``,
named so by the trace: :mod:`parallax.tf2.regions`): reads of the variable and its slots, element-wise
arithmetic on them, the gradient and scalars (the learning rate, the step's bias corrections), and
``AssignAdd``/``AssignSub``/``Assign`` writes. Element by element, the update of element ``i`` reads only
element ``i`` of each of them; so the same ops on this worker's part of every one of them (elements
``[k m, (k+1) m)`` of each flattened) update exactly that part. The region is read as:

* **state**: the reads of the variable and its slots, and every op computed from one of them. Copied into
  ``parallax_zero/<variable>/region/``, on the worker's part variables (a read of the variable reads its part,
  a write writes it), each op of an element-wise kind (:data:`ELEMENTWISE`);
* **whole tensors**: what the state ops take of the variable's shape that no state computes (the gradient, or a
  sparse gradient made whole: Keras 3 sums an ``IndexedSlices``' rows into a table of the variable's shape,
  ``UnsortedSegmentSum``): computed as one device computes them, and cut into this worker's part;
* **scalars**: everything else a state op takes must be one element (a learning rate, a bias correction),
  read as it is.

Anything else (a state op of another kind, a tensor of another shape combined with the state, the state read
outside the update) leaves the variable whole: :class:`~parallax.errors.RewriteError` names the op.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from parallax.errors import RewriteError
from parallax.graph.graph_ops import is_variable_write, parse_input, variable_behind
from parallax.graph.names import aggregate_outputs, zero_scope
from parallax.plan.model import VariablePlacement, part_sizes

__all__ = ["RegionUpdate", "find_region", "copy_region", "retire_region", "rows_part", "static_shapes",
           "ELEMENTWISE", "region_scope"]

#: The op kinds a state op may be: each output element computed from the same element of each input (scalars
#: broadcast).
ELEMENTWISE = frozenset({
    "Identity", "Snapshot", "Cast", "Neg", "Abs", "Sign", "Square", "Sqrt", "Rsqrt", "Reciprocal", "Exp", "Log",
    "Log1p", "Tanh", "Sigmoid", "Add", "AddV2", "Sub", "Mul", "RealDiv", "Div", "DivNoNan", "Maximum", "Minimum",
    "Pow", "SquaredDifference", "ClipByValue", "Select", "SelectV2", "Less", "LessEqual", "Greater", "GreaterEqual",
    "Equal", "NotEqual", "LogicalAnd", "LogicalOr", "LogicalNot", "IsFinite", "ZerosLike", "OnesLike", "MulNoNan",
    "Floor", "Ceil", "Round"})
_READ = "ReadVariableOp"


def region_scope(variable: str) -> str:
    """Where the copies of ``variable``'s update go.

    >>> region_scope("dense/kernel")
    'parallax_zero/dense/kernel/region/'
    """
    return zero_scope(variable) + "region/"


@dataclass
class RegionUpdate:
    """A sharded variable's update region, read as the module docstring says.

    Attributes:
        var: the variable's plan.
        slots: ``(position, slot variable)`` of each slot (positions as :class:`parallax.rewrite.zero` numbers
            them: from 1).
        ops: the region's op names.
        state: the state ops (copied), in an order their inputs come first.
        writes: the region's writes of the variable and its slots (among ``state``).
        whole: the whole tensors cut into parts.
        after: control inputs of the variable's writes from outside the region (the forward pass's reads,
            which the variable's new value must follow).
        summed: of the whole tensors, those a sparse gradient's rows are summed into (``UnsortedSegmentSum``):
            ``(rows, their indices)``, so that each worker sums only the rows of its part.
    """

    var: VariablePlacement
    slots: list[tuple[int, str]]
    ops: frozenset[str]
    state: list[str]
    writes: list[str]
    whole: list[str]
    after: list[str] = field(default_factory=list)
    summed: dict[str, tuple[str, str]] = field(default_factory=dict)
    resource: bool = True

    @property
    def dtype(self) -> tf.DType:
        return tf.dtypes.as_dtype(self.var.dtype)


def find_region(graph_def: graph_pb2.GraphDef, nodes: dict, var: VariablePlacement, slot_names: list[str],
                shapes: dict[str, tuple | None], users: dict[str, list[str]] | None = None) -> RegionUpdate | None:
    """``var``'s update region in ``graph_def`` (its ops in an ``update_<var>/`` scope), or ``None`` where it has
    none.

    Args:
        shapes: each tensor's static shape (``None``: unknown), by name (what is computed from the variable's
            gradient is whole whatever its static shape says: :func:`_from_gradient`).
        users: :func:`~parallax.graph.graph_ops.consumers` of ``graph_def`` (``None``: each op is looked at), for a
            caller that finds many regions in one graph.

    Raises:
        RewriteError: the region cannot be cut into parts (see the module docstring).
    """
    ops = _scoped(graph_def, var.name, nodes)
    if not ops:
        return None
    handles = {var.name, *slot_names}
    state: set[str] = set()
    writes: list[str] = []
    order = _ordered(ops, nodes)
    for name in order:
        node = nodes[name]
        data = [t for t in node.input if not t.startswith("^")]
        if node.op == _READ and variable_behind(parse_input(data[0])[0], nodes) in handles:
            state.add(name)
        elif is_variable_write(node.op) and data and variable_behind(parse_input(data[0])[0], nodes) in handles:
            state.add(name)
            writes.append(name)
        elif any(parse_input(t)[0] in state for t in data):
            state.add(name)
    for name in order:
        node = nodes[name]
        if name in state and (node.op == _READ or is_variable_write(node.op)) \
                and _through_switch(parse_input(node.input[0])[0], nodes):
            raise _whole(var, f'"{name}" reaches it through a conditional (a LossScaleOptimizer\'s, gradient '
                              "accumulation's: the update runs only when the conditional says; not cut into parts yet)")
        if name in state and node.op in ("Switch", "RefSwitch", "Merge"):
            raise _whole(var, f'"{name}" ({node.op}): its update decides in a conditional on its own values')
    written = {variable_behind(parse_input(nodes[w].input[0])[0], nodes) for w in writes}
    if var.name not in written:
        raise _whole(var, f"its update region ({len(ops)} ops) writes no part of it")
    whole: list[str] = []
    full = tuple(var.shape)
    derived = _from_gradient(var, order, state, nodes)
    for name in order:
        if name not in state:
            continue
        node = nodes[name]
        if node.op != _READ and not is_variable_write(node.op) and node.op not in ELEMENTWISE:
            raise _whole(var, f'"{name}" ({node.op}) is no element-wise op')
        data = [t for t in node.input if not t.startswith("^")]
        for text in data[1:] if node.op == _READ or is_variable_write(node.op) else data:
            source = parse_input(text)[0]
            if source in state:
                continue
            shape = shapes.get(_tensor(text))
            if _tensor(text) in derived or shape is not None and tuple(shape) == full:
                if _tensor(text) not in whole:
                    whole.append(_tensor(text))
            elif shape is None or _elements(shape) != 1:
                raise _whole(var, f'"{name}" ({node.op}) combines its state with {_tensor(text)} of shape '
                                  f"{shape if shape is not None else 'unknown'}")
    outside = (n for n in graph_def.node if n.name not in ops) if users is None else \
        (nodes[c] for c in sorted({c for s in state for c in users.get(s, ())}) if c not in ops)
    for node in outside:
        for text in node.input:
            if not text.startswith("^") and parse_input(text)[0] in state:
                raise _whole(var, f'"{node.name}" reads its update\'s "{parse_input(text)[0]}"')
    after = sorted({t for w in writes if variable_behind(parse_input(nodes[w].input[0])[0], nodes) == var.name
                    for t in nodes[w].input if t.startswith("^") and t[1:] not in ops})
    slots = [(i + 1, s) for i, s in enumerate(sorted(slot_names))]
    summed = {t: (_tensor(nodes[op].input[0]), _tensor(nodes[op].input[1])) for t in whole
              if (op := parse_input(t)[0]) in ops and nodes[op].op == "UnsortedSegmentSum"}
    return RegionUpdate(var, slots, frozenset(ops), [n for n in order if n in state], writes, whole, after, summed)


def _through_switch(name: str, nodes: dict) -> bool:
    """Whether the handle ``name`` passes reaches its variable through a conditional's ``Switch``."""
    seen = set()
    while name in nodes and name not in seen and nodes[name].input:
        if nodes[name].op in ("Switch", "RefSwitch"):
            return True
        if nodes[name].op not in ("Identity", "RefIdentity"):
            return False
        seen.add(name)
        name = parse_input(nodes[name].input[0])[0]
    return False


def _from_gradient(var: VariablePlacement, order: list[str], state: set[str], nodes: dict) -> set[str]:
    """The tensors of the region computed from the variable's gradient alone, element-wise (so of its shape, as
    the collective that made it leaves unknown): the all-reduced gradient, or the whole tensors a sparse one's rows
    are summed into (``UnsortedSegmentSum``), and what element-wise ops make of them with scalars."""
    derived = set() if var.sparse else {aggregate_outputs(var.name, False)[0]}
    for name in order:
        node = nodes[name]
        if name in state:
            continue
        if var.sparse and node.op == "UnsortedSegmentSum" or node.op in ELEMENTWISE and any(
                _tensor(t) in derived for t in node.input if not t.startswith("^")):
            derived.add(f"{name}:0")
    return derived


def copy_region(u: RegionUpdate, nodes: dict, part: str, slot_parts: list[str], parts: dict[str, str],
                refresh: str, device: str) -> tuple[list[node_def_pb2.NodeDef], str]:
    """The copies of ``u``'s state ops on this worker's parts (``part``: the variable's; ``slot_parts``: its
    slots', in ``u.slots``' order; ``parts``: each whole tensor's part; ``refresh``: the op that makes ``part``
    the variable's current value), and a ``NoOp`` that waits for every copied write."""
    scope = region_scope(u.var.name)
    target = {u.var.name: part, **{s: p for (_, s), p in zip(u.slots, slot_parts)}}
    copies = {name: scope + _rest(name, u.var.name) for name in u.state}
    made = []
    for name in u.state:
        node = nodes[name]
        copy = node_def_pb2.NodeDef()
        copy.CopyFrom(node)
        copy.name = copies[name]
        copy.device = device
        for key in ("_class", "_output_shapes"):
            if key in copy.attr:
                del copy.attr[key]
        inputs = []
        for position, text in enumerate(node.input):
            source, index, control = parse_input(text)
            if control:
                inputs.append("^" + copies.get(source, source))
            elif position == 0 and (node.op == _READ or is_variable_write(node.op)):
                inputs.append(target[variable_behind(source, nodes)])
            elif source in copies:
                inputs.append(f"{copies[source]}:{index}" if index else copies[source])
            elif _tensor(text) in parts:
                inputs.append(parts[_tensor(text)])
            else:
                inputs.append(text)
        if (node.op == _READ or is_variable_write(node.op)) \
                and variable_behind(parse_input(node.input[0])[0], nodes) == u.var.name:
            inputs.append("^" + refresh)
        del copy.input[:]
        copy.input.extend(inputs)
        made.append(copy)
    done = node_def_pb2.NodeDef(name=scope + "done", op="NoOp", input=["^" + copies[w] for w in u.writes])
    done.device = device
    return made + [done], done.name


def retire_region(u: RegionUpdate, nodes: dict[str, node_def_pb2.NodeDef], assign: str) -> None:
    """The region's state ops (its reads and writes of the whole variable and slots, and what is computed from
    them: only state ops take them) become ``NoOp`` ops that wait for the variable's new value (``assign``), so
    whatever waited for the update still does; the region's other ops are left to the copies that take them.
    ``nodes``: the graph's ops by name (:func:`~parallax.graph.graph_ops.node_map`), changed where they are."""
    for name in u.state:
        node = nodes[name]
        device = node.device
        node.Clear()
        node.name, node.device, node.op = name, device, "NoOp"
        node.input.append("^" + assign)


def rows_part(rows: tf.Tensor, indices: tf.Tensor, shape: tuple, workers: int, index: int) -> tf.Tensor:
    """Worker ``index``'s part (:func:`parallax.plan.model.part_sizes`: elements ``[k m, (k+1) m)`` of the whole,
    flattened, padded to ``m``) of the sum of ``rows`` into a tensor of ``shape`` at ``indices`` (what
    ``UnsortedSegmentSum`` makes of a sparse gradient): where the parts hold whole rows, only this part's rows
    are summed (the others' indices dropped), else the whole sum is made and cut."""
    total, width = int(np.prod(shape)), int(np.prod(shape[1:]))
    sizes = part_sizes(total, workers)
    m, begin, size = sizes[0], sum(sizes[:index]), sizes[index]
    if m % width:  # a part ends inside a row: the whole sum, cut
        whole = tf.math.unsorted_segment_sum(rows, indices, shape[0])
        piece = tf.slice(tf.reshape(whole, [total]), [begin], [size])
    else:
        first, count = begin // width, size // width
        local = indices - tf.cast(first, indices.dtype)
        local = tf.where((local >= 0) & (local < count), local, -tf.ones_like(local))  # a negative index: dropped
        piece = tf.reshape(tf.math.unsorted_segment_sum(rows, local, count), [size])
    return tf.pad(piece, [[0, m - size]]) if size < m else piece


def static_shapes(graph_def: graph_pb2.GraphDef) -> dict[str, tuple | None]:
    """Every tensor's static shape in ``graph_def`` (``None`` where its rank is unknown), by name."""
    graph = tf.Graph()
    with graph.as_default():
        tf.graph_util.import_graph_def(graph_def, name="")
    return {t.name: (tuple(t.shape.as_list()) if t.shape.rank is not None else None)
            for op in graph.get_operations() for t in op.outputs}


def _scoped(graph_def: graph_pb2.GraphDef, variable: str, nodes: dict) -> set[str]:
    """The ops of ``variable``'s update scope (``.../update_<variable>/...``), but those of a variable whose
    name extends it (``update_<variable>_1/``... is another scope; ``update_<variable>/x/`` might be
    ``<variable>/x``'s)."""
    marker = f"update_{variable}/"
    longer = [f"update_{n}/" for n, node in nodes.items()
              if node.op in ("VarHandleOp", "VariableV2") and n.startswith(variable + "/")]
    found = set()
    for node in graph_def.node:
        at = node.name.find(marker)
        if at < 0 or (at > 0 and node.name[at - 1] != "/") or len(node.name) == at + len(marker):
            continue
        if not any(node.name.startswith(m, at) for m in longer):
            found.add(node.name)
    return found


def _ordered(ops: set[str], nodes: dict) -> list[str]:
    """``ops`` in an order each comes after the ops of ``ops`` it takes (data or control)."""
    inside = {n: [parse_input(t)[0] for t in nodes[n].input if parse_input(t)[0] in ops] for n in ops}
    waiting = {n: len(set(v)) for n, v in inside.items()}
    users: dict[str, list[str]] = {}
    for n, sources in inside.items():
        for s in set(sources):
            users.setdefault(s, []).append(n)
    ready = deque(sorted(n for n, k in waiting.items() if k == 0))
    order = []
    while ready:
        n = ready.popleft()
        order.append(n)
        for user in sorted(users.get(n, ())):
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    if len(order) != len(ops):
        raise RewriteError(f"zero_stage: the update ops {sorted(ops - set(order))[:3]} wait for each other in a cycle")
    return order


def _rest(name: str, variable: str) -> str:
    marker = f"update_{variable}/"
    return name[name.find(marker) + len(marker):]


def _tensor(text: str) -> str:
    op, index, _ = parse_input(text)
    return f"{op}:{index}"


def _elements(shape: tuple) -> int | None:
    total = 1
    for d in shape:
        if d is None:
            return None
        total *= d
    return total


def _whole(var: VariablePlacement, why: str) -> RewriteError:
    return RewriteError(f'zero_stage: the optimizer\'s update of "{var.name}" cannot be cut into parts: {why}. '
                        "Leave it whole (plan_overrides), or use zero_stage=0")
