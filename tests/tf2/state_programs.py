"""A TensorFlow 2 step with state that is not trained: batch normalisation's moving statistics, a Keras
metric the step updates, and the optimizer's iteration counter. ``build()`` makes it (seeded);
``data_parallel(parts, steps)`` is the reference: the same step run on one device as data parallelism runs
it, each part of the union batch normalised by its own statistics and writing its own copy of the moving
statistics and of the metric, the parts' gradients averaged into one update."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

BATCH, FEATURES = 6, 3


def batches(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.RandomState(5)
    return [(rng.randn(BATCH, FEATURES).astype(np.float32) * (1 + i), rng.randn(BATCH, 1).astype(np.float32))
            for i in range(steps)]


def build():
    """``(step, model, optimizer, metric)``: a Keras 3 model with batch norm, Adam, and a ``Mean`` of the loss
    that the step updates."""
    import keras

    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.layers.Input((FEATURES,)), keras.layers.Dense(4, use_bias=False),
                              keras.layers.BatchNormalization(momentum=0.5), keras.layers.Activation("relu"),
                              keras.layers.Dense(1)])
    optimizer = keras.optimizers.Adam(0.05)
    metric = keras.metrics.Mean(name="mean_loss")

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.float32), tf.TensorSpec([None, 1], tf.float32)])
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        metric.update_state(loss)
        return loss

    return train_step, model, optimizer, metric


def state(model, optimizer, metric) -> dict[str, np.ndarray]:
    """What the test compares: the trained variables, the moving statistics, the metric and the counter."""
    out = {f"trained/{i}": v.numpy() for i, v in enumerate(model.trainable_variables)}
    out.update({f"moving/{i}": v.numpy() for i, v in enumerate(model.non_trainable_variables)})
    out.update({f"metric/{i}": v.numpy() for i, v in enumerate(metric.variables)})
    out["iterations"] = np.asarray(optimizer.iterations.numpy())
    return out


def data_parallel(parts: int, steps: int) -> tuple[list[list[float]], list[dict[str, np.ndarray]], dict]:
    """Each part's losses per step, the state each part's copy ends with (see the module docstring), and the
    metric's state summed over the parts' copies (what a metric reads under ``tf.distribute``)."""
    _, model, optimizer, metric = build()
    own = [[v.numpy() for v in model.non_trainable_variables + metric.variables]] * parts  # every copy starts alike
    losses = []
    for x, y in batches(steps):
        grads, seen = [], []
        for k, (xp, yp) in enumerate(zip(np.split(x, parts), np.split(y, parts))):
            for v, value in zip(model.non_trainable_variables + metric.variables, own[k]):
                v.assign(value)
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(xp, training=True) - yp))
            grads.append(tape.gradient(loss, model.trainable_variables))
            metric.update_state(loss)
            own[k] = [v.numpy() for v in model.non_trainable_variables + metric.variables]
            seen.append(float(loss))
        optimizer.apply_gradients(zip([tf.add_n(g) / parts for g in zip(*grads)], model.trainable_variables))
        losses.append(seen)
    finals = []
    for k in range(parts):
        for v, value in zip(model.non_trainable_variables + metric.variables, own[k]):
            v.assign(value)
        finals.append(state(model, optimizer, metric))
    summed = {k: sum(f[k] for f in finals) for k in finals[0] if k.startswith("metric/")}
    return losses, finals, summed
