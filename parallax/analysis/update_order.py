"""Refuse a step whose gradients are computed after some of its own updates.

Parallax aggregates every gradient of a step across the replicas at once, after the backward pass, and then
applies the updates (:mod:`parallax.rewrite.aggregate`, :mod:`parallax.rewrite.ps_sync`). A step that applies
one update and then computes another gradient with the updated variables (a GAN whose generator's loss reads the
discriminator just trained, as Keras's guide "Customizing what happens in fit()" writes its GAN) cannot be
aggregated so: the second gradient waits for the first update, which waits for the aggregation. Refused, naming
both, rather than left to TensorFlow's "nodes in a cycle". (A step that computes every gradient first and then
applies them, as TensorFlow's DCGAN tutorial does, is aggregated as usual.)
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from typing import Any

import tensorflow as tf

from parallax.errors import AnalysisError

__all__ = ["gradients_after_updates", "refuse_gradients_after_updates"]


def gradients_after_updates(graph: tf.Graph, gradients: Sequence[Any], train_ops: Sequence[str]) -> str:
    """Why the step cannot be aggregated at once (``""``: it can): a gradient of ``gradients``
    (:class:`parallax.analysis.GradientInfo`) computed from an op of another variable's update (through data or
    control edges) that the same training op runs, one step. (Two training ops run in turn, a TF1 GAN's, are two
    steps. Asynchronous PS, where each worker applies its own gradients, trains such a step:
    :func:`refuse_gradients_after_updates` is the synchronous layouts' check.)"""
    update_of = {name: g.variable for g in gradients for name in g.update_ops}
    if not update_of:
        return
    after = _after(graph, update_of)
    for g in gradients:
        own = set(g.update_ops)
        for name in g.aggregation_tensors:
            if name is None or graph.get_tensor_by_name(name).op.name not in after:
                continue
            found = _update_before(graph.get_tensor_by_name(name).op, update_of, own)
            if found is not None and _one_step(graph, train_ops, found, own):
                return (f'the gradient of "{g.variable}" ({name}) is computed after the update of '
                        f'"{update_of[found]}" ("{found}") in the same step: Parallax aggregates every gradient of a '
                        "step across the replicas before it applies the updates, so it cannot train a step that "
                        "updates some variables and then differentiates with them (a GAN that trains its "
                        "discriminator, then its generator through the updated discriminator). Compute every "
                        "gradient first and apply them after, or train the two parts in two steps (two tf.function "
                        "steps, each given to parallel_run)")
    return ""


def refuse_gradients_after_updates(why: str, sync: bool) -> None:
    """Refuse, in a synchronous job, the step :func:`gradients_after_updates` found.

    Raises:
        AnalysisError: naming the gradient, the update it waits for, and what to change.
    """
    if why and sync:
        raise AnalysisError(why)


def _one_step(graph: tf.Graph, train_ops: Sequence[str], update: str, own: set[str]) -> bool:
    """Whether one training op runs both ``update`` and the updates ``own`` (one of them at least)."""
    for name in train_ops:
        before = _before(graph.get_operation_by_name(name))
        if update in before and own & before:
            return True
    return False


def _before(op: tf.Operation) -> set[str]:
    """The ops ``op`` depends on (through data or control edges), itself included."""
    seen, queue = {op.name}, deque([op])
    while queue:
        current = queue.popleft()
        for source in [t.op for t in current.inputs] + list(current.control_inputs):
            if source.name not in seen:
                seen.add(source.name)
                queue.append(source)
    return seen


def _after(graph: tf.Graph, update_of: dict[str, str]) -> set[str]:
    """The ops that depend on some update op (through data or control edges)."""
    queue = deque(graph.get_operation_by_name(name) for name in update_of)
    seen = set(update_of)
    while queue:
        op = queue.popleft()
        for consumer in [c for t in op.outputs for c in t.consumers()] + list(op._control_outputs):
            if consumer.name not in seen:
                seen.add(consumer.name)
                queue.append(consumer)
    return seen


def _update_before(start: tf.Operation, update_of: dict[str, str], own: set[str]) -> str | None:
    """The first op of another variable's update that ``start`` depends on, or ``None``."""
    seen, queue = {start.name}, deque([start])
    while queue:
        op = queue.popleft()
        if op.name in update_of and op.name not in own:
            return op.name
        for source in [t.op for t in op.inputs] + list(op.control_inputs):
            if source.name not in seen:
                seen.add(source.name)
                queue.append(source)
    return None
