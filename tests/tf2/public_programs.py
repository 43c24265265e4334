"""Custom training loops as public TensorFlow 2 material writes them, rewritten small (random data in place
of the downloads), each a ``tf.function`` step ``parallel_run`` takes unchanged (as they write it, without an
``input_signature``: traced at its first call):

* ``keras-guide-loop``: Keras's guide "Writing a training loop from scratch" (TensorFlow backend): an MLP,
  ``SparseCategoricalCrossentropy(from_logits=True)``, Keras 3 SGD through ``optimizer.apply(grads,
  weights)``, and a ``SparseCategoricalAccuracy`` the step updates itself;
* ``tf-walkthrough``: TensorFlow's tutorial "Custom training: walkthrough" (penguins: 4 features, 3 classes):
  its ``grad`` function with a ``GradientTape``, SGD(0.01) through ``apply_gradients``, and the epoch's loss
  average and accuracy kept by the loop from what the step returns;
* ``tf-quickstart``: TensorFlow's "advanced quickstart": a subclassed model (Conv2D, Flatten, two Dense) built
  inside the step's first trace, ``@tf.function def train_step(images, labels)`` that returns nothing and
  updates its ``train_loss`` / ``train_accuracy`` metrics, Adam;
* ``gan``: TensorFlow's DCGAN tutorial's step, small: a generator (``BatchNormalization``, ``LeakyReLU``) and a
  discriminator (``LeakyReLU``, ``Dropout(0.3)``, called on the real and on the generated images), two tapes, two
  Adam optimizers, a dict of the two losses returned, and its noise drawn inside the step at the global batch's
  fixed size, ``tf.random.normal([BATCH_SIZE, noise_dim])``, as the tutorial draws it (every replica draws one
  device's noise, and its rows of one device's dropout masks: parallax/tf2/draws.py);
* ``tf-cvae``: TensorFlow's tutorial "Convolutional Variational Autoencoder", small: an encoder (``Conv2D``,
  ``Flatten``, ``Dense``) and a decoder (``Dense``, ``Reshape``, ``Conv2DTranspose``) in a subclassed model, its
  ``log_normal_pdf`` and ``compute_loss`` (a mean over the batch of each example's sums), and its
  ``@tf.function def train_step(model, x, optimizer)``, whose model and optimizer are arguments (traced as the
  Python values they are), returning nothing, Adam; its ``reparameterize`` draws ``tf.random.normal(shape=
  mean.shape)``, a static shape (the step is traced with its first call's shapes), and each replica takes its rows
  of one device's draw.

``build(name)`` makes a program (seeded); ``eager(name, steps)`` is one device on the union batches: each
step's loss of every part (the replicas' losses), the trained weights and the accuracy counts per part."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

PROGRAMS = ["keras-guide-loop", "tf-walkthrough", "tf-quickstart", "gan", "tf-cvae"]
#: the programs whose step returns no loss per replica (nothing, or a dict): compared by their weights
WITHOUT_LOSS = ("tf-quickstart", "gan", "tf-cvae")
BATCH = 12  # the union batch: 2 workers or 2 replicas take 6 examples each
SHAPES = {"keras-guide-loop": (16, 10), "tf-walkthrough": (4, 3), "tf-quickstart": ((6, 6, 1), 10),
          "gan": (8, 4), "tf-cvae": ((8, 8, 1), 2)}  # features, classes (GAN: width, noise; VAE: image, latent)
_OPTIMIZERS: dict = {}  # the VAE tutorial's optimizer, the step's argument beside its model (by the model's id)


def batches(name: str, steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    features, classes = SHAPES[name]
    rng = np.random.RandomState(11)
    if name == "tf-quickstart":
        return [(rng.rand(BATCH, *features).astype(np.float32), rng.randint(0, classes, BATCH).astype(np.int64))
                for _ in range(steps)]
    if name == "tf-cvae":  # binarised images, as the tutorial's MNIST (no labels)
        return [((rng.rand(BATCH, *features) > 0.5).astype(np.float32), np.zeros(BATCH, np.int64))
                for _ in range(steps)]
    if name == "gan":  # (images, noise: what the held-out predictions of the two models take)
        return [(rng.randn(BATCH, features).astype(np.float32), rng.randn(BATCH, classes).astype(np.float32))
                for _ in range(steps)]
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

        @tf.function  # as the guide writes it: no input_signature, traced at the first call
        def train_step(x, y):
            with tf.GradientTape() as tape:
                logits = model(x, training=True)
                loss_value = loss_fn(y, logits)
            grads = tape.gradient(loss_value, model.trainable_weights)
            optimizer.apply(grads, model.trainable_weights)
            accuracy.update_state(y, logits)
            return loss_value

        return train_step, model, accuracy

    if name == "tf-quickstart":
        return _quickstart(keras, classes)
    if name == "gan":
        return _gan(keras, features, classes)
    if name == "tf-cvae":
        return _cvae(features, classes)
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

    @tf.function
    def train_step(x, y):
        loss_value, grads = grad(model, x, y)
        optimizer.apply_gradients(zip(grads, model.trainable_variables))
        return loss_value, model(x, training=True)  # the tutorial's accuracy reads the model's logits

    return train_step, model, None


def _quickstart(keras, classes: int):
    class MyModel(keras.Model):
        def __init__(self):
            super().__init__()
            self.conv1 = keras.layers.Conv2D(4, 3, activation="relu")
            self.flatten = keras.layers.Flatten()
            self.d1 = keras.layers.Dense(16, activation="relu")
            self.d2 = keras.layers.Dense(classes)

        def call(self, x):
            return self.d2(self.d1(self.flatten(self.conv1(x))))

    model = MyModel()  # built inside the step's first trace
    loss_object = keras.losses.SparseCategoricalCrossentropy(from_logits=True)
    optimizer = keras.optimizers.Adam()
    train_loss = keras.metrics.Mean(name="train_loss")
    train_accuracy = keras.metrics.SparseCategoricalAccuracy(name="train_accuracy")

    @tf.function
    def train_step(images, labels):
        with tf.GradientTape() as tape:
            predictions = model(images, training=True)
            loss = loss_object(labels, predictions)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))
        train_loss(loss)
        train_accuracy(labels, predictions)

    return train_step, model, None


def _gan(keras, width: int, noise_width: int):
    layers = keras.layers
    generator = keras.Sequential([keras.Input((noise_width,)), layers.Dense(8, use_bias=False),
                                  layers.BatchNormalization(), layers.LeakyReLU(),
                                  layers.Dense(width, activation="tanh")])
    discriminator = keras.Sequential([keras.Input((width,)), layers.Dense(8), layers.LeakyReLU(),
                                      layers.Dropout(0.3), layers.Dense(1)])
    cross_entropy = keras.losses.BinaryCrossentropy(from_logits=True)
    generator_optimizer, discriminator_optimizer = keras.optimizers.Adam(1e-3), keras.optimizers.Adam(1e-3)

    @tf.function
    def train_step(images):
        noise = tf.random.normal([BATCH, noise_width])
        with tf.GradientTape() as gen_tape, tf.GradientTape() as disc_tape:
            generated_images = generator(noise, training=True)
            real_output = discriminator(images, training=True)
            fake_output = discriminator(generated_images, training=True)
            gen_loss = cross_entropy(tf.ones_like(fake_output), fake_output)
            disc_loss = cross_entropy(tf.ones_like(real_output), real_output) + \
                cross_entropy(tf.zeros_like(fake_output), fake_output)
        gradients_of_generator = gen_tape.gradient(gen_loss, generator.trainable_variables)
        gradients_of_discriminator = disc_tape.gradient(disc_loss, discriminator.trainable_variables)
        generator_optimizer.apply_gradients(zip(gradients_of_generator, generator.trainable_variables))
        discriminator_optimizer.apply_gradients(zip(gradients_of_discriminator, discriminator.trainable_variables))
        return {"gen_loss": gen_loss, "disc_loss": disc_loss}

    both = keras.Sequential([generator, discriminator])  # one object whose weights are both models'
    return train_step, both, None


def _cvae(shape: tuple, latent_dim: int):
    class CVAE(tf.keras.Model):
        def __init__(self, latent_dim):
            super().__init__()
            self.latent_dim = latent_dim
            self.encoder = tf.keras.Sequential([
                tf.keras.layers.InputLayer(shape=shape),
                tf.keras.layers.Conv2D(filters=4, kernel_size=3, strides=(2, 2), activation="relu"),
                tf.keras.layers.Flatten(), tf.keras.layers.Dense(latent_dim + latent_dim)])
            self.decoder = tf.keras.Sequential([
                tf.keras.layers.InputLayer(shape=(latent_dim,)),
                tf.keras.layers.Dense(units=4 * 4 * 4, activation=tf.nn.relu),
                tf.keras.layers.Reshape(target_shape=(4, 4, 4)),
                tf.keras.layers.Conv2DTranspose(filters=1, kernel_size=3, strides=2, padding="same")])

        def encode(self, x):
            mean, logvar = tf.split(self.encoder(x), num_or_size_splits=2, axis=1)
            return mean, logvar

        def reparameterize(self, mean, logvar):
            eps = tf.random.normal(shape=mean.shape)
            return eps * tf.exp(logvar * .5) + mean

        def decode(self, z):
            return self.decoder(z)

    def log_normal_pdf(sample, mean, logvar, raxis=1):
        log2pi = tf.math.log(2. * np.pi)
        return tf.reduce_sum(-.5 * ((sample - mean) ** 2. * tf.exp(-logvar) + logvar + log2pi), axis=raxis)

    def compute_loss(model, x):
        mean, logvar = model.encode(x)
        z = model.reparameterize(mean, logvar)
        x_logit = model.decode(z)
        cross_ent = tf.nn.sigmoid_cross_entropy_with_logits(logits=x_logit, labels=x)
        logpx_z = -tf.reduce_sum(cross_ent, axis=[1, 2, 3])
        logpz = log_normal_pdf(z, 0., 0.)
        logqz_x = log_normal_pdf(z, mean, logvar)
        return -tf.reduce_mean(logpx_z + logpz - logqz_x)

    @tf.function
    def train_step(model, x, optimizer):
        with tf.GradientTape() as tape:
            loss = compute_loss(model, x)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    model = CVAE(latent_dim)
    _OPTIMIZERS[id(model)] = tf.keras.optimizers.Adam(1e-3)
    return train_step, model, None


def arguments(name: str, model, x, y) -> tuple:
    """What the program's loop passes its step: the batch (each tensor one per replica, or the whole batch), the
    VAE tutorial's model and optimizer around its images, the GAN's images alone."""
    if name == "gan":  # the images alone: the step draws its noise
        return (x,)
    return (model, x, _OPTIMIZERS[id(model)]) if name == "tf-cvae" else (x, y)


def correct(logits: np.ndarray, y: np.ndarray) -> int:
    return int(np.sum(np.argmax(logits, axis=-1) == y))


def eager(name: str, steps: int, parts: int = 2) -> tuple[np.ndarray, list[np.ndarray], np.ndarray]:
    """One device on the union batches: ``(losses [steps, parts], weights, correct [parts])``; a part's loss
    and correct count are those of its examples on the weights the step starts from (the guide's step) or
    ends with (the walkthrough's logits, read after the update)."""
    train_step, model, _ = build(name)
    losses, right = [], np.zeros(parts, np.int64)
    if name in WITHOUT_LOSS:
        for x, y in batches(name, steps):
            train_step(*arguments(name, model, x, y))
        return None, [v.numpy() for v in model.trainable_variables], right
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
