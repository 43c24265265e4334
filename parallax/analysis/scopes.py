"""Where the optimizer updates each variable: its ``update_<variable>`` scopes, the slots read there alone and
the training ops the updates lead to."""

from __future__ import annotations

import re
from collections import deque

import tensorflow as tf

from parallax.analysis.ops import _PURE_READS, _behind_switches, _op_name

__all__ = ["update_scope_owner", "_update_scopes", "_slots", "_train_ops"]


def update_scope_owner(var_names: list[str]):
    """A function from an op name to the variable whose ``update_<var>`` scope
    holds the op (the innermost such scope; the longest variable name where
    several fit), or ``None``. A scope is ``update_<var>/`` or ``update_<var>_<n>/``,
    at the start of the name or after a ``/``. Linear in the name's length."""
    names = frozenset(var_names)

    def variable_of(scope: str) -> str | None:
        if scope in names:
            return scope
        m = _NUMBERED.fullmatch(scope)
        return m.group(1) if m and m.group(1) in names else None

    def owner(op_name: str) -> str | None:
        start = op_name.rfind("update_")
        while start >= 0:
            if start == 0 or op_name[start - 1] == "/":
                rest = op_name[start + len("update_"):]
                end = rest.rfind("/")
                while end > 0:  # the longest scope first
                    var = variable_of(rest[:end])
                    if var is not None:
                        return var
                    end = rest.rfind("/", 0, end)
            start = op_name.rfind("update_", 0, start)
        return None

    return owner


_NUMBERED = re.compile(r"(.+)_\d+")


def _update_scopes(ops, var_names: list[str]) -> dict[str, list]:
    """Map each variable name to the ops of its ``update_<var>`` scopes."""
    owner = update_scope_owner(var_names)
    scopes: dict[str, list] = {}
    for op in ops:
        var = owner(op.name)
        if var is not None:
            scopes.setdefault(var, []).append(op)
    return scopes


def _slots(scopes: dict[str, list], variable_names: set[str]) -> dict[str, str]:
    """``{slot: primary}``: the variables that enter exactly one variable's update scope
    (as a handle, a ref or a read), other than that variable itself."""
    readers: dict[str, set[str]] = {}
    for owner, ops in scopes.items():
        for op in ops:
            for t in op.inputs:
                source = t.op
                if source.type in ("Identity", "ReadVariableOp") and source.inputs:
                    source = source.inputs[0].op
                source = _behind_switches(source)
                if source.name in variable_names and source.name != owner:
                    readers.setdefault(source.name, set()).add(owner)
    return {slot: next(iter(owners)) for slot, owners in readers.items() if len(owners) == 1}


def _train_ops(graph: tf.Graph, scopes: dict[str, list]) -> tuple[str, ...]:
    collected = graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)
    if collected:
        return tuple(dict.fromkeys(_op_name(t) for t in collected))
    # Sinks reachable from the update ops (following data and control edges).
    consumers: dict[str, list] = {}
    for op in graph.get_operations():
        for t in op.inputs:
            consumers.setdefault(t.op.name, []).append(op)
        for c in op.control_inputs:
            consumers.setdefault(c.name, []).append(op)
    starts = [op for ops in scopes.values() for op in ops]
    seen = {op.name for op in starts}
    queue = deque(starts)
    sinks = []
    while queue:
        op = queue.popleft()
        outs = consumers.get(op.name, [])
        if not outs and op.name not in {o.name for o in starts} and op.type not in _PURE_READS:
            sinks.append(op.name)
        for c in outs:
            if c.name not in seen:
                seen.add(c.name)
                queue.append(c)
    return tuple(sorted(sinks))
