"""Keras programs of the shapes Keras's guides and keras-io teach, rewritten small with random data of the real
layout (Apache-2.0, keras-io and keras-team/keras); part of tests/tf2/keras_programs.py's programs, trained by
``model.fit`` as written for the reference ``parallax.fit(model, <the same arguments>)`` must equal.

* ``vae``: keras-io "Variational AutoEncoder": an encoder of two strided ``Conv2D`` to ``z_mean`` and
  ``z_log_var``, a decoder of ``Conv2DTranspose``, a ``train_step`` of the model's own whose loss sums the
  reconstruction's cross-entropy over the pixels and adds the KL term, three ``Mean`` trackers (``total_loss``
  returned as ``"loss"``), ``fit`` on the images alone (no ``y``). Adapted: the sample is ``z_mean`` (the guide
  draws ``epsilon`` in the step: each replica would draw its own, which the first step's check names);
* ``tf_keras-vae``: the same program as the tf_keras-era guide writes it (trackers kept as attributes and listed
  by a ``metrics`` property, ``apply_gradients``);
* ``own-test-step``: Keras's guide "Customizing what happens in fit()": a ``train_step`` and a ``test_step`` of
  the model's own (a ``Mean`` tracker of each batch's loss, a ``MeanAbsoluteError``), with ``validation_data``
  and a ``LearningRateScheduler`` halving the rate from the second epoch on (the model's own step reads the
  optimizer's rate, which the callback sets: the job must train with it);
* ``class-weights``: ``fit`` on arrays with ``class_weight``, ``validation_split`` and ``weighted_metrics`` beside
  the plain ones; 45 examples: the last training batch (4) and the last validation batch (1) do not split evenly;
* ``weather``: keras-io "Timeseries forecasting for weather prediction": windows of normalised features made by
  ``keras.utils.timeseries_dataset_from_array`` (a sampling rate of 2, unshuffled, as the example), an ``LSTM``
  and a ``Dense``, Adam, MSE, a validation dataset and an ``EarlyStopping`` on ``val_loss`` (upstream's
  ``ModelCheckpoint`` beside it writes files, left out);
* ``normalized``: TensorFlow's "Basic regression" tutorial in Keras 3: a ``Normalization`` layer adapted to the
  features before ``fit``, two ``Dense(16)``, mean absolute error, an MSE metric, ``validation_split`` and a
  ``LearningRateScheduler`` that lowers the rate from the second epoch on (the rate left is compared too);
* ``annealed``: the KL-annealing idiom of VAE posts and keras-io's callbacks guide: a penalty's weight ``beta``,
  a variable no gradient trains, set by a callback ``on_epoch_begin`` (0, 0.5, 1), a warm-up weight ``gamma`` set
  ``on_train_batch_begin``, and a max-norm callback that rescales the first kernel with ``assign`` at each epoch's
  end: the job trains with what the callbacks set, as ``model.fit`` does (every weight compared, ``beta`` too).
"""

from __future__ import annotations

import math

import numpy as np

from tests.tf2.loss_programs import keras_of

PROGRAMS = ("vae", "tf_keras-vae", "own-test-step", "class-weights", "weather", "normalized", "annealed")
IMAGE, LATENT = 8, 2
FEATURES, PAST, RATE = 5, 6, 2  # the weather's features, a window's steps and its sampling rate


def build(name: str):
    keras = keras_of(name)
    layers = keras.layers
    keras.utils.set_random_seed(3)
    if name.endswith("vae"):
        return _vae(keras)
    if name == "own-test-step":
        return _own_test_step(keras)
    if name == "class-weights":
        model = keras.Sequential([keras.Input((6,)), layers.Dense(16, activation="relu"),
                                  layers.Dense(3, activation="softmax")])
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="sparse_categorical_crossentropy",
                      metrics=["accuracy"], weighted_metrics=["accuracy"])
        return model
    if name == "annealed":
        return _annealed(keras)
    if name == "weather":
        inputs = keras.Input((PAST, FEATURES))
        model = keras.Model(inputs, layers.Dense(1)(layers.LSTM(8)(inputs)))
        model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
        return model
    normalizer = layers.Normalization(axis=-1)
    normalizer.adapt(data(name)[0])
    model = keras.Sequential([keras.Input((7,)), normalizer, layers.Dense(16, activation="relu"),
                              layers.Dense(16, activation="relu"), layers.Dense(1)])
    model.compile(optimizer=keras.optimizers.Adam(0.01), loss="mean_absolute_error", metrics=["mse"])
    return model


