"""Custom training loops as public TensorFlow 2 material writes them, rewritten small (random data in place
of the downloads), each a ``tf.function`` step ``parallel_run`` takes unchanged:

* ``keras-guide-loop``: Keras's guide "Writing a training loop from scratch" (TensorFlow backend): an MLP,
  ``SparseCategoricalCrossentropy(from_logits=True)``, Keras 3 SGD through ``optimizer.apply(grads,
  weights)``, and a ``SparseCategoricalAccuracy`` the step updates itself;
* ``tf-walkthrough``: TensorFlow's tutorial "Custom training: walkthrough" (penguins: 4 features, 3 classes):
  its ``grad`` function with a ``GradientTape``, SGD(0.01) through ``apply_gradients``, and the epoch's loss
  average and accuracy kept by the loop from what the step returns.

``build(name)`` makes a program (seeded); ``eager(name, steps)`` is one device on the union batches: each
step's loss of every part (the replicas' losses), the trained weights and the accuracy counts per part."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

PROGRAMS = ["keras-guide-loop", "tf-walkthrough"]
BATCH = 12  # the union batch: 2 workers or 2 replicas take 6 examples each
SHAPES = {"keras-guide-loop": (16, 10), "tf-walkthrough": (4, 3)}  # features, classes


def batches(name: str, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    features, classes = SHAPES[name]
    rng = np.random.RandomState(11)
    return [(rng.randn(BATCH, features).astype(np.float32), rng.randint(0, classes, BATCH).astype(np.int64))
            for _ in range(steps)]


def build(name: str):
    """``(train_step, model, accuracy)``: the step returns the loss (and, in the walkthrough, the logits);
    ``accuracy`` is the Keras metric the guide's step updates (``None`` in the walkthrough)."""
    import keras

    keras.utils.set_random_seed(4)
    features, classes = SHAPES[name]
    if name == "keras-guide-loop":
        inputs = keras.Input(shape=(features,), name="digits")
        hidden = keras.layers.Dense(32, activation="relu")(inputs)
        hidden = keras.layers.Dense(32, activation="relu")(hidden)
        model = keras.Model(inputs=inputs, outputs=keras.layers.Dense(classes, name="predictions")(hidden))
        optimizer = keras.optimizers.SGD(learning_rate=0.05)
        loss_fn = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
        accuracy = keras.metrics.SparseCategoricalAccuracy()

        @tf.function(input_signature=[tf.TensorSpec([None, features]), tf.TensorSpec([None], tf.int64)])
        def train_step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss_value = loss_fn(y, logits)
            grads = tape.gradient(loss_value, model.trainable_weights)
            optimizer.apply(grads, model.trainable_weights)
            accuracy.update_state(y, logits)
            return loss_value

        return train_step, model, accuracy

    model = keras.Sequential([keras.Input(shape=(features,)), keras.layers.Dense(10, activation=tf.nn.relu),
                              keras.layers.Dense(10, activation=tf.nn.relu), keras.layers.Dense(classes)])
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.SGD(learning_rate=0.01)

    def loss(model, x, y, training):
        return loss_object(y_true=y, y_pred=model(x, training=training))

    def grad(model, inputs, targets):
        with tf.GradientTape() as tape:
            loss_value = loss(model, inputs, targets, training=True)
        return loss_value, tape.gradient(loss_value, model.trainable_variables)

    @tf.function(input_signature=[tf.TensorSpec([None, features]), tf.TensorSpec([None], tf.int64)])
    def train_step(x, y):
        loss_value, grads = grad(model, x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss_value, model(x, training=True)  # the tutorial's accuracy reads the model's logits

    return train_step, model, None


def correct(logits: np.ndarray, y: np.ndarray) -> int:
    return int(np.sum(np.argmax(logits, axis=-1) == y))


def eager(name: str, steps: int, parts: int = 2) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """One device on the union batches: ``(losses [steps, parts], weights, correct [parts])``; a part's loss
    and correct count are those of its examples on the weights the step starts from (the guide's step) or
    ends with (the walkthrough's logits, read after the update)."""
    train_step, model, _ = build(name)
    losses, right = [], np.zeros(parts, np.int64)
    for x, y in batches(name, steps):
        cut = list(zip(np.split(x, parts), np.split(y, parts)))
        if name == "keras-guide-loop":
            before = [model(xp, training=True).numpy() for xp, _ in cut]
        losses.append([float(tf.keras.losses.sparse_categorical_crossentropy(yp, model(xp), from_logits=True)
                                .numpy().mean()) for xp, yp in cut])
        train_step(x, y)
        after = before if name == "keras-guide-loop" else [model(xp, training=True).numpy() for xp, _ in cut]
        right += [correct(logits, yp) for logits, (_, yp) in zip(after, cut)]
    return np.array(losses), [v.numpy() for v in model.trainable_variables], right
