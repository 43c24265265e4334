"""A compiled Keras 3 model as its users train it with ``model.fit``, and the same training on one device
(the reference ``parallax.fit`` must equal): ``build()`` a fresh model (seeded), ``data()`` its examples."""

from __future__ import annotations

import numpy as np

EXAMPLES, BATCH, EPOCHS = 48, 12, 3


def data():
    rng = np.random.RandomState(3)
    x = rng.randint(0, 10, (EXAMPLES, 3)).astype(np.int32)
    y = rng.randn(EXAMPLES, 1).astype(np.float32)
    return x, y, (rng.randint(0, 10, (12, 3)).astype(np.int32), rng.randn(12, 1).astype(np.float32))


#: cases built under the mixed_float16 policy, with loss scaling (a LossScaleOptimizer whose scale fits float16 on
#: one device and on each replica: docs/tf2_programs.md#mixed-precision)
MIXED = ("mixed-float16",)


def build(case: str = ""):
    import keras

    keras.utils.set_random_seed(1)
    if case in MIXED:
        keras.mixed_precision.set_global_policy("mixed_float16")
    try:
        model = keras.Sequential([keras.layers.Input((3,), dtype="int32"), keras.layers.Embedding(10, 4),
                                  keras.layers.Flatten(), keras.layers.Dense(4, activation="relu"),
                                  keras.layers.Dense(1)])
    finally:
        keras.mixed_precision.set_global_policy("float32")
    optimizer = keras.optimizers.Adam(0.05)
    if case in MIXED:
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer, initial_scale=1024.0)
    model.compile(optimizer=optimizer, loss="mse", metrics=["mae"])
    return model


def dataset():
    import tensorflow as tf

    x, y, _ = data()
    return tf.data.Dataset.from_tensor_slices((x, y)).batch(BATCH, drop_remainder=True)


def single_device(case: str, seed: int = 0) -> tuple[dict, list]:
    """``model.fit`` on one device with the batches ``parallax.fit`` makes for ``case``: its History and weights."""
    model = build(case)
    x, y, validation = data()
    if case == "shuffled":  # parallax.fit's epochs: a permutation from RandomState(seed + epoch) each
        history: dict = {}
        for epoch in range(EPOCHS):
            order = np.random.RandomState(seed + epoch).permutation(len(x))
            h = model.fit(x[order], y[order], batch_size=BATCH, epochs=1, shuffle=False, validation_data=validation,
                          verbose=0)
            for k, v in h.history.items():
                history.setdefault(k, []).extend(v)
    elif case == "dataset":
        history = model.fit(dataset(), epochs=EPOCHS, validation_data=validation, verbose=0).history
    else:
        history = model.fit(x, y, batch_size=BATCH, epochs=EPOCHS, shuffle=False, validation_data=validation,
                            verbose=0).history
    return history, [v.numpy() for v in model.trainable_variables]
