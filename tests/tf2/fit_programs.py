"""A compiled Keras model as its users train it with ``model.fit``, and the same training on one device
(the reference ``parallax.fit`` must equal): ``build()`` a fresh model (seeded; Keras 3, or tf_keras with its
legacy or new Adam), ``data()`` its examples, ``held_out()`` the examples ``parallax.evaluate`` and
``parallax.predict`` take after training."""

from __future__ import annotations

import numpy as np

EXAMPLES, BATCH, EPOCHS = 48, 12, 3
# parallax.evaluate / predict after fit: 11 examples in batches of 5 (5, 5, 1: uneven parts, and an empty one)
HELD_OUT, EVAL_BATCH = 11, 5
# case: the Keras that builds the model ("keras", "tf_keras-legacy", "tf_keras-new"); how the data comes is
# the case's name: arrays in order, shuffled, a dataset; "weighted": with sample weights and validation_split
CASES = {"ordered": "keras", "shuffled": "keras", "dataset": "keras", "tf_keras-legacy": "tf_keras-legacy",
         "tf_keras-new": "tf_keras-new", "weighted": "keras", "tf_keras-weighted": "tf_keras-new",
         "ragged": "keras", "ragged-dataset": "keras", "tf_keras-dataset": "tf_keras-new",
         "tf_keras-ragged": "tf_keras-new",
         "scheduled": "keras", "tf_keras-scheduled": "tf_keras-legacy", "mixed-float16": "keras-mixed",
         "early-stopping": "keras", "tf_keras-early-stopping": "tf_keras-new", "positions": "keras-positions",
         "unknown-dataset": "keras", "summed-ragged": "keras-summed", "tf_keras-summed-ragged": "tf_keras-summed",
         "executions": "keras-executions", "tf_keras-executions": "tf_keras-executions"}
# cases that fit as a user calls model.fit, shuffled by Keras (build() seeds it)
SHUFFLED = ("shuffled", "positions")
# the "summed" cases' models: compiled with a loss that sums over the batch (reduction="sum"), trained by SGD (whose
# steps show a gradient's scale, which Adam's hide)
SUMMED = ("keras-summed", "tf_keras-summed")
# the "executions" cases' models: compiled with steps_per_execution=3, so that each epoch's 4 batches are an execution
# of 3 and one of 1 (tf_keras's data handler gave parallax.fit one batch an execution until 2026-12-07)
EXECUTIONS = ("keras-executions", "tf_keras-executions")
# the "ragged" cases' batch: batches of 9 and a last of 3, none of which splits evenly over 2 replicas
RAGGED = 9
# the "ragged-dataset" case's examples: 3 batches of BATCH and a last of 1
RAGGED_DATASET = 37


def batch_size(case: str) -> int:
    return RAGGED if "ragged" in case else BATCH


def callbacks(case: str) -> list:
    """The "scheduled" cases' callbacks: the learning rate set between epochs (halved each), as
    ``LearningRateScheduler`` and ``ReduceLROnPlateau`` set it; the "early-stopping" cases': an ``EarlyStopping``
    that sees no improvement of ``val_loss`` after the first epoch (``min_delta`` too large), so training stops
    after the second of three epochs (on every worker, which all see the same summed metrics), and a callback that
    stops it within that epoch, after its second batch (as ``TerminateOnNaN`` does: ``model.fit`` trains no more
    batches)."""
    if "scheduled" not in case and "early-stopping" not in case:
        return []
    import importlib

    keras = importlib.import_module("keras" if CASES[case] == "keras" else "tf_keras")
    if "early-stopping" in case:
        return [keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=1e9, patience=1), _stop_within(keras)]
    return [keras.callbacks.LearningRateScheduler(lambda epoch, rate: 0.05 * 0.5 ** epoch)]


def _stop_within(keras):
    class StopWithinTheSecondEpoch(keras.callbacks.Callback):
        """Stops training after the second batch of the second epoch; keeps every batch's logs (``seen``)."""

        def __init__(self):
            super().__init__()
            self.seen: list[dict] = []

        def on_epoch_begin(self, epoch, logs=None):
            self.epoch = epoch

        def on_train_batch_end(self, batch, logs=None):
            self.seen.append({k: float(v) for k, v in (logs or {}).items()})
            if self.epoch == 1 and batch == 1:
                self.model.stop_training = True

    return StopWithinTheSecondEpoch()


SPLIT = 0.25  # the weighted cases' validation_split: 36 examples to train on, 12 to validate


def weights():
    return np.random.RandomState(5).uniform(0.1, 2.0, EXAMPLES).astype(np.float32)


def data():
    rng = np.random.RandomState(3)
    x = rng.randint(0, 10, (EXAMPLES, 3)).astype(np.int32)
    y = rng.randn(EXAMPLES, 1).astype(np.float32)
    return x, y, (rng.randint(0, 10, (12, 3)).astype(np.int32), rng.randn(12, 1).astype(np.float32))


