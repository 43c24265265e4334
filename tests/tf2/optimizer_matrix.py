"""Every Keras 3 optimizer, plain and inside a ``LossScaleOptimizer``, on a small Dense model trained by a
``tf.function`` step (tests/unit/tf2/test_optimizer_matrix.py, tests/multiprocess/test_tf2_optimizer_matrix.py).

The model has two hidden ``Dense(4)`` layers: their biases have the same shape (as most models' layers do), so the
gradients cannot be told apart by shape where an optimizer passes them through one op together (every Keras 3
optimizer does: the default replica context's ``all_reduce``, an ``IdentityN``). A ``LossScaleOptimizer`` in a
float32 model still applies every update inside its ``tf.cond`` (the finite check), which is what Parallax must
decide once, on the aggregated gradients.

``build(case)`` makes a fresh model, optimizer and step (seeded: the same initial values every time);
``batches(steps)`` the union batches; ``eager(case, steps)`` one device's training on them.
"""

from __future__ import annotations

import numpy as np
import tensorflow as tf

BATCH = 6  # the union batch: 2 or 3 workers take equal parts
FEATURES = 3

#: optimizer -> its constructor's arguments (``keras.optimizers.<name>(**arguments)``), by case name
OPTIMIZERS = {
    "sgd-nesterov": ("SGD", {"learning_rate": 0.1, "momentum": 0.9, "nesterov": True}),
    "adam-amsgrad": ("Adam", {"learning_rate": 0.05, "amsgrad": True}),
    "adamw": ("AdamW", {"learning_rate": 0.05, "weight_decay": 0.01}),
    "adamax": ("Adamax", {"learning_rate": 0.05}),
    "nadam": ("Nadam", {"learning_rate": 0.05}),  # its u_product: a trainable variable it writes from the step
    "rmsprop": ("RMSprop", {"learning_rate": 0.01, "momentum": 0.5}),
    "rmsprop-centered": ("RMSprop", {"learning_rate": 0.01, "centered": True, "momentum": 0.5}),
    "adagrad": ("Adagrad", {"learning_rate": 0.1}),
    "adadelta": ("Adadelta", {"learning_rate": 1.0}),
    "ftrl": ("Ftrl", {"learning_rate": 0.1, "l1_regularization_strength": 0.01,
                      "l2_regularization_strength": 0.01, "l2_shrinkage_regularization_strength": 0.01}),
    "lion": ("Lion", {"learning_rate": 0.01}),
    "lamb": ("Lamb", {"learning_rate": 0.05}),
    # the optimizers' own work on the gradients and variables (weight_decay=, clipnorm=, global_clipnorm=): in a
    # LossScaleOptimizer, inside its cond, on the gradients it unscaled
    "sgd-weight-decay": ("SGD", {"learning_rate": 0.1, "momentum": 0.9, "weight_decay": 0.05}),
    "adam-clipnorm-weight-decay": ("Adam", {"learning_rate": 0.05, "clipnorm": 0.1, "weight_decay": 0.05}),
    "sgd-global-clipnorm": ("SGD", {"learning_rate": 0.1, "momentum": 0.9, "global_clipnorm": 0.2}),
    "rmsprop-centered-global-clipnorm": ("RMSprop", {"learning_rate": 0.01, "centered": True, "global_clipnorm": 0.2}),
}
#: more of Keras 3's optimizers and options: analysed by the unit test; the multi-process test trains the loss-scaled
#: accumulating and moving-average cases on parameter servers (all of them trained on 2 MPI processes equal one
#: device too, by hand)
MORE_OPTIMIZERS = {
    "adafactor": ("Adafactor", {"learning_rate": 0.05}),
    "muon": ("Muon", {"learning_rate": 0.05}),
    "schedule-free-adamw": ("ScheduleFreeAdamW", {"learning_rate": 0.05}),
    "adam-accumulating": ("Adam", {"learning_rate": 0.05, "gradient_accumulation_steps": 2}),
    "adam-ema": ("Adam", {"learning_rate": 0.05, "use_ema": True, "ema_overwrite_frequency": 2}),
    "adamw-clipvalue": ("AdamW", {"learning_rate": 0.05, "weight_decay": 0.01, "clipvalue": 0.05}),
}
#: every case: ``<optimizer>`` plain and ``lso-<optimizer>`` inside a LossScaleOptimizer
CASES = tuple([*OPTIMIZERS, *(f"lso-{name}" for name in OPTIMIZERS)])
MORE_CASES = tuple([*MORE_OPTIMIZERS, *(f"lso-{name}" for name in MORE_OPTIMIZERS)])
#: what Parallax refuses, with the reason it gives (a regex): ``<case>-embedding`` is ``<case>`` on a model with a
#: trainable Embedding. Clipping by the global norm inside the loss scale's cond makes the embedding's sparse
#: gradient dense there, after the finite check: Parallax aggregates a gradient where the tape made it, so that
#: every worker decides on the same gradients, and cannot aggregate that one there.
REFUSED = {
    f"lso-{name}-embedding": r'^the gradient of "[^"]*embedding[^"]*" \([^)]*\) is computed inside a conditional '
                             r'that the gradients decide \("[^"]*": a LossScaleOptimizer\'s check that they are all '
                             r"finite\), .*global_clipnorm turning a sparse gradient, an embedding's, into a dense "
                             r"one\): every worker would decide on its own gradients"
    for name in ("sgd-global-clipnorm", "rmsprop-centered-global-clipnorm")
}
VOCAB = 10


