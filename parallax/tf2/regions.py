"""Each variable's update region in a traced step whose optimizer names no update scopes (Keras 3).

A ``tf.compat.v1.train`` optimizer builds each variable's update under
``<optimizer>/update_<variable>/`` (:mod:`parallax.analysis` reads those scopes).
A Keras 3 optimizer writes every variable with plain ``AssignAdd``/``AssignSub``
ops under one flat scope (``adam/``): the variable's slots first (Adam's ``m``
and ``v`` from the gradient), then the variable from reads of its slots, with
quantities every update shares (the step size from the ``iteration`` counter and
the learning rate) computed once. This module finds, for each trainable variable
the step writes outside a ``gradient_tape`` scope:

* its **gradient**: the tensors of the gradient computation its writes are computed
  from (one tensor, or an ``IndexedSlices``' values and indices, which Keras turns
  into a whole-table tensor with an ``UnsortedSegmentSum`` inside the region, so the
  gradient stays sparse where it crosses workers);
* its **slots**: the other variables the step writes from that same gradient (and
  maybe otherwise: a decay) and the variable's write reads;
* its **region**: the ops the writes of the variable and its slots are computed
  with, back to the gradient and the variables' reads, but for ops another
  variable's update uses too (quantities computed once for all) and ops outside
  the outermost name scope of the variable's writes (the program's own work on a
  gradient before the optimizer takes it, such as unscaling it by a loss scale).

A conditional that decides on one region's own values alone (Keras 3's Adagrad and RMSprop divide a sparse
gradient by a slot through a ``tf.cond`` on whether the slot holds a zero) is that region's, predicate and
scope: on a parameter server only the chief runs a server variable's update, so nothing outside may read it.

A ``LossScaleOptimizer`` applies the gradients inside a ``tf.cond``, which the trace
lowers first (:mod:`parallax.tf2.conds`): the writes then reach their variables,
and the gradients, through the conditional's ``Switch`` ops, whose predicate (all
gradients finite) is shared by every update and no part of any.

:func:`update_regions` returns them; the trace names each region
``<scope>/update_<variable>/`` and colocates its ops with the variable, as a TF1
optimizer does, so the rest of Parallax reads them as it reads any optimizer's.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass

from tensorflow.core.framework import graph_pb2

from parallax.graph.graph_ops import is_variable_write, parse_input, variable_behind

__all__ = ["UpdateRegion", "update_regions", "GRADIENT_SCOPE"]

#: Name scopes of gradient computations (``tf.gradients``, a ``GradientTape``).
GRADIENT_SCOPE = re.compile(r"(^|/)(gradients(_\d+)?|gradient_tape)/")
#: An optimizer's own update scope (``update_<variable>``, or traced: ``update_``, ``update__1``, ``update``,
#: ``update_1``): its ops are attributed by their scope, not by a region.
_UPDATE_SCOPE = re.compile(r"(^|/)update(_[^/]*)?/")
_READS = frozenset({"ReadVariableOp", "ResourceGather"})
_SWITCHES = frozenset({"Switch", "RefSwitch"})


@dataclass(frozen=True)
class UpdateRegion:
    """One variable's update, as :func:`update_regions` finds it.

    Attributes:
        variable: the variable (the name of the op that holds it).
        slots: the variables the region writes besides it.
        ops: the region's op names.
    """

    variable: str
    slots: tuple[str, ...]
    ops: frozenset[str]


def update_regions(graph_def: graph_pb2.GraphDef, variables: set[str], trainable: set[str]) -> list[UpdateRegion]:
    """The update regions of the ``trainable`` variables (op names; ``variables`` are all the variable ops,
    resource handles, of ``graph_def``) whose writes lie in no update scope (see the module docstring).

    A variable written from no gradient, or whose writes cannot be told from another's, gets no region:
    the analysis then finds no gradient for it, and refuses the step (a write it cannot attribute).
    """
    nodes = {n.name: n for n in graph_def.node}
    writes: dict[str, list[str]] = {}  # variable -> its writes outside gradient and update scopes
    for node in graph_def.node:
        if not is_variable_write(node.op) or not node.input or GRADIENT_SCOPE.search(node.name) \
                or _UPDATE_SCOPE.search(node.name):
            continue
        target = variable_behind(parse_input(node.input[0])[0], nodes)  # maybe through a lowered cond's Switch
        if target in variables:
            writes.setdefault(target, []).append(node.name)
    walks = {w: _walk_back(w, nodes, variables) for ws in writes.values() for w in ws}
    owned: dict[str, tuple[set[str], list[str]]] = {}  # variable -> (its slots, its and their writes)
    for var in sorted(set(writes) & trainable):
        read = set().union(*(walks[w][1] for w in writes[var]))
        slots = {s for s in read - {var} if s in writes and s not in trainable and any(walks[w][0] for w in writes[s])}
        own = [w for v in (var, *sorted(slots)) for w in writes[v]]
        if any(walks[w][0] for w in own):  # written from a gradient (else: the program's own write)
            owned[var] = (slots, own)
    passed_by: dict[str, set[str]] = {}
    for var, (_, own) in owned.items():
        for w in own:
            for op in walks[w][2] | {w}:
                passed_by.setdefault(op, set()).add(var)
    readers: dict[str, set[str]] = {}  # op -> the ops that read it (a variable's handle through a lowered cond)
    for node in graph_def.node:
        for text in node.input:
            source = parse_input(text)[0]
            if source in nodes and nodes[source].op in _SWITCHES:
                readers.setdefault(source, set()).add(node.name)
    regions = []
    for var, (slots, _) in sorted(owned.items()):
        # the optimizer's own ops: in the scope of the variable's writes (what the program does to a gradient
        # on its way there, such as tf_keras' unscaling by the loss scale, is no part of the update)
        scopes = {_outer_scope(w) for w in writes[var]}
        ops = frozenset(op for op, users in passed_by.items()
                        if users == {var} and not GRADIENT_SCOPE.search(op) and _outer_scope(op) in scopes)
        regions.append(UpdateRegion(var, tuple(sorted(slots)), _without_shared_handles(ops, nodes, variables,
                                                                                       readers)))
    return _with_own_conditionals(regions, nodes, variables)


def _without_shared_handles(ops: frozenset[str], nodes: dict, variables: set[str],
                            readers: dict[str, set[str]]) -> frozenset[str]:
    """``ops`` but a lowered conditional's ``Switch`` of a variable's handle that an op outside them reads too
    (Keras 3's moving averages of the weights, ``use_ema``, read the variables the updates wrote in the same
    conditional): the handle is the variable's, which anything may read, no part of its update's (on a parameter
    server, only the chief runs an update)."""
    return frozenset(op for op in ops if not (nodes[op].op in _SWITCHES and variable_behind(op, nodes) in variables
                                              and readers.get(op, set()) - ops))


def _with_own_conditionals(regions: list[UpdateRegion], nodes: dict, variables: set[str]) -> list[UpdateRegion]:
    """Each region with the lowered conditionals that decide on its own values alone (Keras 3 divides a sparse
    gradient by a slot through a ``tf.cond`` on whether the slot holds a zero): the predicate's ops and the
    conditional's scope (``<scope>/cond/``: its ``pred``, pivots, branch constants, merges) are the region's.
    A predicate computed from anything else (several variables' gradients: a ``LossScaleOptimizer``'s finite
    check) stays shared, and so does its conditional."""
    consumers: dict[str, list[str]] = {}
    for node in nodes.values():
        for text in node.input:
            consumers.setdefault(parse_input(text)[0], []).append(node.name)
    taken = set().union(*(r.ops for r in regions)) if regions else set()
    out = []
    for region in regions:
        added: set[str] = set()
        for name in sorted(region.ops):
            node = nodes[name]
            if node.op not in _SWITCHES or len(node.input) < 2:
                continue
            predicate = parse_input(node.input[1])[0]
            if predicate in region.ops or predicate in added:
                continue
            own = _computed_from(predicate, region.ops, nodes, variables)
            if own is None:
                continue
            prefixes = tuple(c[:-len("pred")] for c in consumers.get(predicate, ())
                             if c.endswith("/pred") and nodes[c].op in _SWITCHES)
            scoped = {n for n in nodes if prefixes and n.startswith(prefixes)}
            if (own | scoped) & (taken - region.ops):
                continue  # another region's ops too: not this region's alone
            added |= own | scoped
        out.append(UpdateRegion(region.variable, region.slots, region.ops | added) if added else region)
    return out


def _computed_from(start: str, region: frozenset[str], nodes: dict, variables: set[str]) -> set[str] | None:
    """The ops from ``start`` back to ``region`` over data edges (constants apart), or ``None`` when the way
    back reaches anything else: a variable, a gradient, a placeholder."""
    found, queue = set(), deque([start])
    while queue:
        name = queue.popleft()
        if name in found or name in region:
            continue
        node = nodes.get(name)
        if node is None or name in variables or GRADIENT_SCOPE.search(name) or node.op == "Placeholder":
            return None
        if node.op == "Const":
            continue
        found.add(name)
        queue.extend(parse_input(t)[0] for t in node.input if not t.startswith("^"))
    return found


def _outer_scope(name: str) -> str:
    """The outermost name scope of an op (``""`` at the top level)."""
    return name.split("/", 1)[0] if "/" in name else ""


def _walk_back(start: str, nodes: dict, variables: set[str]) -> tuple[set[str], set[str], set[str]]:
    """Backwards over data edges from ``start``: the gradient tensors reached (made in a gradient scope), the
    variables read, and the ops passed (stopping at both)."""
    gradient, read, passed = set(), set(), set()
    queue = deque([start])
    while queue:
        name = queue.popleft()
        if name in passed or name not in nodes:
            continue
        passed.add(name)
        inputs = nodes[name].input
        if nodes[name].op in _SWITCHES:  # a lowered cond's: its predicate (shared by all) is no part of the value
            inputs = inputs[:1]
        for text in inputs:
            if text.startswith("^"):
                continue
            source = parse_input(text)[0]
            node = nodes.get(source)
            if node is None or source in variables:
                continue
            if node.op in _SWITCHES and variable_behind(source, nodes) in variables:
                passed.add(source)  # a variable's handle into a lowered cond
                continue
            if GRADIENT_SCOPE.search(source):
                op, index, _ = parse_input(text)
                if not _is_shape(node):
                    gradient.add(f"{op}:{index}")
            elif node.op in _READS and node.input \
                    and (held := variable_behind(parse_input(node.input[0])[0], nodes)) in variables:
                read.add(held)
                passed.add(source)
            elif node.op not in ("Const", "Placeholder"):
                queue.append(source)
    return gradient, read, passed


def _is_shape(node) -> bool:
    """A gradient's dense shape (an ``IndexedSlices``' ``dense_shape``): no part of its value."""
    return node.op in ("Shape", "VariableShape", "Const")


