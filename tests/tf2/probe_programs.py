"""Keras programs of the shapes a second probe of public programs tried (Keras's optimizer and callback guides,
keras-io's sequence examples), rewritten small with random data of the real layout; part of
tests/tf2/keras_programs.py's programs, trained by ``model.fit`` as written for the reference
``parallax.fit(model, <the same arguments>)`` must equal.

* ``cosine-clipnorm``: ``AdamW`` on a ``CosineDecay`` schedule with a linear warm-up (``warmup_target``,
  ``warmup_steps``), its gradients clipped by their global norm (``global_clipnorm``): a norm over every
  variable's gradient, which must be the union batch's, and a rate read from the step counter;
* ``decay-clipvalue``: ``SGD`` with momentum on an ``ExponentialDecay`` staircase, each gradient clipped by
  value (``clipvalue``), a ``TerminateOnNaN`` beside it (a batch hook that may stop training);
* ``pydataset-gru``: a ``keras.utils.PyDataset`` of the model's batches (its ``__getitem__`` and ``__len__``, as
  Keras's guide writes one), shuffled by ``fit`` (batch order), a ``Bidirectional(GRU)`` and a
  ``TimeDistributed(Dense)`` with a loss per time step;
* ``builtin-metrics``: a binary classifier compiled with Keras's built-in metrics whose state is not a plain mean:
  ``AUC`` (bucketed by thresholds), ``Precision``, ``Recall`` and ``F1Score``, with ``validation_split``;
* ``ner``: keras-io "Named Entity Recognition using Transformers" in small: sentences of other lengths padded with
  0, an ``Embedding(mask_zero=True)`` whose mask reaches the output through an LSTM of every time step, a tag per
  token (``SparseCategoricalCrossentropy`` over the unmasked tokens: Keras divides by the batch's count of
  them), an accuracy metric; ``tf_keras-ner`` the same in tf_keras;
* ``ignore-class``: a tagger whose padding tags are ``-1``, left out of the loss by ``ignore_class=-1`` (no mask on
  the model), as the Keras segmentation examples leave out a class;
* ``translator``: keras-io "English-to-Spanish translation with a sequence-to-sequence Transformer": token and
  position embeddings whose ``compute_mask`` marks the padding, an encoder block attending under that mask, a
  decoder block with causal self-attention and attention over the encoder's outputs, a softmax over the target
  vocabulary at every position, RMSprop, ``SparseCategoricalCrossentropy(ignore_class=0)``, accuracy, sentence
  pairs of other lengths padded with 0. Adapted: no ``Dropout`` (each replica would draw its own).
"""

from __future__ import annotations

import numpy as np

from tests.tf2.loss_programs import keras_of

PROGRAMS = ("cosine-clipnorm", "decay-clipvalue", "pydataset-gru", "builtin-metrics", "ner", "tf_keras-ner",
            "ignore-class", "translator")
STEPS, FEATURES = 5, 3  # pydataset-gru's time steps and features a step
WORDS, TAGS, LENGTH = 20, 4, 7  # ner's and ignore-class's vocabulary, tags and padded length


def build(name: str):
    keras = keras_of(name)
    layers = keras.layers
    keras.utils.set_random_seed(4)
    if name == "pydataset-gru":
        inputs = keras.Input((STEPS, FEATURES))
        hidden = layers.Bidirectional(layers.GRU(4, return_sequences=True))(inputs)
        model = keras.Model(inputs, layers.TimeDistributed(layers.Dense(1))(hidden))
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
        return model
    if name == "builtin-metrics":
        model = keras.Sequential([keras.Input((6,)), layers.Dense(8, activation="relu"),
                                  layers.Dense(1, activation="sigmoid")])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="binary_crossentropy",
                      metrics=[keras.metrics.AUC(name="auc"), keras.metrics.Precision(name="precision"),
                               keras.metrics.Recall(name="recall"),
                               keras.metrics.F1Score(average="micro", threshold=0.5, name="f1")])
        return model
    if name == "translator":
        return _translator(keras)
    if name.endswith(("ner", "ignore-class")):
        inputs = keras.Input((LENGTH,), dtype="int32")
        hidden = layers.Embedding(WORDS, 8, mask_zero=name.endswith("ner"))(inputs)
        model = keras.Model(inputs, layers.Dense(TAGS)(layers.LSTM(8, return_sequences=True)(hidden)))
        ignored = {} if name.endswith("ner") else {"ignore_class": -1}
        model.compile(optimizer=keras.optimizers.Adam(1e-2), metrics=["accuracy"],
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True, **ignored))
        return model
    model = keras.Sequential([keras.Input((6,)), layers.Dense(8, activation="tanh"), layers.Dense(1)])
    if name == "cosine-clipnorm":
        schedule = keras.optimizers.schedules.CosineDecay(0.0, decay_steps=8, warmup_target=0.05, warmup_steps=4)
        optimizer = keras.optimizers.AdamW(schedule, weight_decay=0.01, global_clipnorm=1.0)
    else:
        schedule = keras.optimizers.schedules.ExponentialDecay(0.05, decay_steps=3, decay_rate=0.5, staircase=True)
        optimizer = keras.optimizers.SGD(schedule, momentum=0.9, clipvalue=0.2)
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    return model


