"""Keras programs whose loss is not one compiled loss of one output, rewritten small with random data of the real
layout; part of tests/tf2/keras_programs.py's programs, trained by ``model.fit`` as written for the reference
``parallax.fit(model, <the same arguments>)`` must equal.

* ``tickets``: Keras's guide "The Functional API", its model of several inputs and outputs (Apache-2.0,
  keras-io): a ticket's title and body (token ids, an ``Embedding`` and an ``LSTM`` each) and its tags, a priority
  (one logit, ``BinaryCrossentropy(from_logits=True)``) and a department (``CategoricalCrossentropy``) as a dict
  of outputs, ``loss_weights`` 1.0 / 0.2, RMSprop, dicts of arrays in and out; here with an accuracy metric per
  output and ``validation_split`` (29 examples: the last batch of each epoch, and the validation's, do not split
  evenly, where each output's loss metric counts every batch once);
* ``tagger``: a sequence tagger with a score per sequence (``MeanSquaredError``) and a tag per token
  (``SparseCategoricalCrossentropy`` of each time step) as a list of outputs of other ranks, a list of sample
  weights to match (one per sequence, one per token), SGD with momentum (a wrong scale shows), 31 examples;
* ``tf_keras-tickets``: ``tickets`` in ``tf_keras`` (a list of outputs and losses), with ``validation_data``;
* ``captcha``: keras-io "OCR model for reading Captchas" (Apache-2.0): images and their labels as a dataset of
  dicts with no targets, the labels an input of the model, whose ``CTCLayer`` adds the CTC loss (``add_loss``)
  to a convolution, a bidirectional LSTM and a softmax per column, compiled with an optimizer alone, with
  ``validation_data``. Adapted: the layer adds the batch's mean (upstream adds one value per example, which Keras
  3 sums: a loss that sums over the batch, which the first step's check names at WARNING);
* ``tf_keras-captcha``: ``captcha`` in ``tf_keras`` (``tf.nn.ctc_loss``).
"""

from __future__ import annotations

import importlib

import numpy as np

PROGRAMS = ("tickets", "tagger", "tf_keras-tickets", "captcha", "tf_keras-captcha")
WORDS, TAGS, DEPARTMENTS = 30, 4, 3


def keras_of(name: str):
    """The Keras a program is written for: ``tf_keras`` for a name so prefixed, else Keras 3."""
    return importlib.import_module("tf_keras" if name.startswith("tf_keras") else "keras")


def build(name: str):
    keras = keras_of(name)
    layers = keras.layers
    keras.utils.set_random_seed(1)
    if name.endswith("captcha"):
        return _captcha(keras)
    if name == "tagger":
        tokens = keras.Input(shape=(5,), name="tokens")
        states = layers.LSTM(8, return_sequences=True)(layers.Embedding(WORDS, 6)(tokens))
        score = layers.Dense(1, name="score")(layers.GlobalAveragePooling1D()(states))
        tags = layers.Dense(TAGS, name="tags")(states)
        model = keras.Model(tokens, [score, tags])
        model.compile(optimizer=keras.optimizers.SGD(0.1, momentum=0.5),
                      loss=[keras.losses.MeanSquaredError(),
                            keras.losses.SparseCategoricalCrossentropy(from_logits=True)],
                      loss_weights=[1.0, 0.5], metrics=[["mae"], ["accuracy"]])
        return model
    title = keras.Input(shape=(None,), name="title")
    body = keras.Input(shape=(None,), name="body")
    tags = keras.Input(shape=(TAGS,), name="tags")
    title_features = layers.LSTM(8)(layers.Embedding(WORDS, 6)(title))
    body_features = layers.LSTM(4)(layers.Embedding(WORDS, 6)(body))
    x = layers.concatenate([title_features, body_features, tags])
    priority = layers.Dense(1, name="priority")(x)
    department = layers.Dense(DEPARTMENTS, name="department")(x)
    losses = {"priority": keras.losses.BinaryCrossentropy(from_logits=True),
              "department": keras.losses.CategoricalCrossentropy(from_logits=True)}
    if name == "tickets":
        model = keras.Model(inputs=[title, body, tags], outputs={"priority": priority, "department": department})
        model.compile(optimizer=keras.optimizers.RMSprop(1e-2), loss=losses,
                      loss_weights={"priority": 1.0, "department": 0.2},
                      metrics={"priority": ["accuracy"], "department": ["accuracy"]})
        return model
    model = keras.Model(inputs=[title, body, tags], outputs=[priority, department])
    model.compile(optimizer=keras.optimizers.RMSprop(1e-2), loss=[losses["priority"], losses["department"]],
                  loss_weights=[1.0, 0.2], metrics=[["accuracy"], ["accuracy"]])
    return model


