"""keras-io "Text classification from scratch" (Apache-2.0) with its vectorizing as written: part of
tests/tf2/keras_programs.py's programs, trained by ``model.fit`` as written for the reference
``parallax.fit(model, <the same arguments>)`` must equal.

* ``vectorized-text``: raw strings in the shape ``text_dataset_from_directory`` returns them (a seeded shuffle,
  batches, ``prefetch``), then the example's ``vectorize_text`` map of whole batches (a ``TextVectorization``
  adapted to the training texts, ``output_sequence_length`` fixed, the text expanded to a column first),
  ``cache()`` and ``prefetch(10)``; validation data of the same kind. An Embedding, a strided ``Conv1D``,
  ``GlobalMaxPooling1D``, a sigmoid, Adam, binary cross-entropy and accuracy. The map works row by row, so each
  worker vectorizes only its block of each batch (parallax/tf2/input_split.py); 30 training texts in batches of
  8, so each epoch's last batch (6) is cut 3 and 3, and 14 validation texts (the last batch of 6 likewise).
"""

from __future__ import annotations

import functools

import numpy as np

PROGRAMS = ("vectorized-text",)
WORDS = ("good", "bad", "great", "awful", "fine", "dull", "plot", "acting", "the", "a", "film", "very")
VOCAB, LENGTH = 16, 10  # the vectorizer's tokens (padding and out-of-vocabulary among them), ids a text


def _texts(rng: np.random.RandomState, n: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` reviews of 2 to 14 words (longer than ``LENGTH``: cut; shorter: padded), 1 where "good" or "great"
    outnumber "bad" and "awful"."""
    texts, labels = [], []
    for _ in range(n):
        words = list(rng.choice(WORDS, rng.randint(2, 15)))
        texts.append(" ".join(w.upper() if rng.rand() < 0.2 else w for w in words) + "!")
        labels.append(int(sum(w in ("good", "great") for w in words) > sum(w in ("bad", "awful") for w in words)))
    return np.array(texts, dtype=object), np.array(labels, dtype=np.int32)


@functools.cache
def _raw():
    rng = np.random.RandomState(13)
    return _texts(rng, 30), _texts(rng, 14)


def data(name: str):
    """The training pipeline (fit's ``x``; its ``y`` ``None``)."""
    return _pipelines()[0], None


def _pipelines():
    """The training and validation pipelines, as the example builds them: each call a new vectorizer adapted to
    the training texts, and new pipelines."""
    import keras
    import tensorflow as tf

    (texts, labels), (val_texts, val_labels) = _raw()
    vectorize_layer = keras.layers.TextVectorization(max_tokens=VOCAB, output_mode="int",
                                                     output_sequence_length=LENGTH)
    vectorize_layer.adapt(texts)

    def vectorize_text(text, label):
        text = tf.expand_dims(text, -1)
        return vectorize_layer(text), label

    def pipeline(x, y, shuffle: bool):
        raw = tf.data.Dataset.from_tensor_slices((x.astype(str), y))
        if shuffle:  # text_dataset_from_directory(seed=1337)
            raw = raw.shuffle(len(x), seed=1337)
        raw = raw.batch(8).prefetch(tf.data.AUTOTUNE)
        return raw.map(vectorize_text).cache().prefetch(buffer_size=10)

    return pipeline(texts, labels, True), pipeline(val_texts, val_labels, False)


def build(name: str):
    import keras

    keras.utils.set_random_seed(1337)
    inputs = keras.Input(shape=(None,), dtype="int64")
    x = keras.layers.Embedding(VOCAB, 8)(inputs)
    x = keras.layers.Conv1D(8, 3, padding="valid", activation="relu", strides=2)(x)
    x = keras.layers.GlobalMaxPooling1D()(x)
    x = keras.layers.Dense(8, activation="relu")(x)
    predictions = keras.layers.Dense(1, activation="sigmoid", name="predictions")(x)
    model = keras.Model(inputs, predictions)
    model.compile(loss="binary_crossentropy", optimizer="adam", metrics=["accuracy"])
    return model


def fit_arguments(name: str, fit: dict) -> dict:
    return {"epochs": 2, "validation_data": _pipelines()[1]}
