"""A replica's part of a batch in ``parallax.fit``'s step: its loss weighed by its real examples, its rows, and
Parallax's own per-example weights shaped for each output's loss."""

from __future__ import annotations

import functools
from typing import Any

import tensorflow as tf

from parallax.logs import log

__all__ = ["counts", "part_loss", "rows", "first", "per_example", "masked_losses", "warn_masked_loss",
           "sums_over_batch", "summed_weights", "with_added_sums"]


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


def sums_over_batch(model: Any) -> bool:
    """Whether every loss ``model`` is compiled with sums over the batch's examples (``reduction="sum"``, Keras 3's
    and tf_keras's alike): then one device's loss is the sum of its parts' losses, not their mean."""
    losses = [loss for loss in tf.nest.flatten(getattr(model, "loss", None)) if loss is not None]
    return bool(losses) and all(getattr(loss, "reduction", None) == "sum" for loss in losses)


def summed_weights(weights: Any, examples: tf.Tensor, x: Any) -> Any:
    """The per-example ``weights`` of a part ``x`` of a batch of ``examples`` for a loss that sums over the batch
    (:func:`sums_over_batch`), each scaled by ``examples`` over the part's rows: the part's loss, which
    :func:`part_loss` then weighs by its real examples against its share, is that many of the replicas' mean, so
    the replicas' mean is the sum over the batch (one device's loss), and the mean of a part's two halves is the
    part's (the first step's check).

    >>> float(summed_weights(tf.ones([2]), tf.constant(8.0), tf.zeros([2, 3]))[0])
    4.0
    """
    part = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], tf.float32)
    return tf.nest.map_structure(lambda w: w * tf.cast(examples / part, w.dtype), weights)


def with_added_sums(loss: tf.Tensor, added: list, examples: tf.Tensor, x: Any) -> tf.Tensor:
    """A part ``x``'s ``loss`` with what its layers ``added`` as one value per example, which Keras 3 sums into the
    loss, counted ``examples`` (the batch's) over the part's rows times, as :func:`summed_weights` counts a compiled
    loss that sums: the replicas' mean is then the sum over the batch, as one device's loss has it, and the mean of
    a part's two halves is the part's.

    >>> float(with_added_sums(tf.constant(5.0), [tf.constant([[1.0], [2.0]])], tf.constant(8.0), tf.zeros([2, 1])))
    14.0
    """
    if not added:
        return loss
    total = tf.add_n([tf.reduce_sum(tf.cast(a, loss.dtype)) for a in added])
    part = tf.cast(tf.shape(tf.nest.flatten(x)[0])[0], loss.dtype)
    return loss + total * (tf.cast(examples, loss.dtype) / part - 1)


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


def masked_losses(model: Any) -> list[str]:
    """What makes ``model``'s compiled loss an average over each batch's unmasked values, described: its masked
    outputs (a mask carried to them, an ``Embedding(mask_zero=True)``'s) and its losses with ``ignore_class``."""
    try:
        outputs = list(getattr(model, "outputs", None) or [])
    except (AttributeError, ValueError):  # a subclassed model: no symbolic outputs
        outputs = []
    masked = [f"output {i} is masked" for i, out in enumerate(outputs) if getattr(out, "_keras_mask", None) is not None]
    losses = tf.nest.flatten(getattr(model, "loss", None))
    return masked + [f"{type(loss).__name__}(ignore_class={loss.ignore_class!r})" for loss in losses
                     if getattr(loss, "ignore_class", None) is not None]


def warn_masked_loss(model: Any, replicas: int, summed: bool) -> None:
    """Say at WARNING where a model's compiled loss averages over the batch's unmasked values (a mask carried to an
    output, an ``Embedding(mask_zero=True)``'s; a loss with ``ignore_class``) and the job cannot make it the union
    batch's: Keras divides a masked loss by the batch's own count of unmasked values, which the step makes the
    job's count where it finds the division (``summed``, :mod:`parallax.tf2.masked_means`)."""
    if replicas < 2 or summed:
        return
    masked = masked_losses(model)
    if not masked:
        return
    log.warning("parallax.fit: the loss averages over the unmasked time steps of each batch (%s), and Parallax did not "
                "find where Keras divides by their count (a loss computed in a function the step calls): each of "
                "the %d replicas divides by its part's count, and where the parts of a batch hold different "
                "numbers of unmasked steps the replicas' mean is not the batch's loss: training differs from one "
                "device's. The first step's check says by how much", "; ".join(masked), replicas)
