"""Keras programs that draw at random while they train, as keras-io writes them (Apache-2.0), rewritten small with
random data: part of tests/tf2/keras_programs.py's programs, trained by ``model.fit`` as written for the reference
``parallax.fit(model, <the same arguments>)`` must equal: each replica takes its rows of the draws one device makes
for the whole batch (parallax/tf2/draws.py), so the masks and the augmentations are one device's.

* ``mnist-convnet``: keras-io "Simple MNIST convnet": two ``Conv2D`` + ``MaxPooling2D`` blocks, ``Flatten``,
  ``Dropout(0.5)``, a softmax, Adam, ``categorical_crossentropy``, accuracy, ``validation_split=0.1``;
* ``augmented``: keras-io "Image classification from scratch"'s data augmentation inside the model
  (``RandomFlip("horizontal")``, ``RandomRotation(0.1)``), ``Rescaling``, a ``Conv2D``, ``GlobalAveragePooling2D``,
  ``Dropout(0.25)`` before one logit, ``BinaryCrossentropy(from_logits=True)``; SGD, and 29 examples in batches of
  8, so each epoch's last batch (5) does not split into equal parts.
"""

from __future__ import annotations

import numpy as np

from tests.tf2.loss_programs import keras_of

PROGRAMS = ("mnist-convnet", "augmented")
SIDE, CLASSES = 12, 4  # the images' side, mnist-convnet's classes


def build(name: str):
    keras = keras_of(name)
    layers = keras.layers
    keras.utils.set_random_seed(6)
    if name == "mnist-convnet":
        model = keras.Sequential([
            keras.Input(shape=(SIDE, SIDE, 1)),
            layers.Conv2D(4, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Conv2D(8, kernel_size=(3, 3), activation="relu"),
            layers.MaxPooling2D(pool_size=(2, 2)),
            layers.Flatten(),
            layers.Dropout(0.5),
            layers.Dense(CLASSES, activation="softmax"),
        ])
        model.compile(loss="categorical_crossentropy", optimizer="adam", metrics=["accuracy"])
        return model
    augmentation = [layers.RandomFlip("horizontal"), layers.RandomRotation(0.1)]
    inputs = keras.Input(shape=(SIDE, SIDE, 3))
    x = inputs
    for layer in augmentation:
        x = layer(x)
    x = layers.Rescaling(1.0 / 255)(x)
    x = layers.Conv2D(4, 3, strides=2, padding="same", activation="relu")(x)
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(0.25)(x)
    model = keras.Model(inputs, layers.Dense(1, activation=None)(x))
    model.compile(optimizer=keras.optimizers.SGD(0.5), loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.BinaryAccuracy(name="acc")])
    return model


def data(name: str):
    rng = np.random.RandomState(13)
    if name == "mnist-convnet":
        x = rng.rand(40, SIDE, SIDE, 1).astype(np.float32)
        return x, np.eye(CLASSES, dtype=np.float32)[rng.randint(0, CLASSES, 40)]
    return rng.randint(0, 256, size=(29, SIDE, SIDE, 3)).astype(np.float32), rng.randint(0, 2, 29).astype(np.float32)


def fit_arguments(name: str, fit: dict) -> dict:
    if name == "mnist-convnet":
        return {**fit, "validation_split": 0.1}
    return fit
