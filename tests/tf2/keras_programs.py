"""Public Keras 3 programs of other shapes, rewritten small (random data of the real layout in place of the
downloads; Apache-2.0, keras-io), each trained by ``model.fit`` exactly as it is written (shuffle on, seeded
by ``keras.utils.set_random_seed``): the reference ``parallax.fit(model, <the same arguments>)`` must equal.

* ``transformer``: keras-io "Text classification with Transformer": ``TokenAndPositionEmbedding`` (positions
  looked up with ``ops.arange``), a ``TransformerBlock`` (``MultiHeadAttention``, ``LayerNormalization``, a
  feed-forward pair), ``GlobalAveragePooling1D``, Adam, ``sparse_categorical_crossentropy``, accuracy;
* ``seq2seq``: keras-io "Character-level recurrent sequence-to-sequence model": an LSTM encoder whose states
  start an LSTM decoder, one-hot targets per time step (``categorical_crossentropy`` of each step), RMSprop;
* ``recommender``: keras-io "Collaborative Filtering for Movie Recommendations": a user table and a movie table
  (each with a bias table), their dot product per example, Adam, a dict input (upstream's
  ``ops.tensordot(user, movie, 2)`` sums over the whole batch, which no data-parallel training makes equal to
  one device: here ``ops.sum(user * movie, axis=-1)``, what the example means);
* ``masked``: an ``Embedding(mask_zero=True)`` feeding an LSTM (padded sequences, the mask carried by Keras),
  Adam, binary cross-entropy;
* ``structured``: keras-io "Structured data classification with FeatureSpace", without FeatureSpace: a dict of
  a string feature (``StringLookup``, and ``Hashing``), an integer one (``IntegerLookup``), a number, a free
  text (``TextVectorization`` adapted to it) and a cross of the two categories (``HashedCrossing``, as FeatureSpace
  crosses them), each lookup inside the model and followed by an ``Embedding``, Adam, binary cross-entropy;
* ``custom-step``: Keras's guide "Customizing what happens in fit()": a model whose ``train_step`` computes the
  loss, applies the optimizer and updates its metrics itself;
* ``gan``: the same guide's GAN: a ``train_step`` that trains a discriminator and a generator with two
  optimizers, compiled with neither loss nor metrics, its two loss trackers its metrics. Adapted: the latent
  vectors come with the data (the guide draws them, and the noise it adds to the labels, inside the step, which
  no data-parallel training makes equal to one device), and both gradients are computed before either update,
  as TensorFlow's DCGAN tutorial does (the guide's generator differentiates through the discriminator it has just
  updated, which Parallax refuses: tests/unit/analysis/test_update_order.py).

* ``cnn``: keras-io "Image classification from scratch": ``Rescaling``, a strided ``Conv2D``, blocks of
  ``SeparableConv2D`` + ``BatchNormalization`` with a strided residual ``Conv2D``, ``GlobalAveragePooling2D``,
  one logit, Adam, ``BinaryCrossentropy(from_logits=True)``, binary accuracy; its batch norms as written, trained
  with ``Config(sync_batch_norm=True)`` (:data:`CONFIGS`): the statistics of the global batch. Adapted: small,
  without the ``Dropout`` before the logit (random draws per replica), and the convolutions before a batch norm
  without a bias (``use_bias=False``, as ResNets write them): the batch norm subtracts the mean, so such a bias's
  gradient is zero but for float rounding, which Adam turns into steps of its full learning rate, in another
  direction on every device and every cut of the batch;
* ``timeseries``: keras-io "Timeseries classification from scratch": three ``Conv1D`` +
  ``BatchNormalization`` + ReLU blocks, ``GlobalAveragePooling1D``, a softmax, its batch norms asking for
  synchronised statistics themselves (``synchronized=True``); SGD with momentum (a gradient of the wrong scale
  shows), ``sparse_categorical_crossentropy``.

* ``bert``: a keras-hub ``BertTextClassifier`` built from a config (``BertBackbone`` of 2 layers, no weights
  downloaded, dropout 0: each replica would draw its own masks), fit on a dict of token ids, segment ids and a
  padding mask, Adam, ``SparseCategoricalCrossentropy(from_logits=True)``. keras-hub's task models override
  ``fit`` (arrays into an unshuffled dataset), which ``parallax.fit`` does not run: the program passes
  ``shuffle=False`` (:data:`FITS`), as docs/tf2_programs.md says to.

* ``distiller``: keras-io "Knowledge Distillation": a ``Distiller`` model whose ``compute_loss`` (written before
  Keras 3.3: no ``training`` argument) mixes the student's loss with the KL divergence from a frozen teacher's
  softened predictions and takes no sample weights; 29 examples, so each epoch's last batch does not split
  evenly (the padding must not count);
* ``regularized``: a layer with an L2 kernel regularizer and an L1 activity regularizer, plain SGD (a wrong
  scale shows), 29 examples (the activity loss of a padded batch's padding must not count);
* ``ema``: SGD with momentum and ``use_ema=True`` (``model.fit`` ends by writing the moving averages into the
  weights), and a ``ReduceLROnPlateau`` that lowers the rate at the last epoch's end (compared too: it stays);
* ``shared-split``: keras-io's Siamese network's data: one seeded ``Dataset.shuffle`` (reshuffled each
  iteration) split by ``take`` into the training data and by ``skip`` into ``validation_data``, so the orders
  of both depend on the sequence in which ``model.fit`` iterates them; 3 epochs;
* ``renamed-logs``: the Keras guide's VAE's way with logs: a ``train_step`` that keeps a tracker named
  ``total_loss`` and returns it as ``"loss"``, with the batch's own loss beside it, so that ``model.fit``'s
  History holds the last step's logs, and an ``EarlyStopping`` on ``"loss"`` that stops after 2 of 3 epochs.

* ``tickets``, ``tagger``, ``tf_keras-tickets``: models of several outputs (tests/tf2/loss_programs.py);
* ``vae``, ``own-test-step``, ``weather`` and others of the guides' shapes (tests/tf2/guide_programs.py);
* learning-rate schedules with clipping, a ``PyDataset``, built-in metrics (tests/tf2/probe_programs.py);
* ``ocr-ctc``: keras-io's captcha OCR, whose CTC loss a layer adds per example (tests/tf2/ctc_programs.py);
* ``mnist-convnet``, ``augmented``: dropout and augmentation layers, as written (tests/tf2/random_programs.py);
* ``vectorized-text``: keras-io's text classification, its texts vectorized by a map of whole batches
  (tests/tf2/vectorized_programs.py).

``build(name)`` makes the compiled model (seeded); ``data(name)`` its ``(x, y)``; ``FIT`` the fit arguments;
``CONFIGS`` what a program adds to its ``parallax.Config``; ``fit_arguments(name)`` what its ``fit`` takes;
``weights(name, model)`` the weights compared (every weight, the moving statistics too, where the model
normalises by batch statistics).
"""

