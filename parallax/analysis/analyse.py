"""Analysing a graph: its variables, their gradients and its training ops, checked against the refusals and
assembled into a :class:`~parallax.analysis.model.GraphAnalysis`."""

from __future__ import annotations

from dataclasses import replace

import tensorflow as tf

from parallax.analysis.batch_statistics import batch_statistics, replica_sums_of
from parallax.analysis.forward import _forward_ops
from parallax.analysis.gradients import _coupled_by_conditions, _find_raw_gradients, _gradient_of
from parallax.analysis.model import GraphAnalysis, VariableInfo, is_summed
from parallax.analysis.ops import VARIABLE_OP_TYPES, _op_name
from parallax.analysis.refusals import (
    _refuse_decisions_on_a_replicas_data,
    _refuse_gradients_behind_decisions,
    _refuse_hidden_updates,
    _refuse_trainables_written_from_data,
    _refuse_unapplied_gradients,
)
from parallax.analysis.scopes import _slots, _train_ops, _update_scopes
from parallax.analysis.update_order import gradients_after_updates
from parallax.graph.graph_ops import colocated_with

__all__ = ["analyse_graph"]


def analyse_graph(graph: tf.Graph) -> GraphAnalysis:
    """Find the variables, their gradients and the training ops of ``graph``.

    Args:
        graph: a single-device graph, usually with ``tf.compat.v1.train``
            optimizer updates (``minimize`` or ``apply_gradients``); without
            any it is forward only.

    Returns:
        A :class:`GraphAnalysis`.

    Raises:
        AnalysisError: a variable's gradient cannot be told apart from other
            inputs of its update, or two optimizer calls update it.
    """
    ops = graph.get_operations()
    trainable = {_op_name(v) for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
    summed = {_op_name(v) for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) if is_summed(v)}
    variables = []
    for op in ops:
        if op.type in VARIABLE_OP_TYPES:
            shape = op.get_attr("shape")
            dims = tuple(None if d.size < 0 else d.size for d in shape.dim) if hasattr(shape, "dim") \
                else tuple(tf.TensorShape(shape).as_list())
            variables.append(VariableInfo(op.name, dims, tf.dtypes.as_dtype(op.get_attr("dtype")).name,
                                          op.name in trainable, op.type != "VariableV2"
                                          and op.type != "Variable", _colocation(op), summed=op.name in summed))
    variables.sort(key=lambda v: v.name)
    scopes = _update_scopes(ops, [v.name for v in variables])
    slots = _slots(scopes, {v.name for v in variables})
    variables = [replace(v, slot_of=slots[v.name]) if v.name in slots and v.colocate_with == slots[v.name] else v
                 for v in variables]
    gradients = []
    for var_name in sorted(scopes):
        gradients.append(_gradient_of(var_name, scopes[var_name], graph))
    gradients = _find_raw_gradients(graph, gradients)
    gradients = _coupled_by_conditions(graph, gradients)
    _refuse_gradients_behind_decisions(graph, gradients)
    _refuse_decisions_on_a_replicas_data(graph, gradients)
    _refuse_hidden_updates(graph, {v.name for v in variables if v.trainable})
    _refuse_trainables_written_from_data(ops, {v.name for v in variables if v.trainable}, scopes, gradients)
    if not gradients:
        _refuse_unapplied_gradients(ops, {v.name for v in variables})
    train_ops = _train_ops(graph, scopes) if gradients else ()
    after_updates = gradients_after_updates(graph, gradients, train_ops)
    forward = _forward_ops(graph, gradients, {v.name: v for v in variables})
    statistics = batch_statistics(graph) if gradients else ()
    return GraphAnalysis(tuple(variables), tuple(gradients), train_ops, forward, statistics, after_updates,
                         replica_sums_of(graph) if gradients else ())


def _colocation(op) -> str | None:
    try:
        groups = op.get_attr("_class")
    except ValueError:
        return None
    return next((name for name in colocated_with(groups) if name != op.name), None)
