"""The first step checks itself (parallax/tf2/first_step.py): before the first step of a job of several replicas,
worker 0 compares the gradient of its part with the mean of its halves' and says at WARNING where they differ
(an op that sums over the batch, batch statistics, random draws), naming the variables; a step whose gradient is
a mean over its examples trains without a word; Config(check_first_step=False) turns it off. Two replicas in
this process (a job of one worker): nothing is launched."""

from __future__ import annotations

import logging
import re

import numpy as np
import pytest

import parallax
from parallax.logs import LOGGER_NAME
from parallax.tf2.first_step import compare


def _fit(kind: str, tmp_path, **config) -> None:
    import keras
    from keras import ops

    class AddsTheBatchsDot(keras.layers.Layer):  # a recommender's ops.tensordot(user, movie, 2): over the batch
        def call(self, a):
            return a + ops.tensordot(a, a, 2)

    class AddsALossPerExample(keras.layers.Layer):  # keras-io's CTCLayer: Keras 3 sums what add_loss is given
        def call(self, a):
            self.add_loss(ops.square(a))
            return a

    class DropsItself(keras.layers.Layer):  # a seeded gamma draw: each replica draws its own (no rows of a whole)
        def __init__(self, stddev=None, **kwargs):
            super().__init__(**kwargs)
            self.stddev = stddev

        def call(self, a):
            import tensorflow as tf

            if self.stddev is not None:
                return a + tf.random.gamma(tf.shape(a), 1.0, seed=3) * self.stddev
            return a * tf.random.gamma(tf.shape(a), 1.0, seed=7)

    class DrawsSeeded(keras.layers.Layer):  # TF1-style seeded stateful draws: each replica its rows of one device's
        def call(self, a):
            import tensorflow as tf

            kept = tf.cast(tf.random.uniform(tf.shape(a), seed=7) > 0.5, a.dtype) * 2.0
            return a * kept + tf.random.normal(tf.shape(a), stddev=0.3, seed=3)

    class AddsASum(keras.layers.Layer):  # a sum made in the layer: a scalar, which Parallax cannot tell from a mean
        def call(self, a):
            self.add_loss(ops.sum(ops.square(a)))
            return a

    keras.utils.set_random_seed(0)
    layers = [keras.Input((4,)), keras.layers.Dense(3)]
    layers += {"plain": [], "dot": [AddsTheBatchsDot()], "batch-norm": [keras.layers.BatchNormalization()],
               "dropout": [DropsItself(name="drops")], "summed": [AddsASum()],
               "keras-draws": [keras.layers.Dropout(0.5), keras.layers.GaussianNoise(0.3)],
               "seeded-draws": [DrawsSeeded()],
               "per-example": [AddsALossPerExample()],
               "small-noise": [DropsItself(1e-6, name="noise")]}[kind]
    model = keras.Sequential(layers + [keras.layers.Dense(1)])
    alone = kind in ("summed", "per-example")  # its layer's loss alone
    model.compile(optimizer="sgd", loss=None if alone else "mse")
    rng = np.random.RandomState(0)
    (tmp_path / "resource_info").write_text("localhost: cpu:0,cpu:1\n")
    targets = None if alone else rng.randn(16, 1).astype("float32")
    parallax.fit(model, rng.randn(16, 4).astype("float32"), targets, batch_size=8,
                 verbose=0, resource_info=str(tmp_path / "resource_info"),
                 parallax_config=parallax.Config(run_option="PS", **config))


@pytest.fixture
def warnings(monkeypatch):
    records: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            if record.levelno >= logging.WARNING:
                records.append(record.getMessage())

    handler = Keep()
    logging.getLogger(LOGGER_NAME).addHandler(handler)
    yield records
    logging.getLogger(LOGGER_NAME).removeHandler(handler)


@pytest.mark.parametrize("kind", ["dot", "batch-norm", "dropout", "summed"])
def test_a_step_whose_gradient_is_no_mean_over_its_examples_is_named_at_warning(kind, tmp_path, warnings):
    _fit(kind, tmp_path)
    said = [w for w in warnings if "the first step's check" in w]
    assert len(said) == 1 and re.search(r"is not the mean of its two halves' for sequential\w*/\w+/\w+ \(\d", said[0])
    assert "ops.tensordot(a, b, 2)" in said[0] and "Config(check_first_step=False)" in said[0]
    # the random draws named by their layer (a seeded tf.random.gamma in the layer's scope)
    assert bool(re.search(r"The step draws random numbers in sequential\w*/drops", said[0])) == (kind == "dropout")
    # a loss that sums over the batch: the part's gradient is its halves' sum, said so
    assert ("the loss sums over the batch's examples" in said[0]) == (kind == "summed")


