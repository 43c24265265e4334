"""A TensorFlow 2 program that keeps its state in a ``tf.train.Checkpoint`` (its model and optimizer) and
resumes from it: ``build(case)`` makes the model, the optimizer, the step and the checkpoint (seeded: the
same initial values every time); ``state(...)`` reads every variable the checkpoint holds, by its path in it."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from tests.tf2.programs import _keras_model

CASES = ["keras3-adam", "tfkeras-adam"]


def build(case: str):
    """``(step, model, optimizer, checkpoint)`` of ``case``: a Keras 3 or tf_keras model with an embedding,
    trained with Adam by a ``tf.function`` step that returns the loss."""
    if case == "keras3-adam":
        import keras
    else:
        import tf_keras as keras

    keras.utils.set_random_seed(1)
    model = _keras_model(keras) if case == "keras3-adam" else _keras_model(keras, input_length=3)
    optimizer = keras.optimizers.Adam(0.05)

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int32), tf.TensorSpec([None, 1], tf.float32)])
    def train_step(ids, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(ids, training=True) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    return train_step, model, optimizer, tf.train.Checkpoint(model=model, optimizer=optimizer)


def state(path: str) -> dict[str, np.ndarray]:
    """Every variable a checkpoint holds (the model's, the optimizer's slots and counters), by its key."""
    reader = tf.train.load_checkpoint(path)
    return {key: reader.get_tensor(key) for key in reader.get_variable_to_shape_map()
            if key.endswith(".ATTRIBUTES/VARIABLE_VALUE") and "save_counter" not in key}