from __future__ import annotations

import functools

import numpy as np

from tests.tf2 import ctc_programs, guide_programs, loss_programs, probe_programs, random_programs, vectorized_programs

PARTS = {n: part for part in (loss_programs, guide_programs, probe_programs, ctc_programs, random_programs,
                              vectorized_programs) for n in part.PROGRAMS}
PROGRAMS = ("transformer", "seq2seq", "recommender", "masked", "structured", "custom-step", "gan", "cnn",
            "timeseries", "bert", "distiller", "regularized", "ema", "shared-split", "renamed-logs", *PARTS)
CONFIGS = {"cnn": {"sync_batch_norm": True}}
FITS = {"bert": {"shuffle": False}}
UNEVEN = ("distiller", "regularized")  # 29 examples: the last batch of 5 does not split into equal parts
NORMALISED = ("cnn", "timeseries", "annealed")  # compared with every weight (moving statistics, set ones)
FIT = {"batch_size": 8, "epochs": 2}
EXAMPLES = 32
MAXLEN, VOCAB = 6, 20
NOTES = ("chest", "pain", "at", "rest", "after", "exercise", "none", "mild", "severe")  # "structured"'s free text


def data(name: str):
    if name in PARTS:
        return PARTS[name].data(name)
    rng = np.random.RandomState(7)
    if name == "transformer":
        return rng.randint(0, VOCAB, (EXAMPLES, MAXLEN)).astype(np.int32), rng.randint(0, 2, EXAMPLES)
    if name == "seq2seq":
        one_hot = np.eye(5, dtype=np.float32)
        encoder, decoder = one_hot[rng.randint(0, 5, (EXAMPLES, 4))], one_hot[rng.randint(0, 5, (EXAMPLES, 3))]
        return [encoder, decoder], one_hot[rng.randint(0, 5, (EXAMPLES, 3))]
    if name == "recommender":
        return ({"user": rng.randint(0, 9, EXAMPLES).astype(np.int32),
                 "movie": rng.randint(0, 11, EXAMPLES).astype(np.int32)},
                rng.uniform(0, 1, EXAMPLES).astype(np.float32))
    if name == "structured":
        return ({"thal": rng.choice(["fixed", "normal", "reversible", "unknown"], EXAMPLES).astype(object),
                 "cp": rng.choice([0, 1, 2, 3, 9], EXAMPLES).astype(np.int64),
                 "age": rng.uniform(30, 70, (EXAMPLES, 1)).astype(np.float32),
                 "notes": np.array([" ".join(rng.choice(NOTES, rng.randint(1, 5))) for _ in range(EXAMPLES)],
                                   dtype=object)},
                rng.randint(0, 2, (EXAMPLES, 1)).astype(np.float32))
    if name == "custom-step":
        return rng.randn(EXAMPLES, 4).astype(np.float32), rng.randn(EXAMPLES, 1).astype(np.float32)
    if name == "cnn":  # 8x8 RGB images of 0..255, two classes
        return rng.randint(0, 256, (EXAMPLES, 8, 8, 3)).astype(np.float32), rng.randint(0, 2, (EXAMPLES, 1))
    if name == "timeseries":  # univariate series of 12 steps, two classes
        return rng.randn(EXAMPLES, 12, 1).astype(np.float32) * 2 + 1, rng.randint(0, 2, EXAMPLES)
    if name == "bert":  # token ids of sequences of 4..12 tokens, padded, and their masks
        lengths = rng.randint(4, 13, EXAMPLES)
        mask = np.arange(12)[None, :] < lengths[:, None]
        ids = np.where(mask, rng.randint(1, 50, (EXAMPLES, 12)), 0).astype(np.int32)
        return ({"token_ids": ids, "segment_ids": np.zeros_like(ids), "padding_mask": mask.astype(np.int32)},
                rng.randint(0, 2, EXAMPLES).astype(np.int32))
    if name in UNEVEN:
        return rng.randn(29, 4).astype(np.float32), rng.randint(0, 3, 29)
    if name in ("ema", "renamed-logs"):
        return rng.randn(EXAMPLES, 4).astype(np.float32), rng.randn(EXAMPLES, 1).astype(np.float32)
    if name == "shared-split":
        return _shared_split()[0], None
    if name == "gan":  # real images and latent vectors, as fit's x and y (the step takes both as its data)
        return rng.uniform(-1, 1, (EXAMPLES, 6)).astype(np.float32), rng.randn(EXAMPLES, 3).astype(np.float32)
    lengths = rng.randint(1, MAXLEN + 1, EXAMPLES)
    ids = rng.randint(1, VOCAB, (EXAMPLES, MAXLEN)) * (np.arange(MAXLEN)[None, :] < lengths[:, None])
    return ids.astype(np.int32), rng.randint(0, 2, (EXAMPLES, 1)).astype(np.float32)


