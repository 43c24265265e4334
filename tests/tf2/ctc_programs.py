"""keras-io "OCR model for reading Captchas" (Apache-2.0), rewritten small with random images and labels: part of
tests/tf2/keras_programs.py's programs, trained by ``model.fit`` as written for the reference
``parallax.fit(model, <the same arguments>)`` must equal.

* ``ocr-ctc``: a ``tf.data`` pipeline of dicts (``{"image", "label"}``, a map that scales each image, ``batch``,
  ``prefetch``) with a validation dataset of the same form and ``EarlyStopping``; two ``Conv2D`` + ``MaxPooling2D``
  blocks, a ``Reshape`` into a sequence, a ``Dense``, a ``Bidirectional(LSTM)`` and a softmax over the characters
  and the blank; the example's ``CTCLayer``, which adds each example's CTC loss with ``add_loss`` (one value per
  example, computed by the example's ``ctc_batch_cost`` with ``tf.compat.v1.nn.ctc_loss`` and a ``tf.compat.v1.scan``
  over the labels): Keras 3 sums those over the batch, so the loss is a sum, not a mean (a data-parallel job that
  averages its replicas' losses trains a fraction of it). Compiled with the optimizer alone, as the example is; SGD
  here (the example's Adam hides a gradient's scale), and 29 examples in batches of 8, so each epoch's last batch
  (5) does not split into equal parts.
"""

from __future__ import annotations

import numpy as np

from tests.tf2.loss_programs import keras_of

PROGRAMS = ("ocr-ctc",)
WIDTH, HEIGHT, LABEL, CHARACTERS = 32, 8, 3, 6  # the images' size, the characters a captcha has and may be


def build(name: str):
    keras = keras_of(name)
    layers = keras.layers
    keras.utils.set_random_seed(5)
    image = layers.Input(shape=(WIDTH, HEIGHT, 1), name="image", dtype="float32")
    label = layers.Input(name="label", shape=(None,), dtype="float32")
    x = layers.Conv2D(4, (3, 3), activation="relu", kernel_initializer="he_normal", padding="same", name="Conv1")(image)
    x = layers.MaxPooling2D((2, 2), name="pool1")(x)
    x = layers.Conv2D(4, (3, 3), activation="relu", kernel_initializer="he_normal", padding="same", name="Conv2")(x)
    x = layers.MaxPooling2D((2, 2), name="pool2")(x)
    x = layers.Reshape(target_shape=(WIDTH // 4, (HEIGHT // 4) * 4), name="reshape")(x)
    x = layers.Dense(8, activation="relu", name="dense1")(x)
    x = layers.Bidirectional(layers.LSTM(6, return_sequences=True))(x)
    x = layers.Dense(CHARACTERS + 1, activation="softmax", name="dense2")(x)
    output = _ctc_layer(keras)(name="ctc_loss")(label, x)
    model = keras.models.Model(inputs=[image, label], outputs=output, name="ocr_model_v1")
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    return model


def data(name: str):
    import tensorflow as tf

    rng = np.random.RandomState(9)
    images = rng.randint(0, 256, size=(29, WIDTH, HEIGHT, 1)).astype(np.uint8)
    labels = rng.randint(0, CHARACTERS, size=(29, LABEL)).astype(np.float32)  # the last class: the blank

    def encode(image, label):  # the example's encode_single_sample, without the files: scale, then a dict
        return {"image": tf.image.convert_image_dtype(image, tf.float32), "label": label}

    train = tf.data.Dataset.from_tensor_slices((images, labels)).map(encode).batch(8).prefetch(2)
    return train, None


def fit_arguments(name: str, fit: dict) -> dict:
    """The example's ``fit``: the dataset, a validation dataset, ``EarlyStopping`` on the validation loss."""
    keras = keras_of(name)
    train, _ = data(name)
    return {"epochs": 3, "validation_data": train.take(2),
            "callbacks": [keras.callbacks.EarlyStopping(monitor="val_loss", patience=10, restore_best_weights=True)]}


def _ctc_layer(keras):
    import tensorflow as tf

    ops = keras.ops

    def ctc_label_dense_to_sparse(labels, label_lengths):  # the example's, as TensorFlow's Keras 2 backend had it
        label_shape = tf.shape(labels)
        num_batches_tns = tf.stack([label_shape[0]])
        max_num_labels_tns = tf.stack([label_shape[1]])

        def range_less_than(old_input, current_input):
            return tf.expand_dims(tf.range(tf.shape(old_input)[1]), 0) < tf.fill(max_num_labels_tns, current_input)

        init = tf.cast(tf.fill([1, label_shape[1]], 0), tf.bool)
        dense_mask = tf.compat.v1.scan(range_less_than, label_lengths, initializer=init, parallel_iterations=1)
        dense_mask = dense_mask[:, 0, :]
        label_array = tf.reshape(tf.tile(tf.range(0, label_shape[1]), num_batches_tns), label_shape)
        label_ind = tf.compat.v1.boolean_mask(label_array, dense_mask)
        batch_array = tf.transpose(tf.reshape(tf.tile(tf.range(0, label_shape[0]), max_num_labels_tns),
                                              tf.reverse(label_shape, [0])))
        batch_ind = tf.compat.v1.boolean_mask(batch_array, dense_mask)
        indices = tf.transpose(tf.reshape(tf.concat([batch_ind, label_ind], axis=0), [2, -1]))
        vals_sparse = tf.compat.v1.gather_nd(labels, indices)
        return tf.SparseTensor(tf.cast(indices, tf.int64), vals_sparse, tf.cast(label_shape, tf.int64))

    def ctc_batch_cost(y_true, y_pred, input_length, label_length):
        label_length = tf.cast(tf.squeeze(label_length, axis=-1), tf.int32)
        input_length = tf.cast(tf.squeeze(input_length, axis=-1), tf.int32)
        sparse_labels = tf.cast(ctc_label_dense_to_sparse(y_true, label_length), tf.int32)
        y_pred = tf.math.log(tf.transpose(y_pred, perm=[1, 0, 2]) + keras.backend.epsilon())
        return tf.expand_dims(tf.compat.v1.nn.ctc_loss(inputs=y_pred, labels=sparse_labels,
                                                       sequence_length=input_length), 1)

    class CTCLayer(keras.layers.Layer):
        def __init__(self, name=None):
            super().__init__(name=name)
            self.loss_fn = ctc_batch_cost

        def call(self, y_true, y_pred):
            batch_len = ops.cast(ops.shape(y_true)[0], dtype="int64")
            input_length = ops.cast(ops.shape(y_pred)[1], dtype="int64")
            label_length = ops.cast(ops.shape(y_true)[1], dtype="int64")
            input_length = input_length * ops.ones(shape=(batch_len, 1), dtype="int64")
            label_length = label_length * ops.ones(shape=(batch_len, 1), dtype="int64")
            self.add_loss(self.loss_fn(y_true, y_pred, input_length, label_length))
            return y_pred  # at test time, the computed predictions

    return CTCLayer
