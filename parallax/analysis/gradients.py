"""Each variable's gradient, told apart from the other inputs of its update, traced back to the raw
``tf.gradients`` output, and coupled with the gradients that decide whether it is applied."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import tensorflow as tf

from parallax.analysis.model import GradientInfo
from parallax.analysis.ops import _SWITCHES, VARIABLE_OP_TYPES, _in_gradient_scope, _is_variable_read
from parallax.analysis.refusals import _refuse_partly_shared_rows
from parallax.analysis.walks import _from_gradient_computation, _frontier_distances, _same_shape, _shared_rows
from parallax.errors import AnalysisError

__all__ = ["_gradient_of", "_find_raw_gradients", "_coupled_by_conditions"]


def _gradient_of(var_name: str, scope_ops: list, graph: tf.Graph) -> GradientInfo:
    optimizers = sorted({op.name[:op.name.rfind("update_")].rstrip("/") or "(top level)" for op in scope_ops})
    if len(optimizers) > 1:
        raise AnalysisError(
            f'variable "{var_name}" is updated by {len(optimizers)} optimizer calls ({", ".join(optimizers)}); '
            "Parallax synchronises one gradient per variable and step. Update each variable with one "
            "minimize()/apply_gradients() (e.g. pass var_list=), or sum the losses into one")
    inside = {op.name for op in scope_ops}
    external = []
    for op in scope_ops:
        for t in op.inputs:
            p = t.op
            if p.name in inside or p.type == "Const" or _is_variable_read(p) or t.dtype == tf.resource:
                continue
            if t.name not in external:
                external.append(t.name)
    # an IndexedSlices' dense shape (Keras 3 densifies a sparse gradient inside the update) is no part of it
    tensors = [t for t in (graph.get_tensor_by_name(n) for n in external)
               if t.op.type not in ("Shape", "VariableShape")]
    cache: dict = {}
    grads = [t for t in tensors if _from_gradient_computation(t, cache)]
    if not grads:
        grads = tensors  # hand-built gradients: every non-constant input is a candidate
    floats = [t for t in grads if t.dtype.is_floating or t.dtype.is_complex]
    ints = [t for t in grads if t.dtype.is_integer]
    update_ops = tuple(sorted(inside))
    if len(floats) == 1 and not ints:
        return GradientInfo(var_name, False, floats[0].name, None, floats[0].dtype.name, update_ops)
    if len(floats) == 1 and len(ints) == 1 and _shared_rows(floats[0], ints[0]):
        return GradientInfo(var_name, False, floats[0].name, None, floats[0].dtype.name, update_ops,
                            shape=tuple(floats[0].shape.as_list()))
    if len(floats) == 1 and len(ints) == 1:
        count = ints[0].shape.num_elements() if ints[0].shape.is_fully_defined() else None
        merged = _sums_rows_first(floats[0], scope_ops)
        if not merged:
            _refuse_partly_shared_rows(var_name, ints[0])
        return GradientInfo(var_name, True, floats[0].name, ints[0].name, floats[0].dtype.name, update_ops,
                            ints[0].dtype.name, indices_count=count, repeats_merged=merged,
                            densified=_densified(ints[0], scope_ops))
    raise AnalysisError(
        f'cannot tell the gradient of variable "{var_name}" from the other inputs of its update ops '
        f"(candidates: {', '.join(t.name for t in grads) or 'none'}). Expected one floating tensor "
        "(dense) or values + indices (sparse) coming from tf.gradients / optimizer.compute_gradients")


#: Ops that sum a sparse gradient's rows of equal index (``tf.compat.v1.train`` optimizers deduplicate
#: with ``UnsortedSegmentSum`` first; plain gradient descent scatters them, adding as it goes).
_SUMS_ROWS = frozenset({"UnsortedSegmentSum", "ResourceScatterAdd", "ResourceScatterSub", "ScatterAdd", "ScatterSub"})
#: Ops a gradient's rows may pass through on the way there without their sum changing meaning (a scale).
_ROW_SCALES = frozenset({"Neg", "Mul", "RealDiv", "Cast", "Identity"})


def _sums_rows_first(values, scope_ops: list) -> bool:
    """Whether the update's every use of a sparse gradient's ``values`` sums the rows of equal index (after
    a scale at most), so that summing them before they are sent changes nothing. Keras 3's Adam squares each
    row before summing: not so."""
    inside = {op.name for op in scope_ops}
    frontier, seen, found = [values], set(), False
    while frontier:
        tensor = frontier.pop()
        for op in tensor.consumers():
            if op.name not in inside or op.name in seen:
                continue
            seen.add(op.name)
            if op.type in _SUMS_ROWS:
                found = True
            elif op.type in _ROW_SCALES:
                frontier.extend(op.outputs)
            else:
                return False
    return found


def _densified(indices, scope_ops: list) -> bool:
    """Whether the update's every use of a sparse gradient's ``indices`` is as the segments of an
    ``UnsortedSegmentSum`` into the whole variable (Keras 3's optimizers: a tensor of the variable's shape)."""
    inside = {op.name for op in scope_ops}
    uses = [op for op in indices.consumers() if op.name in inside]
    return bool(uses) and all(op.type == "UnsortedSegmentSum" and op.inputs[1] is indices for op in uses)


def _find_raw_gradients(graph: tf.Graph, gradients: list[GradientInfo]) -> list[GradientInfo]:
    """Trace post-processed gradients back to the raw ``tf.gradients`` outputs.

    The raw outputs are the tensors made in a ``gradients`` name scope that the
    post-processing ops read (the frontier). A dense variable's raw gradient is
    the nearest frontier tensor of the variable's shape; a sparse one's values
    are the nearest frontier tensor made by the same gradient function as its
    indices (which pass through unchanged). Every frontier tensor must be
    claimed by exactly one variable; if not, the graph is left as it is and
    aggregation happens at the update's inputs.
    """
    produced = [graph.get_tensor_by_name(t) for g in gradients for t in g.tensors]
    if all(_in_gradient_scope(t.op) for t in produced):
        return gradients  # nothing between tf.gradients and the update
    frontier: set[str] = set()
    distances: dict[str, dict[str, int]] = {}
    for g in gradients:
        start = graph.get_tensor_by_name(g.tensor)
        distances[g.variable] = _frontier_distances(start, frontier)
        if g.indices is not None:
            indices = graph.get_tensor_by_name(g.indices)
            if not _in_gradient_scope(indices.op):
                return gradients
            frontier.add(indices.name)
    claimed: dict[str, str] = {}
    result = []
    for g in gradients:
        near = sorted(distances[g.variable].items(), key=lambda kv: (kv[1], kv[0]))
        if g.indices is None:
            want = graph.get_tensor_by_name(g.tensor)
            choice = next((t for t, _ in near if _same_shape(graph.get_tensor_by_name(t), want)), None)
        else:
            scope = graph.get_tensor_by_name(g.indices).op.name.rsplit("/", 1)[0]
            choice = next((t for t, _ in near if graph.get_tensor_by_name(t).op.name.rsplit("/", 1)[0] == scope
                           and graph.get_tensor_by_name(t).dtype.is_floating), None)
            if choice is not None:
                claimed[g.indices] = g.variable
        if choice is None or choice in claimed:
            return gradients
        claimed[choice] = g.variable
        # ops between the raw gradient and the update (clipping) see the repeats: keep them
        result.append(replace(g, raw_tensor=choice, raw_indices=g.indices, repeats_merged=False))
    if set(claimed) != frontier:
        return gradients  # some raw gradient feeds the post-processing without being any variable's
    return [replace(g, coupled_with=tuple(sorted({claimed[t] for t in distances[g.variable]} - {g.variable})))
            for g in result]


def _coupled_by_conditions(graph: tf.Graph, gradients: list[GradientInfo]) -> list[GradientInfo]:
    """Couple each update that runs under a conditional (a lowered ``tf.cond``'s ``Switch``: a
    ``LossScaleOptimizer`` applies the gradients only when all are finite) with every variable whose gradient
    its predicate is computed from: that decision must be taken on the gradients every worker sees alike
    (aggregated), so these variables cannot be split between parameter servers and all-reduce."""
    owner = {t: g.variable for g in gradients for t in g.aggregation_tensors if t}
    behind: dict[str, frozenset[str]] = {}
    out = []
    for g in gradients:
        predicates = {}
        for name in g.update_ops:
            op = graph.get_operation_by_name(name)
            sources = [op] + [t.op for t in op.inputs]
            for source in sources:
                while source.type in _SWITCHES and len(source.inputs) > 1:
                    predicates[source.inputs[1].name] = source.inputs[1]
                    source = source.inputs[0].op
        coupled = set()
        for name, predicate in predicates.items():
            if name not in behind:
                behind[name] = _gradients_behind(predicate, owner)
            coupled |= behind[name]
        coupled -= {g.variable}
        out.append(replace(g, coupled_with=tuple(sorted(set(g.coupled_with) | coupled))) if coupled else g)
    return out


def _gradients_behind(tensor, owner: dict[str, str]) -> frozenset[str]:
    """The variables (``owner``: gradient tensor -> variable) whose gradients ``tensor`` is computed from."""
    found, seen, queue = set(), {tensor.op.name}, deque([tensor])
    while queue:
        t = queue.popleft()
        if t.name in owner:
            found.add(owner[t.name])
            continue
        for source in t.op.inputs:
            if source.op.name not in seen and source.op.type not in VARIABLE_OP_TYPES:
                seen.add(source.op.name)
                queue.extend(source.op.outputs)
    return frozenset(found)
