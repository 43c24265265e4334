"""What differs between a Keras 3 model and a ``tf_keras`` one, for ``parallax.fit``, ``evaluate`` and ``predict``.

The loops of :mod:`parallax.keras_fit` and :mod:`parallax.tf2.evaluate` are one; a :class:`Flavor` is the
little that each Keras does its own way: its callbacks module, whether a model is compiled, how its
``train_step`` computes the loss and applies the update, its evaluation step, and the order of its metrics.
Everything else (``compute_metrics``, ``reset_metrics``, ``get_metrics_result``, ``predict_on_batch``,
``metrics``, ``CallbackList``) both spell alike.
"""

from __future__ import annotations

import sys
import weakref
from typing import Any

import tensorflow as tf

__all__ = ["Flavor", "flavor_of"]


class Flavor:
    """Keras 3 (``keras``): the step is ``Model.train_step``'s, ``compute_loss(..., training=True)`` then the
    optimizer's ``apply_gradients``."""

    name = "Keras 3"
    #: Whether ``fit``'s step updates the compiled metrics (and the loss tracker) itself, in the graph, as
    #: ``model.fit``'s does (:meth:`update_metrics`); else the host updates them from the step's predictions.
    metrics_in_step = True

    def __init__(self, module: Any) -> None:
        self.module = module
        self._test_steps: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def callbacks(self) -> Any:
        return self.module.callbacks

    def compiled(self, model: Any) -> bool:
        return getattr(model, "optimizer", None) is not None and bool(getattr(model, "compiled", False))

    def loss(self, model: Any, x: Any, y: Any, prediction: Any, sample_weight: Any) -> Any:
        """The model's loss as its ``train_step`` computes it: through Keras's own call of ``compute_loss``, which
        passes ``training`` only to an override that takes it (one written before Keras 3.3 does not)."""
        compute = getattr(model, "_compute_loss", None)
        if compute is None:
            return model.compute_loss(x=x, y=y, y_pred=prediction, sample_weight=sample_weight, training=True)
        return compute(x=x, y=y, y_pred=prediction, sample_weight=sample_weight, training=True)

    def scaled(self, model: Any, loss: Any) -> Any:
        """The loss the gradients are taken of: Keras 3's ``train_step`` scales it by the optimizer's loss
        scale (a ``LossScaleOptimizer``, or ``loss_scale_factor``), inside the tape."""
        return model.optimizer.scale_loss(loss)

    def apply(self, model: Any, tape: tf.GradientTape, loss: Any) -> None:
        variables = model.trainable_weights
        model.optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))

    def learning_rate(self, model: Any) -> Any:
        """The optimizer's learning rate when it is a variable that callbacks may set between steps
        (``ReduceLROnPlateau``, ``LearningRateScheduler``), or ``None`` (a schedule)."""
        rate = getattr(model.optimizer, "_learning_rate", None)
        return rate if isinstance(rate, (self.module.Variable, tf.Variable)) else None

    def regularization(self, model: Any) -> Any:
        """What the step returns beside the loss for :meth:`record_loss`: nothing Keras 3 needs."""
        return tf.zeros([])

    def record_loss(self, model: Any, loss: Any, regularization: Any, x: Any, y: Any, sample_weight: Any,
                    prediction: Any, share: float) -> None:
        """Update the model's loss metric on the host with one replica's part, as its ``train_step`` does:
        Keras 3 averages the step's loss, weighted by the batch's examples; a replica's ``loss`` counts for
        its ``share`` of them (the batch's examples over the replicas: the losses of a padded batch's parts
        are scaled so that their mean is the batch's, :func:`parallax.keras_fit.even_parts`)."""
        tracker = next(m for m in model.metrics if m.name == "loss")
        tracker.update_state(loss, sample_weight=share)

    def update_metrics(self, model: Any, x: Any, y: Any, prediction: Any, weight: Any, loss: Any,
                       share: Any) -> None:
        """Update the model's metrics inside the step, with one replica's part, as its ``train_step`` does: the
        loss tracker with the part's loss counted for ``share`` examples (the batch's over the replicas: a
        padded batch's parts' losses are scaled so that their mean is the batch's), the compiled metrics with
        ``weight`` (the user's weights, or ones; 0 for padding)."""
        tracker = next(m for m in model.metrics if m.name == "loss")
        tracker.update_state(loss, sample_weight=share)
        model.compute_metrics(x, y, prediction, sample_weight=weight)

    def test_batch(self, model: Any, x: Any, y: Any, sample_weight: Any) -> None:
        """The model's own ``test_step`` on one batch (the metrics updated, not reset), compiled as Keras
        compiles it (``jit_compile`` as the model says), once per model."""
        step = self._test_steps.get(model)
        if step is None:
            step = tf.function(model.test_step, reduce_retracing=True, jit_compile=bool(model.jit_compile))
            self._test_steps[model] = step
        step((x, y, sample_weight))

    def in_order(self, model: Any, logs: dict) -> Any:
        """``logs`` as ``model.evaluate(..., return_dict=False)`` returns them."""
        return model._flatten_metrics_in_order(logs)


