"""The forward pass's ops with their estimated costs, for cutting the model into pipeline stages
(:mod:`parallax.plan.stages`)."""

from __future__ import annotations

from collections import deque

import tensorflow as tf

from parallax.analysis.model import ForwardOp, GradientInfo
from parallax.analysis.ops import _PURE_READS, VARIABLE_OP_TYPES, _in_gradient_scope

__all__ = ["_forward_ops"]


def _forward_ops(graph: tf.Graph, gradients: list[GradientInfo], variables: dict) -> tuple[ForwardOp, ...]:
    """The ancestors of the gradients, variables and ``gradients`` scopes apart, in creation order."""
    starts = [graph.get_tensor_by_name(t).op for g in gradients for t in g.aggregation_tensors if t]
    seen = {op.name for op in starts}
    queue = deque(starts)
    while queue:
        op = queue.popleft()
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent.name not in seen and parent.type not in VARIABLE_OP_TYPES:
                seen.add(parent.name)
                queue.append(parent)
    out = []
    for op in graph.get_operations():
        if op.name not in seen or _in_gradient_scope(op):
            continue
        reads = []
        for t in op.inputs:
            source = t.op
            if source.type in ("Identity", "ReadVariableOp") and source.inputs:
                source = source.inputs[0].op
            if source.type in VARIABLE_OP_TYPES and source.name in variables and op.type not in _PURE_READS:
                reads.append(source.name)
        cost = 1
        for name in reads:
            shape = variables[name].shape
            elements = 1
            for d in (shape[1:] if "Gather" in op.type and shape else shape):
                elements *= d or 1
            cost += elements
        out.append(ForwardOp(op.name, cost, tuple(dict.fromkeys(reads))))
    return tuple(out)
