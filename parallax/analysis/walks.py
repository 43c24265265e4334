"""Walks back from a tensor to what it is computed from: the gradient computation, the raw gradients beyond
the ops that post-process them, indices that every replica computes alike."""

from __future__ import annotations

from collections import deque

import tensorflow as tf

from parallax.analysis.ops import (
    _DATA_SOURCES,
    _GRADIENT_SCOPE_RE,
    _PLACEHOLDERS,
    _SWITCHES,
    VARIABLE_OP_TYPES,
    _in_gradient_scope,
)

__all__ = ["_from_gradient_computation", "_frontier_distances", "_same_shape", "_shared_rows"]


def _from_gradient_computation(tensor, cache: dict) -> bool:
    """Whether ``tensor`` is computed from ops of a ``gradients`` name scope."""
    start = tensor.op
    if start.name in cache:
        return cache[start.name]
    seen = {start.name}
    queue = deque([start])
    found = False
    while queue:
        op = queue.popleft()
        if _GRADIENT_SCOPE_RE.search(op.name + "/"):
            found = True
            break
        # a lowered conditional's predicate (all gradients finite) tells which branch runs, no part of a value
        for t in list(op.inputs)[:1] if op.type in _SWITCHES else op.inputs:
            if t.op.name not in seen and t.op.type not in VARIABLE_OP_TYPES:
                seen.add(t.op.name)
                queue.append(t.op)
    cache[start.name] = found
    return found


def _frontier_distances(start, frontier: set[str]) -> dict[str, int]:
    """Breadth-first backwards from ``start`` through ops outside gradient scopes;
    returns the gradient-scope tensors reached, with their distance, and adds
    them to ``frontier``."""
    if _in_gradient_scope(start.op):
        frontier.add(start.name)
        return {start.name: 0}
    found: dict[str, int] = {}
    seen = {_walk_key(start)}
    queue = deque([(start, 1)])
    while queue:
        tensor, depth = queue.popleft()
        for t in _value_sources(tensor):
            p = t.op
            if p.type in VARIABLE_OP_TYPES or p.type == "Const" or t.dtype == tf.resource:
                continue
            if _in_gradient_scope(p):
                found.setdefault(t.name, depth)
                frontier.add(t.name)
            elif _walk_key(t) not in seen:
                seen.add(_walk_key(t))
                queue.append((t, depth + 1))
    return found


#: Ops whose output ``k`` is their input ``k``, passed on: an ``IdentityN`` (every Keras 3 optimizer passes the
#: gradients through one, the default replica context's ``all_reduce``, a ``custom_gradient``).
_PER_OUTPUT = frozenset({"IdentityN"})


def _value_sources(tensor) -> list:
    """The inputs ``tensor``'s value is computed from: all its op's, but a lowered conditional's predicate (all
    gradients finite: it tells which branch runs, no part of a value) and an ``IdentityN``'s other inputs."""
    op = tensor.op
    if op.type in _SWITCHES:
        return list(op.inputs)[:1]
    if op.type in _PER_OUTPUT and tensor.value_index < len(op.inputs):
        return [op.inputs[tensor.value_index]]
    return list(op.inputs)


def _walk_key(tensor) -> str:
    """What a walk over values marks as seen: the tensor of an op in :data:`_PER_OUTPUT`, else its op."""
    return tensor.name if tensor.op.type in _PER_OUTPUT else tensor.op.name


def _same_shape(a, b) -> bool:
    return a.dtype == b.dtype and a.shape.is_fully_defined() and a.shape == b.shape


#: Ops whose output depends on their input's shape only: a replica's part of the batch has the shape of every
#: other replica's (the parts of a global batch are equal), so they give every replica the same value.
_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "VariableShape"})


def _shared_rows(values, indices) -> bool:
    """Whether a sparse gradient's ``indices`` are the same on every replica: computed from no batch input
    (through its shape at most) nor variable, as a gather of ``range(maxlen)`` positions (every Keras
    Transformer's position embedding) or of constant rows. One device then computes each row once, its value
    summed over the whole batch; the replicas' rows are the same rows, each with its part's sum, so their
    elementwise mean is exactly one device's gradient, where gathering the replicas' rows would repeat each
    one (which an optimizer that squares the rows before summing them, Keras 3's Adam, does not forgive). The
    values need a static shape to be all-reduced."""
    if not values.shape.is_fully_defined():
        return False
    seen, queue = {indices.op.name}, deque([indices.op])
    while queue:
        op = queue.popleft()
        if op.type in VARIABLE_OP_TYPES or op.type in _DATA_SOURCES or op.type in _PLACEHOLDERS:
            return False
        if op.type in _SHAPE_OPS:
            continue
        for t in op.inputs:
            if t.op.name not in seen:
                seen.add(t.op.name)
                queue.append(t.op)
    return True