def data(name: str):
    rng = np.random.RandomState(21)
    if name == "pydataset-gru":
        return _batches(keras_of(name), rng.randn(32, STEPS, FEATURES).astype(np.float32)), None
    if name == "translator":  # (source, target in) -> target out, each sentence of 2 to LENGTH tokens, 0-padded
        lengths = rng.randint(2, LENGTH + 1, size=(2, 40))
        pad = [np.arange(LENGTH + 1)[None, :] < n[:, None] for n in lengths]
        source = np.where(pad[0], rng.randint(1, WORDS, size=(40, LENGTH + 1)), 0)[:, :LENGTH]
        target = np.where(pad[1], rng.randint(1, WORDS, size=(40, LENGTH + 1)), 0)
        return (source.astype(np.int32), target[:, :-1].astype(np.int32)), target[:, 1:].astype(np.int32)
    if name.endswith(("ner", "ignore-class")):  # sentences of 1 to LENGTH tokens, padded with 0 (their tags too, or -1)
        lengths = rng.randint(1, LENGTH + 1, size=40)
        kept = np.arange(LENGTH)[None, :] < lengths[:, None]
        words = np.where(kept, rng.randint(1, WORDS, size=(40, LENGTH)), 0).astype(np.int32)
        tags = np.where(kept, words % TAGS, 0 if name.endswith("ner") else -1).astype(np.int32)
        return words, tags
    x = rng.randn(40, 6).astype(np.float32)
    if name == "builtin-metrics":
        return x, (x[:, :3].sum(1, keepdims=True) + 0.5 * rng.randn(40, 1) > 0).astype(np.float32)
    return x, (np.tanh(x[:, :2]).sum(1, keepdims=True) * 3).astype(np.float32)


def fit_arguments(name: str, fit: dict) -> dict:
    """What the program's ``fit`` takes beside ``x`` and ``y`` (``fit``: the programs' common arguments)."""
    keras = keras_of(name)
    if name == "pydataset-gru":
        return {"epochs": 3}
    if name in ("builtin-metrics", "ner"):
        return {**fit, "epochs": 3, "validation_split": 0.2}
    if name == "decay-clipvalue":
        return {**fit, "epochs": 3, "callbacks": [keras.callbacks.TerminateOnNaN()]}
    return {**fit, "epochs": 3}


def _batches(keras, x: np.ndarray):
    """The guide's ``PyDataset``: batches of 8 sequences, each step's target the running sum of its features."""

    class Batches(keras.utils.PyDataset):
        def __init__(self, x, batch_size=8, **kwargs):
            super().__init__(**kwargs)
            self.x, self.batch_size = x, batch_size

        def __len__(self):
            return len(self.x) // self.batch_size

        def __getitem__(self, index):
            x = self.x[index * self.batch_size:(index + 1) * self.batch_size]
            return x, np.cumsum(x.sum(-1, keepdims=True), axis=1) * 0.3

    return Batches(x)


def _translator(keras):
    layers, ops = keras.layers, keras.ops

    class PositionalEmbedding(layers.Layer):
        def __init__(self, length, vocabulary, dim, **kwargs):
            super().__init__(**kwargs)
            self.tokens = layers.Embedding(vocabulary, dim)
            self.positions = layers.Embedding(length, dim)

        def call(self, ids):
            return self.tokens(ids) + self.positions(ops.arange(0, ops.shape(ids)[-1]))

        def compute_mask(self, ids, mask=None):
            return ops.not_equal(ids, 0)

    class Encoder(layers.Layer):
        def __init__(self, dim, hidden, heads, **kwargs):
            super().__init__(**kwargs)
            self.attention = layers.MultiHeadAttention(heads, dim)
            self.feed = keras.Sequential([layers.Dense(hidden, activation="relu"), layers.Dense(dim)])
            self.first, self.second = layers.LayerNormalization(), layers.LayerNormalization()
            self.supports_masking = True

        def call(self, x, mask=None):
            padding = None if mask is None else ops.cast(mask[:, None, :], "int32")
            attended = self.first(x + self.attention(x, x, attention_mask=padding))
            return self.second(attended + self.feed(attended))

    class Decoder(layers.Layer):
        def __init__(self, dim, hidden, heads, **kwargs):
            super().__init__(**kwargs)
            self.itself = layers.MultiHeadAttention(heads, dim)
            self.across = layers.MultiHeadAttention(heads, dim)
            self.feed = keras.Sequential([layers.Dense(hidden, activation="relu"), layers.Dense(dim)])
            self.norms = [layers.LayerNormalization() for _ in range(3)]
            self.supports_masking = True

        def call(self, x, encoded, mask=None):
            mine = self.norms[0](x + self.itself(x, x, use_causal_mask=True))
            across = self.norms[1](mine + self.across(mine, encoded, encoded))
            return self.norms[2](across + self.feed(across))

    source = keras.Input((LENGTH,), dtype="int32", name="source")
    target = keras.Input((LENGTH,), dtype="int32", name="target")
    encoded = Encoder(8, 16, 2)(PositionalEmbedding(LENGTH, WORDS, 8)(source))
    decoded = Decoder(8, 16, 2)(PositionalEmbedding(LENGTH, WORDS, 8)(target), encoded)
    model = keras.Model([source, target], layers.Dense(WORDS, activation="softmax")(decoded))
    model.compile(optimizer=keras.optimizers.RMSprop(1e-2), metrics=["accuracy"],
                  loss=keras.losses.SparseCategoricalCrossentropy(ignore_class=0))
    return model
