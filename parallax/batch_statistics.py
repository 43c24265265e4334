"""Layers that normalise by the statistics of their batch: batch normalisation, as every framework builds it.

On one device such a layer normalises each example by the mean and variance of the whole batch; data-parallel,
each replica normalises its part by its part's, so training differs from one device (the gradients, and the
moving statistics each worker keeps). No data-parallel system makes that equal without synchronising the
statistics in the forward pass and their gradients in the backward one, which Parallax's rewrite of an already
differentiated graph does not do. So the job says so, naming the layers (:func:`batch_statistics`), and
``parallax.fit`` refuses a layer that asks for synchronised statistics (Keras's
``BatchNormalization(synchronized=True)``) rather than ignore the request.

Found in the graph, so in every front end: ``FusedBatchNorm*`` ops in training mode (TF1's
``batch_normalization``, tf_keras), and the ``moments`` of ``tf.nn.moments`` / Keras 3's layer outside
gradient scopes.
"""

from __future__ import annotations

import re

import tensorflow as tf

__all__ = ["batch_statistics", "statistics_note"]

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


def statistics_note(layers: tuple[str, ...], replicas: int) -> tuple[str, ...]:
    """The job's note (said at WARNING) when ``replicas`` replicas each normalise by their own part's statistics."""
    if not layers or replicas <= 1:
        return ()
    named = ", ".join(layers[:6]) + (f" and {len(layers) - 6} more" if len(layers) > 6 else "")
    verb = "normalises" if len(layers) == 1 else "normalise"
    return (f"batch statistics (batch normalisation): {named} {verb} each example by the statistics "
            f"of its batch; each of the {replicas} replicas normalises its own part by its part's, so training "
            "differs from one device (the gradients and the moving mean and variance). To train as one device, use "
            "a normalisation without batch statistics (LayerNormalization, GroupNormalization), or one replica",)
