"""Keras's fault-tolerance guide as a user writes it: ``keras.callbacks.BackupAndRestore`` in ``fit``, the training
interrupted by a callback that raises at an epoch's start, then ``fit`` called again with the same callback, which
goes on from the last backup.

The model (two Dense layers, Adam, a metric, validation data) backs up every :data:`SAVE_FREQ` batches, so the
last backup before the interruption is of a batch within an epoch (``{"epoch": 1, "batch": 3}``): ``model.fit``
then restores that batch's weights and optimizer state (Adam's step count and moments) and trains again from
that epoch's start, as Keras 3 does. ``interrupted(directory)`` makes that backup with ``model.fit`` on one device;
``resumed(directory, fit)`` trains on from it with ``fit`` (``model.fit``, or ``parallax.fit``).
"""

from __future__ import annotations

import json
import os

import numpy as np

EPOCHS = 4
INTERRUPTED_AT = 2  # the epoch whose start raises
SAVE_FREQ = 5  # batches: 6 an epoch, so the backup before the interruption is of epoch 1's batch 3
BATCH = 16


def build():
    import keras

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((8,)), keras.layers.Dense(16, activation="relu"), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01), "mse", metrics=["mae"])
    return model


def data() -> tuple[np.ndarray, np.ndarray]:
    rs = np.random.RandomState(0)
    return rs.randn(96, 8).astype("float32"), rs.randn(96, 1).astype("float32")


def callback(directory: str):
    import keras

    return keras.callbacks.BackupAndRestore(directory, save_freq=SAVE_FREQ, delete_checkpoint=False)


def fit_arguments() -> dict:
    x, y = data()
    return dict(x=x, y=y, batch_size=BATCH, epochs=EPOCHS, verbose=0, validation_data=(x[:20], y[:20]))


def interrupted(directory: str) -> None:
    """Train on one device until epoch :data:`INTERRUPTED_AT` begins, backing up into ``directory``."""
    import keras

    class Interrupt(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            if epoch == INTERRUPTED_AT:
                raise RuntimeError("interrupted")

    model = build()
    try:
        model.fit(**fit_arguments(), callbacks=[callback(directory), Interrupt()])
    except RuntimeError:
        return
    raise AssertionError("the training was not interrupted")


def state(model, history) -> dict[str, np.ndarray]:
    """What a resumed training ends with: the History's logs, the weights and the optimizer's variables."""
    out = {f"history_{k}": np.asarray(v) for k, v in history.history.items()}
    out["epochs"] = np.asarray(history.epoch)
    out.update({f"weight_{i}": v.numpy() for i, v in enumerate(model.weights)})
    out.update({f"optimizer_{i}": v.numpy() for i, v in enumerate(model.optimizer.variables)})
    return out


def backup(directory: str) -> dict[str, np.ndarray]:
    """The last backup in ``directory``: its metadata, weights and optimizer variables (read into a new model)."""
    model = build()
    model.optimizer.build(model.trainable_variables)
    model.load_weights(os.path.join(directory, "latest.weights.h5"))
    with open(os.path.join(directory, "training_metadata.json")) as f:
        metadata = json.load(f)
    return {"metadata": np.asarray([metadata["epoch"], metadata["batch"]]),
            **{f"v{i}": v.numpy() for i, v in enumerate(model.weights + model.optimizer.variables)}}
