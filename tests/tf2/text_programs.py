"""keras-io's "Text classification from scratch" (examples/nlp/text_classification_from_scratch.py) as its users
train it, small: an Embedding (a sparse gradient), two strided Conv1D, GlobalMaxPooling1D and two Dense, Adam,
``binary_crossentropy`` with ``accuracy``, fit on a ``tf.data`` pipeline built as the example builds it (what
``text_dataset_from_directory`` returns: seeded shuffle, batches, ``prefetch``; then the vectorizing ``map``,
``cache()`` and ``prefetch(10)``) with validation data of the same kind. ``build()`` the model (seeded),
``datasets()`` the training and validation pipelines, ``single_device()`` ``model.fit`` on one device (the
reference ``parallax.fit`` must equal).

A ``cache()`` behind a ``prefetch`` is what made ``parallax.fit`` hang in PS mode: an iterator of such a pipeline
destroyed after one batch (a peek, before the epochs) can leave the cache complete with the batches read so far,
a different number on each worker (timing), so one worker's epoch ended while another waited in the step for its
gradient. Whether it does is a race; that the pipeline's source is read more often than ``model.fit`` reads it
(:data:`READS`: once, the cache serving the later epochs) is not."""

from __future__ import annotations

import numpy as np

CASE = "text-classification"
VOCAB, LENGTH, WIDTH = 64, 40, 8  # keras-io: 20000 tokens, sequences of 500, 128 wide
TRAIN, VALIDATION, BATCH, EPOCHS = 64, 32, 16, 3  # 4 training batches an epoch (fewer than prefetch(10) holds)


def data() -> tuple[tuple[np.ndarray, np.ndarray], tuple[np.ndarray, np.ndarray]]:
    """``(x, y)`` to train on and to validate on: "texts" of raw token ids (the vectorizing map folds them into
    the vocabulary) and binary labels (int32, shape ``(n,)``, as ``text_dataset_from_directory`` gives them),
    1 where the text has more low tokens than high ones."""
    rng = np.random.RandomState(11)
    texts = rng.randint(0, 4 * VOCAB, (TRAIN + VALIDATION, LENGTH)).astype(np.int64)
    labels = ((texts % VOCAB < VOCAB // 2).sum(axis=1) > LENGTH // 2).astype(np.int32)
    return (texts[:TRAIN], labels[:TRAIN]), (texts[TRAIN:], labels[TRAIN:])


#: the batches the training pipeline's source has been asked for (its "files read"), since :func:`datasets`
READS = [0]


def datasets():
    """The training and validation pipelines, as the example builds them from ``text_dataset_from_directory``
    (whose source reads files: here each batch read is counted in :data:`READS`)."""
    import tensorflow as tf

    READS[0] = 0

    def read(texts):
        READS[0] += 1
        return texts

    def source(text, label):
        return tf.ensure_shape(tf.py_function(read, [text], text.dtype), text.shape), label

    def vectorize(text, label):
        return tf.math.floormod(text, VOCAB), label

    def pipeline(x, y, training: bool):
        raw = tf.data.Dataset.from_tensor_slices((x, y))
        if training:  # text_dataset_from_directory(seed=1337): the same order on one device and on every worker
            raw = raw.shuffle(BATCH * 8, seed=1337, reshuffle_each_iteration=False)
        raw = raw.batch(BATCH)
        if training:
            raw = raw.map(source)
        raw = raw.prefetch(tf.data.AUTOTUNE)  # as text_dataset_from_directory returns it
        return raw.map(vectorize).cache().prefetch(buffer_size=10)

    (x, y), (val_x, val_y) = data()
    return pipeline(x, y, True), pipeline(val_x, val_y, False)


def build():
    import keras

    keras.utils.set_random_seed(1337)
    inputs = keras.Input(shape=(None,), dtype="int64")
    x = keras.layers.Embedding(VOCAB, WIDTH)(inputs)
    x = keras.layers.Dropout(0.0)(x)  # the example's 0.5, off: one device and the replicas would draw other masks
    x = keras.layers.Conv1D(WIDTH, 7, padding="valid", activation="relu", strides=3)(x)
    x = keras.layers.Conv1D(WIDTH, 7, padding="valid", activation="relu", strides=3)(x)
    x = keras.layers.GlobalMaxPooling1D()(x)
    x = keras.layers.Dense(WIDTH, activation="relu")(x)
    x = keras.layers.Dropout(0.0)(x)
    predictions = keras.layers.Dense(1, activation="sigmoid", name="predictions")(x)
    model = keras.Model(inputs, predictions)
    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    return model


def batch_counter():
    """A callback that counts the training batches of each epoch (``per_epoch``)."""
    import keras

    class BatchCounter(keras.callbacks.Callback):
        def __init__(self) -> None:
            super().__init__()
            self.per_epoch: list[int] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.per_epoch.append(0)

        def on_train_batch_end(self, batch, logs=None):
            self.per_epoch[-1] += 1

    return BatchCounter()


def single_device() -> tuple[dict, list[np.ndarray], list[int], int]:
    """``model.fit`` on one device, as the example calls it: its History, trained weights, the batches of
    each epoch and the batches its pipeline's source read."""
    model = build()
    train, validation = datasets()
    counter = batch_counter()
    history = model.fit(train, validation_data=validation, epochs=EPOCHS, callbacks=[counter], verbose=0).history
    return history, [v.numpy() for v in model.trainable_variables], counter.per_epoch, READS[0]
