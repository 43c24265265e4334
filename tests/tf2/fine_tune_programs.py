"""keras-io's "Transfer learning & fine-tuning" (Apache-2.0), rewritten small with random data of the real layout: a
base model frozen (``trainable = False``, called with ``training=False``) under a new head, trained by ``fit`` with
validation data; then the base unfrozen, the model compiled again with a lower learning rate (a new optimizer, new
metrics) and trained by ``fit`` again. ``train(flavor, fit)`` runs both stages with ``fit`` (``model.fit`` on one
device, or ``parallax.fit``): Keras 3 (``keras``) or tf_keras."""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any

import numpy as np

FLAVORS = ("keras", "tf_keras")
EXAMPLES, BATCH, EPOCHS = 64, 16, 2


def data() -> tuple:
    """The training and the validation examples: 8 features, a label by the first one's sign."""
    rng = np.random.default_rng(1)
    x, vx = rng.normal(size=(EXAMPLES, 8)).astype("float32"), rng.normal(size=(16, 8)).astype("float32")
    return x, (x[:, :1] > 0).astype("float32"), (vx, (vx[:, :1] > 0).astype("float32"))


def _compile(keras: Any, model: Any, rate: float) -> None:
    model.compile(keras.optimizers.Adam(rate), keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.BinaryAccuracy()])


def train(flavor: str, fit: Callable[..., Any]) -> tuple[Any, list[dict]]:
    """The model after both stages, and each stage's History (as dicts)."""
    keras = importlib.import_module(flavor)
    keras.utils.set_random_seed(11)
    base = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"),
                             keras.layers.Dense(16, activation="relu")], name="base")
    base.trainable = False
    inputs = keras.Input((8,))
    model = keras.Model(inputs, keras.layers.Dense(1)(base(inputs, training=False)))
    _compile(keras, model, 1e-2)
    x, y, validation = data()
    histories = [fit(model, x, y, batch_size=BATCH, epochs=EPOCHS, validation_data=validation, verbose=0).history]
    base.trainable = True  # fine-tuning: every layer trained, at a lower rate
    _compile(keras, model, 1e-3)
    histories.append(fit(model, x, y, batch_size=BATCH, epochs=EPOCHS, validation_data=validation, verbose=0).history)
    return model, histories


def single_device(flavor: str) -> tuple[list, list[dict]]:
    """``model.fit`` in both stages: the trained weights and the Histories."""
    model, histories = train(flavor, lambda model, *args, **kwargs: model.fit(*args, **kwargs))
    return [w.numpy() for w in model.weights], histories