def held_out():
    rng = np.random.RandomState(4)
    return rng.randint(0, 10, (HELD_OUT, 3)).astype(np.int32), rng.randn(HELD_OUT, 1).astype(np.float32)


#: cases built under the mixed_float16 policy, with loss scaling (a LossScaleOptimizer whose scale fits float16 on
#: one device and on each replica: docs/tf2_programs.md#mixed-precision)
MIXED = ("mixed-float16",)


def _token_and_position(k):
    """keras-io's ``TokenAndPositionEmbedding``: the positions looked up with ``ops.arange(0, maxlen)``."""

    class TokenAndPositionEmbedding(k.layers.Layer):
        def __init__(self, maxlen: int = 3, vocab: int = 10, width: int = 4) -> None:
            super().__init__()
            self.token_emb = k.layers.Embedding(vocab, width)
            self.pos_emb = k.layers.Embedding(maxlen, width)

        def call(self, x):
            positions = self.pos_emb(k.ops.arange(start=0, stop=k.ops.shape(x)[-1], step=1))
            return self.token_emb(x) + positions

    return TokenAndPositionEmbedding


def build(flavor: str = "keras"):
    if flavor in ("keras", "keras-mixed", "keras-positions", "keras-summed", "keras-executions"):
        import keras as k

        optimizer = k.optimizers.Adam(0.05)
        if flavor == "keras-mixed":
            optimizer = k.optimizers.LossScaleOptimizer(optimizer, initial_scale=1024.0)
            k.mixed_precision.set_global_policy("mixed_float16")
    else:
        import tf_keras as k

        optimizer = (k.optimizers.legacy if flavor == "tf_keras-legacy" else k.optimizers).Adam(0.05)
    k.utils.set_random_seed(1)
    if flavor == "keras-positions":  # a Transformer's input: tokens and their positions, each a table
        model = k.Sequential([k.layers.Input((3,), dtype="int32"), _token_and_position(k)(),
                              k.layers.GlobalAveragePooling1D(), k.layers.Dense(4, activation="relu"),
                              k.layers.Dense(1)])
        model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
        return model
    try:
        model = k.Sequential([k.layers.Input((3,), dtype="int32"), k.layers.Embedding(10, 4),
                              k.layers.Flatten(), k.layers.Dense(4, activation="relu"), k.layers.Dense(1)])
    finally:
        if flavor == "keras-mixed":
            k.mixed_precision.set_global_policy("float32")
    loss = "mse"
    if flavor in SUMMED:
        optimizer, loss = k.optimizers.SGD(0.002), k.losses.MeanSquaredError(reduction="sum")
    model.compile(optimizer=optimizer, loss=loss, metrics=["mae"], steps_per_execution=3 if flavor in EXECUTIONS else 1)
    return model


def dataset(case: str = "dataset", mapped=None):
    """The data as a ``tf.data`` pipeline of the common shape: the examples shuffled (seeded: a new order each
    epoch), a per-example map (the input work: a cast; counted into the variable ``mapped`` where given), batched,
    prefetched. Workers read only their share of it (parallax/tf2/input_split.py). The "ragged" one has
    ``RAGGED_DATASET`` examples in batches of ``BATCH``: a last batch of one, which leaves a worker's block (and a
    replica's part) empty. The "unknown" one is of unknown length (a ``filter()`` that keeps every example), where
    Keras 3 counts a step more at each epoch's end (parallax/tf2/exhausted.py), and ragged too: each worker reads its
    share, the short last batch's size known only as it comes. Those two cast their targets in a map after
    ``batch()``, which works row by row: it is divided too."""
    import tensorflow as tf

    x, y, _ = data()
    if "ragged" in case or "unknown" in case:
        x, y = x[:RAGGED_DATASET], y[:RAGGED_DATASET]

    late = "ragged" in case or "unknown" in case  # the targets cast by a map of whole batches, after batch()

    def parse(ids, target):
        if mapped is not None:
            mapped.assign_add(1)
        return tf.cast(ids, tf.int32), (target if late else tf.cast(target, tf.float32))

    examples = tf.data.Dataset.from_tensor_slices((x.astype(np.int64), y.astype(np.float64) if late else y))
    examples = examples.shuffle(len(x), seed=5)
    if "unknown" in case:
        examples = examples.filter(lambda ids, target: True)
    batches = examples.map(parse, num_parallel_calls=2).batch(BATCH)
    if late:  # works row by row: each worker maps its own rows alone
        batches = batches.map(lambda ids, target: (ids, tf.cast(target, tf.float32)))
    return batches.prefetch(2)


#: the dataset cases' validation data: 9 of data()'s 12 validation examples, in batches of 4 (on 2 workers the last
#: batch of one leaves worker 1 padding)
VALIDATION_EXAMPLES, VALIDATION_BATCH = 9, 4


