"""``parallax.fit`` of a model that overrides ``train_step`` (Keras's guide "Customizing what happens in
``fit()``": a custom loss or update, a GAN compiled with two optimizers): trained with the model's own step.

The step Parallax traces is ``model.train_step(data)``, ``data`` packed as ``model.fit`` packs it (``x``;
``(x, y)``; ``(x, y, sample_weight)``). Its metrics are the model's, updated inside the step; after every step what
the step added to them is summed over the workers into the model's metrics (:mod:`parallax.tf2.summed`: one
device's states, every example counted; with parameter servers, worker 0's examples, said at WARNING); the
progress bar shows what the step returned on this worker's first replica.

A batch that does not split evenly over the replicas is refused: Parallax pads such a batch with examples of
weight 0 (:func:`parallax.keras_fit.even_parts`), and a step of the program's own need not weigh them.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from parallax.logs import log

__all__ = ["warn_own_fit", "overrides_train_step", "own_train_step", "check_even"]


def overrides_train_step(model: Any, module: Any) -> bool:
    """Whether ``model``'s class overrides its Keras's ``Model.train_step``."""
    return type(model).train_step is not module.Model.train_step


def warn_own_fit(model: Any, module: Any) -> None:
    """Say at WARNING that ``model``'s class overrides ``fit``, which ``parallax.fit`` does not run (it trains on the
    batches Keras's own ``fit`` draws from the same arguments): a program comparing with its ``model.fit`` may see
    other batches."""
    if type(model).fit is module.Model.fit:
        return
    owner = next(c for c in type(model).__mro__ if "fit" in vars(c))
    log.warning("parallax.fit: %s overrides model.fit (%s.%s.fit), which parallax.fit does not run: it trains on the "
                "batches Keras's own Model.fit draws from the same arguments. A model.fit that prepares the data "
                "itself trains other batches (keras-hub's task models turn arrays into an unshuffled dataset and "
                "preprocess it): for the same ones, pass shuffle=False, or the prepared tf.data.Dataset",
                type(model).__name__, owner.__module__, owner.__name__)


def own_train_step(model: Any, signature: list, has_targets: bool, weighted: bool) -> Any:
    """The model's ``train_step`` as a ``tf.function`` of ``(x[, y][, sample_weight])``; it returns the step's
    logs (a dict of tensors)."""

    def step(*args):
        data = args[0] if len(args) == 1 else tuple(args)
        logs = model.train_step(data)
        return {k: v for k, v in logs.items() if isinstance(v, tf.Tensor)} if isinstance(logs, dict) else {}

    taken = [signature[0]] + ([signature[1]] if has_targets else []) + ([signature[2]] if weighted else [])
    return tf.function(step, input_signature=taken)


def check_even(examples: int, replicas: int) -> None:
    """Refuse a batch of ``examples`` that does not split into ``replicas`` equal parts.

    Raises:
        ValueError: naming the batch's size and the replicas, and what to change.
    """
    if examples % replicas:
        raise ValueError(f"parallax.fit: a batch of {examples} examples does not split into {replicas} equal parts, "
                         "and the model's own train_step need not weigh the padding Parallax would add: give a "
                         f"batch_size that {replicas} divides and drop the last short batch (a dataset's "
                         "batch(..., drop_remainder=True), or steps_per_epoch)")