def batches(steps: int) -> list[tuple[np.ndarray, np.ndarray]]:
    rng = np.random.RandomState(5)
    return [(rng.randn(BATCH, FEATURES).astype(np.float32), rng.randn(BATCH, 1).astype(np.float32))
            for _ in range(steps)]


def optimizer(case: str):
    """The optimizer of ``case`` (a fresh one)."""
    import keras

    base = case.removeprefix("lso-").removesuffix("-embedding")
    name, arguments = {**OPTIMIZERS, **MORE_OPTIMIZERS}[base]
    made = getattr(keras.optimizers, name)(**arguments)
    return keras.optimizers.LossScaleOptimizer(made) if case.startswith("lso-") else made


def build(case: str):
    """A fresh model, optimizer and step of ``case``: ``(step, variables)``; the step returns the loss and
    ``variables()`` the model's trainable variables (``variables.optimizer`` the optimizer). A ``*-embedding`` case
    (:data:`REFUSED`) takes word ids, looked up in a trainable table, for features."""
    import keras

    keras.utils.set_random_seed(1)
    embedding = case.endswith("-embedding")
    first = [keras.layers.Input((FEATURES,), dtype="int32"), keras.layers.Embedding(VOCAB, 4),
             keras.layers.Flatten()] if embedding else [keras.layers.Input((FEATURES,))]
    model = keras.Sequential([*first, keras.layers.Dense(4, activation="tanh"),
                              keras.layers.Dense(4, activation="tanh"), keras.layers.Dense(1)])
    opt = optimizer(case)

    @tf.function(input_signature=[tf.TensorSpec([None, FEATURES], tf.int32 if embedding else tf.float32),
                                  tf.TensorSpec([None, 1], tf.float32)])
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
            scaled = opt.scale_loss(loss)  # the loss itself where no loss scale is set
        grads = tape.gradient(scaled, model.trainable_variables)
        opt.apply_gradients(zip(grads, model.trainable_variables))
        return loss

    def variables():
        return model.trainable_variables

    variables.optimizer = opt
    return train_step, variables


def optimizer_state(variables) -> list[np.ndarray]:
    """The values of the optimizer's own variables (slots, iteration, loss scale and its counter)."""
    return [np.asarray(v.numpy()) for v in variables.optimizer.variables]


def eager(case: str, steps: int) -> tuple[list[float], list[np.ndarray], list[np.ndarray]]:
    """One device, eagerly (the step's Python function: no tracing, four times faster here; the traced step
    trains the same to 2e-7): the losses of ``steps`` steps on the union batches, the trained variables, the
    optimizer's."""
    step, variables = build(case)
    losses = [float(step.python_function(x, y)) for x, y in batches(steps)]
    return losses, [v.numpy() for v in variables()], optimizer_state(variables)
