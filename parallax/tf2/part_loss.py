"""A replica's part of a batch in ``parallax.fit``'s step: its loss weighed by its real examples, its rows, and
Parallax's own per-example weights shaped for each output's loss."""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf

from parallax.logs import log

__all__ = ["counts", "part_loss", "rows", "first", "per_example", "warn_masked_loss"]


def counts(real: tf.Tensor, share: tf.Tensor) -> tf.Tensor:
    """How much a replica's part counts for against its ``share`` of the batch: its ``real`` examples over it."""
    return tf.cast(real, tf.float32) / share


def part_loss(loss: tf.Tensor, real: tf.Tensor, share: tf.Tensor) -> tf.Tensor:
    """A replica's whole loss on the ``real`` examples of its part, weighed by them against its ``share`` of the
    batch (the batch's examples over the replicas): the replicas' mean is then the batch's loss as one device
    computes it, whatever the part's loss is made of (a mean over its examples, a regularization counted once,
    an activity regularization), and for a padded batch too (a part of padding only counts for nothing).

    >>> float(part_loss(tf.constant(2.0), tf.constant(1), tf.constant(4.0)))
    0.5
    """
    return loss * tf.cast(counts(real, share), loss.dtype)


def rows(count: tf.Tensor, structure: Any) -> Any:
    """The first ``count`` rows of every tensor of ``structure`` (:func:`first`)."""
    return tf.nest.map_structure(functools.partial(first, count), structure)


def first(count: tf.Tensor, tensor: tf.Tensor) -> tf.Tensor:
    """The first ``count`` rows of ``tensor``, with those of its Keras mask (a masked model's prediction)."""
    if tensor is None:
        return None
    kept = tensor[:count]
    mask = getattr(tensor, "_keras_mask", None)
    if mask is not None:
        kept._keras_mask = mask[:count]
    return kept


def per_example(weights: tf.Tensor, prediction: Any) -> tf.Tensor:
    """Weights of one value per example shaped to weigh every loss value of its example: ``(batch, 1, ...)`` to
    the rank of the loss (the prediction's less its last axis), so that a loss per time step, ``(batch, time)``,
    takes them as Keras takes weights of its own rank (``model.fit`` without weights weighs nothing). A model
    whose outputs have other ranks gets weights shaped for each output, in the predictions' structure."""
    outputs = tf.nest.flatten(prediction)
    if len({p.shape.rank for p in outputs}) > 1:
        return tf.nest.map_structure(lambda p: _shaped(weights, p.shape.rank), prediction)
    return _shaped(weights, outputs[0].shape.rank)


def _shaped(weights: tf.Tensor, rank: int | None) -> tf.Tensor:
    """Weights of one value per example, ``(batch, 1, ...)`` to weigh a loss of an output of ``rank``."""
    if rank is None or rank <= 2:
        return weights
    return tf.reshape(weights, [-1] + [1] * (rank - 2))


def warn_masked_loss(model: Any, replicas: int) -> None:
    """Say at WARNING where a model's compiled loss averages over the batch's unmasked time steps (a mask carried
    to an output, an ``Embedding(mask_zero=True)``'s; a loss with ``ignore_class``): Keras 3 and tf_keras divide a
    masked loss by the batch's own count of unmasked steps, so each replica divides by its part's, and their mean
    is the batch's loss only where the parts hold as many unmasked steps."""
    if replicas < 2:
        return
    try:
        outputs = list(getattr(model, "outputs", None) or [])
    except (AttributeError, ValueError):  # a subclassed model: no symbolic outputs
        outputs = []
    masked = [f"output {i} is masked" for i, out in enumerate(outputs) if getattr(out, "_keras_mask", None) is not None]
    losses = tf.nest.flatten(getattr(model, "loss", None))
    masked += [f"{type(loss).__name__}(ignore_class={loss.ignore_class!r})" for loss in losses
               if getattr(loss, "ignore_class", None) is not None]
    if masked:
        log.warning("parallax.fit: the loss averages over the unmasked time steps of each batch (%s): Keras divides "
                    "it by the batch's own count of them, so each of the %d replicas divides by its part's, and where "
                    "the parts of a batch hold different numbers of unmasked steps the replicas' mean is not the "
                    "batch's loss: training differs from one device's (as in every data-parallel system). The first "
                    "step's check says by how much", "; ".join(masked), replicas)
