"""Keras 3's count of the step that finds an epoch's data exhausted, in ``parallax.fit``.

Where the data's length is unknown (a generator, a ``tf.data`` pipeline after ``filter()``), Keras 3's
``model.fit`` draws batches until the data runs out, and that last step, which trains nothing, still increments
``optimizer.iterations``: 15 after 3 epochs of 4 batches, 5 in the first epoch's ``on_epoch_end``. An optimizer that
reads the count (Adam's bias correction, a learning-rate schedule) sees it from the second epoch on.
``parallax.fit`` counts it as ``model.fit`` does: the model's count is raised on the host at such an epoch's end
(after the job's variables are written back into the model: what the callbacks and a checkpoint see), and the job's
own copy at the next step, which :func:`counting` makes take the steps it is behind as an argument.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from parallax.logs import log

__all__ = ["counted_optimizer", "warn_uncounted", "counting"]


def counted_optimizer(model: Any, counts_exhausted: bool) -> Any:
    """The optimizer whose count ``parallax.fit`` raises at the end of each epoch that ran out of data
    (``counts_exhausted``: the data's length is unknown, in Keras 3), or ``None``. A model compiled with no single
    optimizer (a GAN's two) has none (:func:`warn_uncounted`)."""
    if not counts_exhausted:
        return None
    optimizer = getattr(model, "optimizer", None)
    return optimizer if getattr(optimizer, "iterations", None) is not None else None


def warn_uncounted(counts_exhausted: bool, counted: Any) -> None:
    """Say at WARNING where Keras 3 counts a step more at each epoch's end that ``parallax.fit`` cannot: a model
    of no single compiled optimizer (``counted``: :func:`counted_optimizer`'s answer)."""
    if counts_exhausted and counted is None:
        log.warning("parallax.fit: the data's length is unknown (a generator, or a tf.data pipeline of unknown "
                    "cardinality, e.g. after filter()): Keras 3's model.fit then counts one optimizer step more than "
                    "it trains at each epoch's end, which parallax.fit copies for the model's compiled optimizer; "
                    "this model has none (its train_step uses optimizers of its own), so an optimizer that reads its "
                    "count (Adam's bias correction, a learning-rate schedule) may differ from model.fit from the "
                    "second epoch on. Give steps_per_epoch, or the dataset's length "
                    "(dataset.apply(tf.data.experimental.assert_cardinality(n))), for the same training in both")


def counting(step: Any, optimizer: Any) -> Any:
    """``step`` (a ``tf.function`` with an input signature) taking one argument more, last: the optimizer steps
    ``model.fit`` counted that the job has not (0; 1 at the first step after an epoch that ran out of data), added
    to ``optimizer.iterations`` before ``step`` trains (its reads of the count come after: one resource, in program
    order). A shared variable's write: one replica's counts, as the optimizer's own increment."""
    iterations = optimizer.iterations

    def counted(*args):
        iterations.assign_add(tf.cast(args[-1], iterations.dtype))
        return step.python_function(*args[:-1])

    return tf.function(counted, input_signature=[*step.input_signature, tf.TensorSpec([], tf.int64)])