def build(name: str):
    if name in PARTS:
        return PARTS[name].build(name)
    import keras
    from keras import layers, ops

    keras.utils.set_random_seed(1)
    if name == "transformer":
        class TransformerBlock(layers.Layer):
            def __init__(self, embed_dim, num_heads, ff_dim):
                super().__init__()
                self.att = layers.MultiHeadAttention(num_heads=num_heads, key_dim=embed_dim)
                self.ffn = keras.Sequential([layers.Dense(ff_dim, activation="relu"), layers.Dense(embed_dim)])
                self.layernorm1 = layers.LayerNormalization(epsilon=1e-6)
                self.layernorm2 = layers.LayerNormalization(epsilon=1e-6)

            def call(self, inputs):
                out1 = self.layernorm1(inputs + self.att(inputs, inputs))
                return self.layernorm2(out1 + self.ffn(out1))

        class TokenAndPositionEmbedding(layers.Layer):
            def __init__(self, maxlen, vocab_size, embed_dim):
                super().__init__()
                self.token_emb = layers.Embedding(input_dim=vocab_size, output_dim=embed_dim)
                self.pos_emb = layers.Embedding(input_dim=maxlen, output_dim=embed_dim)

            def call(self, x):
                maxlen = ops.shape(x)[-1]
                positions = self.pos_emb(ops.arange(start=0, stop=maxlen, step=1))
                return self.token_emb(x) + positions

        inputs = layers.Input(shape=(MAXLEN,))
        x = TokenAndPositionEmbedding(MAXLEN, VOCAB, 8)(inputs)
        x = TransformerBlock(8, 2, 8)(x)
        x = layers.GlobalAveragePooling1D()(x)
        x = layers.Dense(8, activation="relu")(x)
        model = keras.Model(inputs=inputs, outputs=layers.Dense(2, activation="softmax")(x))
        model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
        return model
    if name == "seq2seq":
        encoder_inputs = keras.Input(shape=(None, 5))
        _, state_h, state_c = layers.LSTM(8, return_state=True)(encoder_inputs)
        decoder_inputs = keras.Input(shape=(None, 5))
        decoder_outputs = layers.LSTM(8, return_sequences=True)(decoder_inputs, initial_state=[state_h, state_c])
        model = keras.Model([encoder_inputs, decoder_inputs], layers.Dense(5, activation="softmax")(decoder_outputs))
        model.compile(optimizer="rmsprop", loss="categorical_crossentropy", metrics=["accuracy"])
        return model
    if name == "recommender":
        class RecommenderNet(keras.Model):
            def __init__(self, num_users, num_movies, embedding_size):
                super().__init__()
                self.user_embedding = layers.Embedding(num_users, embedding_size, embeddings_initializer="he_normal",
                                                       embeddings_regularizer=keras.regularizers.l2(1e-6))
                self.user_bias = layers.Embedding(num_users, 1)
                self.movie_embedding = layers.Embedding(num_movies, embedding_size,
                                                        embeddings_initializer="he_normal",
                                                        embeddings_regularizer=keras.regularizers.l2(1e-6))
                self.movie_bias = layers.Embedding(num_movies, 1)

            def call(self, inputs):
                user_vector = self.user_embedding(inputs["user"])
                movie_vector = self.movie_embedding(inputs["movie"])
                dot_user_movie = ops.sum(user_vector * movie_vector, axis=-1, keepdims=True)  # per example
                x = dot_user_movie + self.user_bias(inputs["user"]) + self.movie_bias(inputs["movie"])
                return ops.sigmoid(ops.squeeze(x, -1))

        model = RecommenderNet(9, 11, 4)
        model.compile(loss=keras.losses.BinaryCrossentropy(), optimizer=keras.optimizers.Adam(learning_rate=1e-3))
        return model
    if name == "structured":
        thal = keras.Input((), dtype="string", name="thal")
        cp = keras.Input((), dtype="int64", name="cp")
        age = keras.Input((1,), name="age")
        notes = keras.Input((), dtype="string", name="notes")
        thal_ids = layers.StringLookup(vocabulary=["fixed", "normal", "reversible"])(thal)
        cp_ids = layers.IntegerLookup(vocabulary=[0, 1, 2, 3])(cp)
        words = layers.TextVectorization(max_tokens=8, output_sequence_length=4)  # a vocabulary adapted to the data
        words.adapt(data("structured")[0]["notes"])
        hashed = layers.Hashing(num_bins=5)(thal)
        crossed = layers.HashedCrossing(num_bins=7)((thal, cp))  # the cross FeatureSpace makes
        features = ops.concatenate([layers.Embedding(4, 3)(thal_ids), layers.Embedding(5, 3)(cp_ids),
                                    layers.Normalization(mean=50.0, variance=100.0)(age),
                                    layers.GlobalAveragePooling1D()(layers.Embedding(8, 2)(words(notes))),
                                    layers.Embedding(5, 2)(hashed), layers.Embedding(7, 2)(crossed)], axis=-1)
        x = layers.Dense(8, activation="relu")(features)
        model = keras.Model({"thal": thal, "cp": cp, "age": age, "notes": notes},
                            layers.Dense(1, activation="sigmoid")(x))
        model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
        return model
    if name == "cnn":
        return _image_classifier(keras)
    if name == "bert":
        import keras_hub

        backbone = keras_hub.models.BertBackbone(vocabulary_size=50, num_layers=2, num_heads=2, hidden_dim=8,
                                                 intermediate_dim=16, max_sequence_length=12, dropout=0.0)
        model = keras_hub.models.BertTextClassifier(backbone, num_classes=2, preprocessor=None, dropout=0.0)
        model.compile(optimizer=keras.optimizers.Adam(1e-3),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model
    if name == "timeseries":
        inputs = keras.Input((12, 1))
        x = inputs
        for _ in range(3):
            x = layers.Conv1D(filters=4, kernel_size=3, padding="same")(x)
            x = layers.BatchNormalization(synchronized=True)(x)
            x = layers.ReLU()(x)
        x = layers.GlobalAveragePooling1D()(x)
        model = keras.Model(inputs, layers.Dense(2, activation="softmax")(x))
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9), loss="sparse_categorical_crossentropy",
                      metrics=["sparse_categorical_accuracy"])
        return model
    if name == "custom-step":
        return _custom_step(keras)
    if name == "renamed-logs":
        return _renamed_logs(keras)
    if name == "gan":
        return _gan(keras)
    if name == "distiller":
        return _distiller(keras)
    if name == "regularized":
        model = keras.Sequential([layers.Input((4,)), layers.Dense(8, activation="relu",
                                                                   kernel_regularizer=keras.regularizers.L2(1e-2),
                                                                   activity_regularizer=keras.regularizers.L1(1e-2)),
                                  layers.Dense(3)])
        model.compile(optimizer=keras.optimizers.SGD(0.1),
                      loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
        return model
    if name == "shared-split":
        model = keras.Sequential([layers.Input((4,)), layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        return model
    if name == "ema":
        model = keras.Sequential([layers.Input((4,)), layers.Dense(8, activation="relu"), layers.Dense(1)])
        model.compile(optimizer=keras.optimizers.SGD(0.05, momentum=0.9, use_ema=True), loss="mse")
        return model
    model = keras.Sequential([layers.Input((MAXLEN,), dtype="int32"), layers.Embedding(VOCAB, 8, mask_zero=True),
                              layers.LSTM(8), layers.Dense(1, activation="sigmoid")])
    model.compile(optimizer="adam", loss="binary_crossentropy", metrics=["accuracy"])
    return model


def _image_classifier(keras):
    from keras import layers

    inputs = keras.Input((8, 8, 3))
    x = layers.Rescaling(1.0 / 255)(inputs)
    x = layers.Conv2D(4, 3, strides=2, padding="same", use_bias=False)(x)
    x = layers.BatchNormalization()(x)
    x = layers.Activation("relu")(x)
    previous_block_activation = x
    for size in (8, 16):
        x = layers.Activation("relu")(x)
        x = layers.SeparableConv2D(size, 3, padding="same", use_bias=False)(x)
        x = layers.BatchNormalization()(x)
        x = layers.MaxPooling2D(3, strides=2, padding="same")(x)
        residual = layers.Conv2D(size, 1, strides=2, padding="same")(previous_block_activation)
        x = layers.add([x, residual])
        previous_block_activation = x
    x = layers.GlobalAveragePooling2D()(x)
    model = keras.Model(inputs, layers.Dense(1, activation=None)(x))
    model.compile(optimizer=keras.optimizers.Adam(3e-4), loss=keras.losses.BinaryCrossentropy(from_logits=True),
                  metrics=[keras.metrics.BinaryAccuracy(name="acc")])
    return model


def fit_arguments(name: str) -> dict:
    if name in PARTS:
        return PARTS[name].fit_arguments(name, FIT)
    if name == "ema":  # lowers the rate at every epoch's end from the second on (no loss falls by 10)
        import keras

        return {**FIT, "callbacks": [keras.callbacks.ReduceLROnPlateau("loss", factor=0.5, patience=0, min_delta=10)]}
    if name == "shared-split":
        return {"epochs": 3, "validation_data": _shared_split()[1]}
    if name == "renamed-logs":  # stops when the loss has not fallen by 10: after the second epoch
        import keras

        return {**FIT, "epochs": 3, "callbacks": [keras.callbacks.EarlyStopping("loss", patience=0, min_delta=10)]}
    return {**FIT, **FITS.get(name, {})}


@functools.cache
def _shared_split():
    """Training and validation data taken from one reshuffling dataset (made once a process)."""
    import tensorflow as tf

    rng = np.random.RandomState(0)
    x, y = rng.rand(48, 4).astype(np.float32), rng.rand(48, 1).astype(np.float32)
    shuffled = tf.data.Dataset.from_tensor_slices((x, y)).shuffle(48, seed=7)
    return shuffled.take(32).batch(8), shuffled.skip(32).batch(8)


def weights(name: str, model) -> list:
    """The weights compared: every one where the model has moving statistics, else the trainable ones (and the
    learning rate the callbacks left)."""
    if name in ("ema", "normalized"):
        return [v.numpy() for v in model.trainable_variables] + [np.asarray(model.optimizer.learning_rate)]
    return [v.numpy() for v in (model.weights if name in NORMALISED else model.trainable_variables)]


def _distiller(keras):
    from keras import layers, ops

    class Distiller(keras.Model):  # keras-io's, as written for Keras 3 (its compute_loss without ``training``)
        def __init__(self, student, teacher):
            super().__init__()
            self.teacher, self.student = teacher, student

        def compile(self, optimizer, metrics, student_loss_fn, distillation_loss_fn, alpha=0.1, temperature=3):
            super().compile(optimizer=optimizer, metrics=metrics)
            self.student_loss_fn, self.distillation_loss_fn = student_loss_fn, distillation_loss_fn
            self.alpha, self.temperature = alpha, temperature

        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, allow_empty=False):
            teacher_pred = self.teacher(x, training=False)
            student_loss = self.student_loss_fn(y, y_pred)
            distillation_loss = self.distillation_loss_fn(
                ops.softmax(teacher_pred / self.temperature, axis=1),
                ops.softmax(y_pred / self.temperature, axis=1)) * self.temperature ** 2
            return self.alpha * student_loss + (1 - self.alpha) * distillation_loss

        def call(self, x):
            return self.student(x)

    teacher = keras.Sequential([layers.Input((4,)), layers.Dense(16, activation="relu"), layers.Dense(3)])
    student = keras.Sequential([layers.Input((4,)), layers.Dense(6, activation="relu"), layers.Dense(3)])
    teacher.trainable = False
    distiller = Distiller(student, teacher)
    distiller.compile(optimizer=keras.optimizers.Adam(0.01), metrics=[keras.metrics.SparseCategoricalAccuracy()],
                      student_loss_fn=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                      distillation_loss_fn=keras.losses.KLDivergence(), alpha=0.1, temperature=10)
    return distiller


def _custom_step(keras):
    import tensorflow as tf

    class CustomModel(keras.Model):
        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compute_loss(y=y, y_pred=y_pred)
            trainable_vars = self.trainable_variables
            gradients = tape.gradient(loss, trainable_vars)
            self.optimizer.apply(gradients, trainable_vars)
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    inputs = keras.Input(shape=(4,))
    model = CustomModel(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="relu")(inputs)))
    model.compile(optimizer="adam", loss="mse", metrics=["mae"])
    return model