# per-example: parallax.fit weighs the layer's sum; keras-draws: Keras's Dropout and GaussianNoise take their rows
# of one device's draws (parallax/tf2/draws.py), seeded-draws: a seeded tf.random.uniform and normal too (the check
# draws none of them: it feeds the kernels' numbers, so that every replica's kernel stays in step with one device's)
@pytest.mark.parametrize("kind", ["plain", "per-example", "keras-draws", "seeded-draws"])
def test_a_step_whose_gradient_is_a_mean_over_its_examples_trains_without_a_word(kind, tmp_path, warnings):
    _fit(kind, tmp_path)
    assert not [w for w in warnings if "the first step's check" in w or "draws random numbers" in w], warnings


@pytest.mark.parametrize("batch_norm", [True, False])
def test_a_step_that_accumulates_its_gradients_is_checked_too(batch_norm, tmp_path, warnings):
    # Keras 3 applies accumulated gradients in a tf.cond that does not run at the first step: the check compares
    # the gradients the step computes, not the applied ones (an Embedding's, sparse, too: in MPI, launched)
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                              *([keras.layers.BatchNormalization()] if batch_norm else []), keras.layers.Dense(1)])
    model.compile(keras.optimizers.Adam(0.01, gradient_accumulation_steps=2), "mse")
    rng = np.random.RandomState(0)
    (tmp_path / "resource_info").write_text("localhost: cpu:0,cpu:1\n")
    parallax.fit(model, rng.randn(32, 4).astype("float32"), rng.randn(32, 1).astype("float32"), batch_size=16,
                 verbose=0, resource_info=str(tmp_path / "resource_info"),
                 parallax_config=parallax.Config(run_option="PS"))
    said = [w for w in warnings if "the first step's check" in w]
    if batch_norm:
        assert len(said) == 1 and re.search(r"sequential\w*/dense\w*/kernel \(\d", said[0])
    else:
        assert not said


def test_random_draws_too_small_to_move_the_gradients_are_said_still(tmp_path, warnings):
    """A noise of scale 1e-6 (a seeded gamma draw: each replica its own) moves the first step's gradients less
    than the check's tolerance: training differs
    from one device all the same (by little), and the draws are named (the probe of 2026-12-05 found 1e-4 in
    the weights, said nowhere)."""
    _fit("small-noise", tmp_path)
    assert not [w for w in warnings if "the first step's check" in w]
    said = [w for w in warnings if "the step draws random numbers in" in w]
    assert len(said) == 1 and re.search(r"draws random numbers in sequential\w*/noise", said[0]), warnings
    assert "training differs from one device's" in said[0]


def test_the_check_can_be_turned_off(tmp_path, warnings):
    _fit("dot", tmp_path, check_first_step=False)
    assert not [w for w in warnings if "the first step's check" in w]


def test_sparse_gradients_are_compared_row_by_row():
    part = {"emb": (np.array([[2.0], [4.0], [6.0]]), np.array([0, 3, 0]))}  # row 0: 8, row 3: 4
    halves = ({"emb": (np.array([[4.0]]), np.array([0]))}, {"emb": (np.array([[4.0], [6.0]]), np.array([3, 0]))})
    assert compare(part, halves, (1, 2)) == {"emb": pytest.approx(abs(8 - (4 / 3 + 12 / 3)) / 8)}


def test_a_gradient_that_is_zero_but_for_rounding_is_measured_against_the_largest():
    # an attention layer's key bias: zero in exact arithmetic, its rounding noise no sign of anything
    part = {"kernel": np.array([1.0, -2.0]), "key_bias": np.array([1e-9])}
    halves = ({"kernel": np.array([1.0, -2.0]), "key_bias": np.array([3e-9])},
              {"kernel": np.array([1.0, -2.0]), "key_bias": np.array([-2e-9])})
    differences = compare(part, halves, (1, 1))
    assert differences["key_bias"] < 1e-3 and differences["kernel"] == 0.0