def validation_data(case: str, validated=None):
    """What ``case`` validates on: data()'s arrays; for the dataset cases, a pipeline of the training one's shape (a
    per-example map, counted into the variable ``validated`` where given, batched, prefetched), which each worker
    reads its share of (parallax/tf2/input_split.py)."""
    import tensorflow as tf

    _, _, (x, y) = data()
    if not case.endswith("dataset"):
        return x, y

    def parse(ids, target):
        if validated is not None:
            validated.assign_add(1)
        return tf.cast(ids, tf.int32), target

    examples = tf.data.Dataset.from_tensor_slices((x[:VALIDATION_EXAMPLES].astype(np.int64), y[:VALIDATION_EXAMPLES]))
    return examples.map(parse).batch(VALIDATION_BATCH).prefetch(1)


def single_device(case: str) -> tuple[dict, list, dict, np.ndarray]:
    """``model.fit`` on one device, called as a user calls it for ``case``: its History and
    weights, then ``model.evaluate`` (a dict) and ``model.predict`` of the held-out examples."""
    model = build(CASES[case])
    x, y, validation = data()
    if case in SHUFFLED:  # as a user calls it: shuffled by Keras, seeded by build()'s set_random_seed
        history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, validation_data=validation, verbose=0).history
    elif case.endswith("dataset"):
        history = model.fit(dataset(case), epochs=EPOCHS, validation_data=validation_data(case), verbose=0).history
    elif case.endswith("weighted"):
        history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, sample_weight=weights(),
                            validation_split=SPLIT, verbose=0).history
    else:
        history = model.fit(x, y, batch_size=batch_size(case), epochs=EPOCHS, shuffle=False,
                            validation_data=validation, verbose=0, callbacks=callbacks(case)).history
    test_x, test_y = held_out()
    evaluated = model.evaluate(test_x, test_y, batch_size=EVAL_BATCH, verbose=0, return_dict=True)
    return (history, [v.numpy() for v in model.trainable_variables], {k: float(v) for k, v in evaluated.items()},
            model.predict(test_x, batch_size=EVAL_BATCH, verbose=0))


def batch_logs_seen(callbacks: list) -> list[dict]:
    """The batch logs the callbacks of :func:`callbacks` saw (the "early-stopping" cases': every batch's)."""
    return [logs for c in callbacks for logs in getattr(c, "seen", [])]


def single_device_batch_logs(case: str) -> list[dict]:
    """``model.fit`` on one device of an "early-stopping" case: the logs its callback saw after each batch."""
    model = build(CASES[case])
    x, y, validation = data()
    used = callbacks(case)
    model.fit(x, y, batch_size=batch_size(case), epochs=EPOCHS, shuffle=False, validation_data=validation, verbose=0,
              callbacks=used)
    return batch_logs_seen(used)


def within_epochs(keras, directory: str):
    """A ``ModelCheckpoint`` that saves every 3 steps (within epochs) into ``directory/e<epoch>.weights.h5``."""
    import os

    return keras.callbacks.ModelCheckpoint(os.path.join(directory, "e{epoch}.weights.h5"), save_weights_only=True,
                                           save_freq=3)


def kernel_norms(keras):
    """A callback that logs the norm of the output layer's kernel after every batch, kept from the model when
    training begins (``self.kernel``): a batch hook that reads the weights trained so far."""

    class KernelNorms(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.norms: list[float] = []

        def on_train_begin(self, logs=None):
            self.kernel = self.model.trainable_weights[-2]

        def on_train_batch_end(self, batch, logs=None):
            self.norms.append(float(np.linalg.norm(self.kernel)))

    return KernelNorms()


def single_device_norms() -> list[float]:
    """``model.fit`` of the ordered case on one device with :func:`kernel_norms`: the norms it logged."""
    import keras

    model = build()
    x, y, validation = data()
    norms = kernel_norms(keras)
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, validation_data=validation, verbose=0,
              callbacks=[norms])
    return norms.norms


def saved_within_epochs(directory: str) -> dict[str, list]:
    """The weights each file of :func:`within_epochs` holds."""
    import os

    saved = {}
    for name in sorted(os.listdir(directory)):
        if name.startswith("e") and name.endswith(".weights.h5"):
            model = build()
            model.load_weights(os.path.join(directory, name))
            saved[name] = [v.numpy() for v in model.trainable_variables]
    return saved


def single_device_within_epochs(directory: str) -> dict[str, list]:
    """``model.fit`` of the ordered case on one device with :func:`within_epochs`: what its files hold."""
    import keras

    model = build()
    x, y, validation = data()
    model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, validation_data=validation, verbose=0,
              callbacks=[within_epochs(keras, directory)])
    return saved_within_epochs(directory)