def _renamed_logs(keras):
    import tensorflow as tf

    class Renamed(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.total = keras.metrics.Mean(name="total_loss")

        @property
        def metrics(self):
            return [self.total]

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = keras.ops.mean((self(x, training=True) - y) ** 2)
            self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
            self.total.update_state(loss)
            return {"loss": self.total.result(), "batch_loss": loss}

    inputs = keras.Input(shape=(4,))
    model = Renamed(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="relu")(inputs)))
    model.compile(optimizer=keras.optimizers.SGD(0.05))
    return model


def _gan(keras):
    import tensorflow as tf
    from keras import layers, ops

    class GAN(keras.Model):
        def __init__(self, discriminator, generator):
            super().__init__()
            self.discriminator = discriminator
            self.generator = generator
            self.d_loss_tracker = keras.metrics.Mean(name="d_loss")
            self.g_loss_tracker = keras.metrics.Mean(name="g_loss")

        def compile(self, d_optimizer, g_optimizer, loss_fn):
            super().compile()
            self.d_optimizer, self.g_optimizer, self.loss_fn = d_optimizer, g_optimizer, loss_fn

        @property
        def metrics(self):
            return [self.d_loss_tracker, self.g_loss_tracker]

        def train_step(self, data):
            real_images, random_latent_vectors = data
            batch_size = ops.shape(real_images)[0]
            generated_images = self.generator(random_latent_vectors)
            combined_images = ops.concatenate([generated_images, real_images], axis=0)
            labels = ops.concatenate([ops.ones((batch_size, 1)), ops.zeros((batch_size, 1))], axis=0)
            with tf.GradientTape() as tape:
                d_loss = self.loss_fn(labels, self.discriminator(combined_images))
            d_grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            misleading_labels = ops.zeros((batch_size, 1))
            with tf.GradientTape() as tape:
                g_loss = self.loss_fn(misleading_labels, self.discriminator(self.generator(random_latent_vectors)))
            g_grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.d_optimizer.apply_gradients(zip(d_grads, self.discriminator.trainable_weights))
            self.g_optimizer.apply_gradients(zip(g_grads, self.generator.trainable_weights))
            self.d_loss_tracker.update_state(d_loss)
            self.g_loss_tracker.update_state(g_loss)
            return {"d_loss": self.d_loss_tracker.result(), "g_loss": self.g_loss_tracker.result()}

    discriminator = keras.Sequential([keras.Input((6,)), layers.Dense(8), layers.LeakyReLU(negative_slope=0.2),
                                      layers.Dense(1)])
    generator = keras.Sequential([keras.Input((3,)), layers.Dense(8), layers.LeakyReLU(negative_slope=0.2),
                                  layers.Dense(6, activation="tanh")])
    gan = GAN(discriminator, generator)
    gan.compile(d_optimizer=keras.optimizers.Adam(3e-4), g_optimizer=keras.optimizers.Adam(3e-4),
                loss_fn=keras.losses.BinaryCrossentropy(from_logits=True))
    return gan


def single_device(name: str) -> tuple[dict, list]:
    """``model.fit`` as the program calls it: its History and trained weights."""
    history, trained, _ = single_device_state(name)
    return history, trained


@functools.cache
def single_device_state(name: str) -> tuple[dict, list, list]:
    """``model.fit`` as the program calls it: its History, trained weights and optimizer variables."""
    model = build(name)
    x, y = data(name)
    history = model.fit(x, y, verbose=0, **fit_arguments(name)).history
    return history, weights(name, model), optimizer_variables(model)


def optimizer_variables(model) -> list:
    """The values of the compiled optimizer's variables (its step count, slots, moving averages), in its order;
    none where the model compiled no single optimizer (a GAN's two)."""
    optimizer = getattr(model, "optimizer", None)
    return [np.asarray(v) for v in optimizer.variables] if optimizer is not None else []