def data(name: str):
    rng = np.random.RandomState(11)
    if name.endswith("vae"):  # binarised images, fit's x alone
        return (rng.rand(32, IMAGE, IMAGE, 1) > 0.7).astype(np.float32), None
    if name in ("own-test-step", "annealed"):
        x = rng.randn(32, 8).astype(np.float32)
        return x, (x[:, :2].sum(1, keepdims=True) ** 2).astype(np.float32)
    if name == "class-weights":
        x = rng.randn(45, 6).astype(np.float32)
        return x, np.argmax(x[:, :3] + 0.5 * rng.randn(45, 3), axis=1).astype(np.int32)
    if name == "weather":
        return _windows(0, 60), None
    x = (rng.randn(42, 7) * np.array([1, 10, 100, 0.1, 5, 1, 50])).astype(np.float32)
    return x, (x @ rng.randn(7, 1) * 0.05 + rng.randn(42, 1) * 0.1).astype(np.float32)


def fit_arguments(name: str, fit: dict) -> dict:
    """What the program's ``fit`` takes beside ``x`` and ``y`` (``fit``: the programs' common arguments)."""
    keras = keras_of(name)
    if name == "own-test-step":
        rng = np.random.RandomState(12)
        x = rng.randn(16, 8).astype(np.float32)
        return {**fit, "epochs": 3, "validation_data": (x, (x[:, :2].sum(1, keepdims=True) ** 2).astype(np.float32)),
                "callbacks": [keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.5 if epoch else rate)]}
    if name == "class-weights":
        return {**fit, "epochs": 3, "class_weight": {0: 1.0, 1: 3.0, 2: 0.5}, "validation_split": 0.2}
    if name == "weather":
        return {"epochs": 3, "validation_data": _windows(60, 84),
                "callbacks": [keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=0, patience=5)]}
    if name == "annealed":
        return {**fit, "epochs": 3, "callbacks": _annealing(keras)}
    if name == "normalized":
        def scheduler(epoch, rate):
            return rate if epoch < 1 else rate * math.exp(-0.5)

        return {**fit, "epochs": 3, "validation_split": 0.2,
                "callbacks": [keras.callbacks.LearningRateScheduler(scheduler)]}
    return fit


def _windows(start: int, end: int):
    """The weather's windows of rows ``start:end`` (features normalised by the training rows' statistics), each
    labelled with the second feature ``PAST * RATE`` rows on, in unshuffled batches of 8."""
    import keras

    rng = np.random.RandomState(13)
    steps = np.arange(100)[:, None]
    rows = np.sin(steps / (5.0 + np.arange(FEATURES))) + 0.1 * rng.randn(100, FEATURES)
    rows = ((rows - rows[:60].mean(0)) / rows[:60].std(0)).astype(np.float32)
    ahead = PAST * RATE
    return keras.utils.timeseries_dataset_from_array(rows[start:end - ahead], rows[start + ahead:end, 1],
                                                     sequence_length=PAST, sampling_rate=RATE, batch_size=8)


