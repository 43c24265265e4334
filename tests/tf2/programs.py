"""TensorFlow 2 training steps as their users write them: a ``tf.function`` with an input signature, a
``GradientTape``, a model and an optimizer of each kind. ``build(case)`` makes a fresh one (seeded: the
same initial values every time); ``batches(case, steps)`` its union batches."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

BATCH = 6  # the union batch: 2 or 3 workers, or 2 replicas, take equal parts
VOCAB, WIDTH = 10, 4

#: case -> (model family, optimizer)
CASES = {
    "module-v1-adam": ("module", "v1-adam"),
    "keras3-adam": ("keras3", "adam"),
    "keras3-sgd": ("keras3", "sgd"),
    "tfkeras-legacy-adam": ("tfkeras", "legacy-adam"),
    "tfkeras-adam": ("tfkeras", "adam"),
}


def batches(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.RandomState(3)
    return [(rng.randint(0, VOCAB, (BATCH, 3)).astype(np.int32), rng.randn(BATCH, 1).astype(np.float32))
            for _ in range(steps)]


class _Module(tf.Module):
    """A tf.Module model: an embedding and a dense layer written with tf.Variables."""

    def __init__(self) -> None:
        super().__init__(name="net")
        rng = np.random.RandomState(0)
        self.emb = tf.Variable(rng.randn(VOCAB, WIDTH).astype(np.float32), name="emb")
        self.w = tf.Variable(rng.randn(3 * WIDTH, 1).astype(np.float32) * 0.3, name="w")
        self.b = tf.Variable(np.zeros([1], np.float32), name="b")

    def __call__(self, ids: tf.Tensor, training: bool = True) -> tf.Tensor:
        rows = tf.reshape(tf.nn.embedding_lookup(self.emb, ids), [-1, 3 * WIDTH])
        return tf.matmul(rows, self.w) + self.b


def _keras_model(keras, **embedding):
    layers = [keras.layers.Embedding(VOCAB, WIDTH, **embedding), keras.layers.Flatten(),
              keras.layers.Dense(4, activation="relu"), keras.layers.Dense(1)]
    model = keras.Sequential(layers)
    model.build((None, 3))
    return model


def build(case: str):
    """A fresh model, optimizer and step of ``case``: ``(step, model)``; the step returns the loss."""
    family, optimizer = CASES[case]
    if family == "module":
        model = _Module()
        opt = tf.compat.v1.train.AdamOptimizer(0.05)
        variables = lambda: [model.emb, model.w, model.b]  # noqa: E731
    elif family == "keras3":
        import keras

        keras.utils.set_random_seed(1)
        model = _keras_model(keras)
        opt = {"adam": keras.optimizers.Adam(0.05), "sgd": keras.optimizers.SGD(0.1, momentum=0.9)}[optimizer]
        variables = lambda: model.trainable_variables  # noqa: E731
    else:
        import tf_keras

        tf_keras.utils.set_random_seed(1)
        model = _keras_model(tf_keras, input_length=3)
        opt = tf_keras.optimizers.legacy.Adam(0.05) if optimizer == "legacy-adam" else tf_keras.optimizers.Adam(0.05)
        variables = lambda: model.trainable_variables  # noqa: E731

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int32), tf.TensorSpec([None, 1], tf.float32)])
    def train_step(ids, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(ids, training=True) - y))
        grads = tape.gradient(loss, variables())
        opt.apply_gradients(zip(grads, variables()))
        return loss

    return train_step, variables


def eager(case: str, steps: int) -> tuple[list[float], list[np.ndarray]]:
    """One device: the losses of ``steps`` steps on the union batches, and the trained variables."""
    step, variables = build(case)
    losses = [float(step(ids, y)) for ids, y in batches(steps)]
    return losses, [v.numpy() for v in variables()]