def data(name: str):
    rng = np.random.RandomState(5)
    if name.endswith("captcha"):  # the inputs alone, in batches of 8; y None
        return _captchas(rng, 29).batch(8), None
    if name == "tagger":
        n = 31
        return rng.randint(0, WORDS, (n, 5)), [rng.rand(n, 1).astype(np.float32), rng.randint(0, TAGS, (n, 5))]
    n = 29
    x = {"title": rng.randint(0, WORDS, (n, 5)), "body": rng.randint(0, WORDS, (n, 7)),
         "tags": rng.randint(0, 2, (n, TAGS)).astype(np.float32)}
    priority = rng.randint(0, 2, (n, 1)).astype(np.float32)
    department = np.eye(DEPARTMENTS, dtype=np.float32)[rng.randint(0, DEPARTMENTS, n)]
    if name == "tickets":
        return x, {"priority": priority, "department": department}
    return [x["title"], x["body"], x["tags"]], [priority, department]


def fit_arguments(name: str, fit: dict) -> dict:
    """What the program's ``fit`` takes beside ``x`` and ``y`` (``fit``: the programs' common arguments)."""
    if name == "tagger":
        rng = np.random.RandomState(6)
        return {**fit, "sample_weight": [rng.rand(31).astype(np.float32), rng.rand(31, 5).astype(np.float32)]}
    if name == "tickets":
        return {**fit, "validation_split": 0.3}
    if name.endswith("captcha"):
        return {"epochs": 2, "validation_data": _captchas(np.random.RandomState(6), 11).batch(8)}
    x, y = data(name)
    return {**fit, "validation_data": ([a[:11] for a in x], [a[:11] for a in y])}


def _captchas(rng, n: int):
    """Images of 16 columns by 8 rows and their labels of 3 characters (1..5; 0 is CTC's blank), as dicts."""
    import tensorflow as tf

    images = rng.rand(n, 16, 8, 1).astype(np.float32)
    labels = rng.randint(1, 6, (n, 3)).astype(np.float32)
    return tf.data.Dataset.from_tensor_slices({"image": images, "label": labels})


def _captcha(keras):
    import tensorflow as tf

    layers = keras.layers

    def ctc_loss(labels, predicted, label_length, predicted_length):
        if keras.__name__ == "keras":
            return keras.ops.ctc_loss(labels, predicted, label_length, predicted_length, mask_index=0)
        return tf.nn.ctc_loss(labels, tf.math.log(predicted + 1e-7), label_length, predicted_length,
                              logits_time_major=False, blank_index=0)

    class CTCLayer(layers.Layer):
        def call(self, y_true, y_pred):
            batch = tf.shape(y_true)[0]
            label_length = tf.fill([batch], tf.shape(y_true)[1])
            predicted_length = tf.fill([batch], tf.shape(y_pred)[1])
            self.add_loss(tf.reduce_mean(ctc_loss(tf.cast(y_true, tf.int32), y_pred, label_length, predicted_length)))
            return y_pred

    image = keras.Input((16, 8, 1), name="image")
    label = keras.Input((None,), name="label")
    x = layers.Conv2D(4, 3, activation="relu", padding="same")(image)
    x = layers.MaxPooling2D((2, 2))(x)  # 8 columns (the time steps) of 4 rows by 4 channels
    x = layers.Dense(8, activation="relu")(layers.Reshape((8, 16))(x))
    x = layers.Bidirectional(layers.LSTM(6, return_sequences=True))(x)
    x = layers.Dense(6, activation="softmax")(x)
    model = keras.Model([image, label], CTCLayer()(label, x))
    model.compile(optimizer=keras.optimizers.Adam())
    return model