class TfKerasFlavor(Flavor):
    """``tf_keras``: the step is its ``Model.train_step``'s, ``compute_loss`` then ``optimizer.minimize`` (legacy
    and new optimizers alike)."""

    name = "tf_keras"
    metrics_in_step = False  # its compiled loss keeps loss metrics of its own: updated on the host (record_loss)

    def compiled(self, model: Any) -> bool:
        return getattr(model, "optimizer", None) is not None and bool(getattr(model, "_is_compiled", False))

    def loss(self, model: Any, x: Any, y: Any, prediction: Any, sample_weight: Any) -> Any:
        return model.compute_loss(x, y, prediction, sample_weight)

    def scaled(self, model: Any, loss: Any) -> Any:
        """tf_keras' ``minimize`` scales the loss itself (its ``LossScaleOptimizer``)."""
        return loss

    def apply(self, model: Any, tape: tf.GradientTape, loss: Any) -> None:
        model.optimizer.minimize(loss, model.trainable_variables, tape=tape)

    def learning_rate(self, model: Any) -> Any:
        optimizer = model.optimizer
        if hasattr(optimizer, "_hyper"):  # a legacy optimizer: its hyper-parameters become variables when made
            optimizer._create_hypers()
            rate = optimizer._hyper.get("learning_rate")
        else:
            rate = getattr(optimizer, "_learning_rate", None)
        return rate if isinstance(rate, tf.Variable) else None

    def regularization(self, model: Any) -> Any:
        return tf.add_n(model.losses) if model.losses else tf.zeros([])

    def record_loss(self, model: Any, loss: Any, regularization: Any, x: Any, y: Any, sample_weight: Any,
                    prediction: Any, share: float) -> None:
        """tf_keras's compiled loss updates its loss metrics itself (inside the step, where they would be each
        replica's own): it runs again on the host, on the replica's predictions, with the regularization
        losses the step computed, so its loss metrics (the total, and one per output) are updated as its
        ``train_step`` updates them."""
        del loss, share
        if not len(tf.nest.flatten(x)[0]):  # a part of padding only
            return
        model.compiled_loss(y, prediction, sample_weight,
                            regularization_losses=[regularization] if model.losses else None)

    def test_batch(self, model: Any, x: Any, y: Any, sample_weight: Any) -> None:
        model.test_on_batch(x, y, sample_weight=sample_weight, reset_metrics=False)

    def in_order(self, model: Any, logs: dict) -> Any:
        names = model.metrics_names
        results = [logs[n] for n in names if n in logs] + [logs[k] for k in sorted(logs) if k not in names]
        return results[0] if len(results) == 1 else results


_FLAVORS: dict[str, Flavor] = {}


def flavor_of(model: Any, caller: str, compiled: bool = True) -> Flavor:
    """The :class:`Flavor` of ``model``, which must be ``compiled`` (unless told otherwise).

    Raises:
        TypeError: ``model`` is neither a Keras 3 nor a ``tf_keras`` model.
        ValueError: it is not compiled.
    """
    import keras

    flavor = None
    if isinstance(model, keras.Model):
        flavor = _FLAVORS.setdefault("keras", Flavor(keras))
    elif "tf_keras" in sys.modules and isinstance(model, sys.modules["tf_keras"].Model):
        flavor = _FLAVORS.setdefault("tf_keras", TfKerasFlavor(sys.modules["tf_keras"]))
    if flavor is None:
        raise TypeError(f"{caller}: model must be a Keras 3 model (keras.Model) or a tf_keras one (tf_keras.Model), "
                        f"got {type(model).__name__}; for a custom loop, pass a tf.function step to parallel_run")
    if compiled and not flavor.compiled(model):
        raise ValueError(f"{caller}: the model is not compiled; call model.compile(optimizer=..., loss=..., "
                         f"metrics=...) first, as for model.{caller.rsplit('.', 1)[-1]}")
    return flavor
