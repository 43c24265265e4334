"""Layers that normalise by the statistics of their batch: batch normalisation, as every framework builds it.

On one device such a layer normalises each example by the mean and variance of the whole batch; data-parallel,
each replica normalises its part by its part's, so training differs from one device (the gradients, and the
moving statistics each worker keeps). No data-parallel system makes that equal without synchronising the
statistics in the forward pass and their gradients in the backward one. A layer that asks for that (Keras's
``BatchNormalization(synchronized=True)``, or every one with ``Config(sync_batch_norm=True)``) is synchronised:
its sums are named in the graph's :data:`REPLICA_SUMS` collection and made sums over the job. Of the others, the
job says so, naming the layers (:func:`batch_statistics`).

Found in the graph, so in every front end: ``FusedBatchNorm*`` ops in training mode (TF1's
``batch_normalization``, tf_keras), and the ``moments`` of ``tf.nn.moments`` / Keras 3's layer outside
gradient scopes.
"""

from __future__ import annotations

import re
from typing import Any

import tensorflow as tf

from parallax.errors import PlanError

__all__ = ["batch_statistics", "statistics_note", "REPLICA_SUMS", "replica_sums_of", "refuse_unsynchronised"]

#: The graph collection of the ``IdentityN`` ops that stand for sums over every replica of the job: a
#: synchronised batch normalisation's statistics and their gradients (:mod:`parallax.tf2.replica_sums` fills it
#: when it traces a step; :mod:`parallax.rewrite.aggregate` makes each a sum over the job's replicas).
REPLICA_SUMS = "parallax_replica_sums"

_FUSED = frozenset({"FusedBatchNorm", "FusedBatchNormV2", "FusedBatchNormV3"})
_MOMENTS = re.compile(r"^(?P<layer>.*?)/moments/mean$")
_GRADIENTS = re.compile(r"(^|/)(gradients(_\d+)?|gradient_tape)/")


def batch_statistics(graph: tf.Graph) -> tuple[str, ...]:
    """The name scopes of the layers of ``graph`` that normalise by their batch's statistics, sorted.

    >>> g = tf.Graph()
    >>> with g.as_default():
    ...     x = tf.compat.v1.placeholder(tf.float32, [None, 3])
    ...     with tf.name_scope("bn"):
    ...         mean, variance = tf.nn.moments(x, axes=[0])
    >>> batch_statistics(g)
    ('bn',)
    """
    layers = set()
    for op in graph.get_operations():
        if _GRADIENTS.search(op.name):
            continue
        if op.type in _FUSED and op.get_attr("is_training"):
            layers.add(op.name.rsplit("/", 1)[0])
            continue
        found = _MOMENTS.match(op.name) if op.type == "Mean" else None
        if found is not None and _over_the_batch(op):
            layers.add(found.group("layer"))
    return tuple(sorted(layers))


def replica_sums_of(graph: tf.Graph) -> tuple[str, ...]:
    """The names of the ops in ``graph``'s :data:`REPLICA_SUMS` collection, in its order."""
    return tuple(getattr(op, "name", op) for op in graph.get_collection(REPLICA_SUMS))


def _over_the_batch(mean: tf.Operation) -> bool:
    """Whether a ``Mean`` reduces the first (batch) axis: batch normalisation's moments do, layer
    normalisation's (the last axis) do not. Axes that are not a constant count as the batch's."""
    from tensorflow.python.framework import tensor_util

    try:
        axes = tensor_util.constant_value(mean.inputs[1])
    except (TypeError, ValueError):
        axes = None
    if axes is None:
        return True
    rank = mean.inputs[0].shape.rank
    return any(int(a) == 0 or (rank is not None and int(a) + rank == 0) for a in axes.reshape(-1))


def refuse_unsynchronised(analysis: Any, every: bool, pipeline: Any) -> None:
    """Refuse what ``Config(sync_batch_norm=True)`` (``every``) cannot make synchronised (a layer that
    normalises by its batch's statistics, left of :func:`batch_statistics`), and synchronised statistics in a
    pipeline's micro-batches (each would be summed alone).

    Raises:
        PlanError: naming the layers, and what to do.
    """
    if every and analysis.batch_statistics:
        raise PlanError(f"Config(sync_batch_norm=True): {', '.join(analysis.batch_statistics[:6])} normalise by "
                        "their batch's statistics in a way Parallax does not synchronise: it sums over the replicas "
                        "the statistics of Keras's BatchNormalization (Keras 3 or tf_keras) of parallax.fit's "
                        "model, or of one built with synchronized=True in a tf.function step")
    if analysis.replica_sums and (pipeline.stages > 1 or pipeline.micro_batches > 1):
        raise PlanError(f"synchronised batch statistics with pipeline_stages={pipeline.stages}, micro_batches="
                        f"{pipeline.micro_batches}: each micro-batch would normalise alone; train without "
                        "micro-batches, or without synchronized=True / Config(sync_batch_norm=True)")


def statistics_note(layers: tuple[str, ...], replicas: int) -> tuple[str, ...]:
    """The job's note (said at WARNING) when ``replicas`` replicas each normalise by their own part's statistics."""
    if not layers or replicas <= 1:
        return ()
    named = ", ".join(layers[:6]) + (f" and {len(layers) - 6} more" if len(layers) > 6 else "")
    verb = "normalises" if len(layers) == 1 else "normalise"
    return (f"batch statistics (batch normalisation): {named} {verb} each example by the statistics "
            f"of its batch; each of the {replicas} replicas normalises its own part by its part's, so training "
            "differs from one device (the gradients and the moving mean and variance). To train as one device, "
            "synchronise the statistics (parallax.Config(sync_batch_norm=True) for parallax.fit's Keras "
            "BatchNormalization layers; BatchNormalization(synchronized=True) in a tf.function step), or use a "
            "normalisation without batch statistics (LayerNormalization, GroupNormalization), or one replica",)