def _vae(keras):
    import tensorflow as tf

    layers, ops = keras.layers, tf

    class VAE(keras.Model):
        def __init__(self, encoder, decoder, **kwargs):
            super().__init__(**kwargs)
            self.encoder, self.decoder = encoder, decoder
            self.total_loss_tracker = keras.metrics.Mean(name="total_loss")
            self.reconstruction_loss_tracker = keras.metrics.Mean(name="reconstruction_loss")
            self.kl_loss_tracker = keras.metrics.Mean(name="kl_loss")

        @property
        def metrics(self):
            return [self.total_loss_tracker, self.reconstruction_loss_tracker, self.kl_loss_tracker]

        def train_step(self, images):
            with tf.GradientTape() as tape:
                z_mean, z_log_var, z = self.encoder(images)
                reconstruction = self.decoder(z)
                reconstruction_loss = ops.reduce_mean(ops.reduce_sum(
                    keras.losses.binary_crossentropy(images, reconstruction), axis=(1, 2)))
                kl_loss = -0.5 * (1 + z_log_var - ops.square(z_mean) - ops.exp(z_log_var))
                kl_loss = ops.reduce_mean(ops.reduce_sum(kl_loss, axis=1))
                total_loss = reconstruction_loss + kl_loss
            grads = tape.gradient(total_loss, self.trainable_weights)
            self.optimizer.apply_gradients(zip(grads, self.trainable_weights))
            self.total_loss_tracker.update_state(total_loss)
            self.reconstruction_loss_tracker.update_state(reconstruction_loss)
            self.kl_loss_tracker.update_state(kl_loss)
            return {"loss": self.total_loss_tracker.result(),
                    "reconstruction_loss": self.reconstruction_loss_tracker.result(),
                    "kl_loss": self.kl_loss_tracker.result()}

    images = keras.Input((IMAGE, IMAGE, 1))
    x = layers.Conv2D(4, 3, activation="relu", strides=2, padding="same")(images)
    x = layers.Conv2D(8, 3, activation="relu", strides=2, padding="same")(x)
    x = layers.Dense(8, activation="relu")(layers.Flatten()(x))
    z_mean, z_log_var = layers.Dense(LATENT)(x), layers.Dense(LATENT)(x)
    encoder = keras.Model(images, [z_mean, z_log_var, z_mean], name="encoder")
    latent = keras.Input((LATENT,))
    x = layers.Reshape((IMAGE // 4, IMAGE // 4, 8))(layers.Dense(IMAGE * IMAGE // 2, activation="relu")(latent))
    x = layers.Conv2DTranspose(8, 3, activation="relu", strides=2, padding="same")(x)
    x = layers.Conv2DTranspose(4, 3, activation="relu", strides=2, padding="same")(x)
    decoder = keras.Model(latent, layers.Conv2DTranspose(1, 3, activation="sigmoid", padding="same")(x),
                          name="decoder")
    vae = VAE(encoder, decoder)
    vae.compile(optimizer=keras.optimizers.Adam())
    return vae


def _own_test_step(keras):
    import tensorflow as tf

    class CustomModel(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")
            self.mae_metric = keras.metrics.MeanAbsoluteError(name="mae")

        @property
        def metrics(self):
            return [self.loss_tracker, self.mae_metric]

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = keras.ops.mean(keras.losses.mean_squared_error(y, y_pred))
            grads = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(grads, self.trainable_variables))
            return self._report(loss, y, y_pred)

        def test_step(self, data):
            x, y = data
            y_pred = self(x, training=False)
            return self._report(keras.ops.mean(keras.losses.mean_squared_error(y, y_pred)), y, y_pred)

        def _report(self, loss, y, y_pred):
            self.loss_tracker.update_state(loss)
            self.mae_metric.update_state(y, y_pred)
            return {"loss": self.loss_tracker.result(), "mae": self.mae_metric.result()}

    inputs = keras.Input((8,))
    model = CustomModel(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="tanh")(inputs)))
    model.compile(optimizer=keras.optimizers.Adam(1e-2))
    return model


def _annealed(keras):
    class Penalty(keras.layers.Layer):
        """A VAE's KL term in small: ``beta * gamma * mean(h**2)`` added to the loss, its weights set by callbacks."""

        def build(self, _):
            self.beta = self.add_weight(shape=(), initializer="zeros", trainable=False, name="beta")
            self.gamma = self.add_weight(shape=(), initializer="zeros", trainable=False, name="gamma")

        def call(self, h):
            self.add_loss(self.beta * self.gamma * keras.ops.mean(keras.ops.square(h)))
            return h

    inputs = keras.Input((8,))
    hidden = Penalty(name="penalty")(keras.layers.Dense(8, activation="tanh", name="first")(inputs))
    model = keras.Model(inputs, keras.layers.Dense(1)(hidden))
    model.compile(optimizer=keras.optimizers.Adam(1e-2), loss="mse")
    return model


def _annealing(keras) -> list:
    class Anneal(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.model.get_layer("penalty").beta.assign(min(1.0, 0.5 * epoch))

        def on_train_batch_begin(self, batch, logs=None):
            self.model.get_layer("penalty").gamma.assign(min(1.0, (batch + 1) / 3))

    class MaxNorm(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            kernel = self.model.get_layer("first").kernel
            norms = np.linalg.norm(kernel.numpy(), axis=0, keepdims=True)
            kernel.assign(kernel.numpy() * np.minimum(1.0, 0.8 / norms))

    return [Anneal(), MaxNorm()]
