"""parallax.tf2.evaluate: the metrics a worker updates on the host, summed over the workers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.tf2.evaluate import sum_metrics


class _Pair:
    """Two workers, the other of which added ``other`` since each sum (this one is worker 0)."""

    size, index = 2, 0

    def __init__(self, other: float, shapes: list | None = None) -> None:
        self.other, self.shapes, self.calls = other, shapes, 0

    def sum(self, values: np.ndarray) -> np.ndarray:
        self.calls += 1
        return values + self.other

    def gather(self, value):
        return [value, value if self.shapes is None else self.shapes]


def _model(*metrics):
    return SimpleNamespace(metrics=[SimpleNamespace(variables=list(vs)) for vs in metrics])


def test_metrics_summed_over_the_workers_add_every_workers_state():
    total, count = tf.Variable(3.0), tf.Variable(2.0)
    sum_metrics(_model([total, count]), _Pair(other=1.0))
    assert (total.numpy(), count.numpy()) == (4.0, 3.0)


def test_workers_with_other_metrics_are_refused():
    with pytest.raises(ValueError, match="the workers' models keep different metrics"):
        sum_metrics(_model([tf.Variable(0.0)]), _Pair(other=0.0, shapes=[(), ()]))


def _guide_model(keras):
    """Keras's guide "Customizing what happens in fit()": its own train_step and test_step, each unpacking
    ``x, y = data`` and adding the batch's loss to a ``Mean`` tracker."""

    class GuideModel(keras.Model):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            self.loss_tracker = keras.metrics.Mean(name="loss")

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = keras.ops.mean(keras.losses.mean_squared_error(y, self(x, training=True)))
            self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables), self.trainable_variables))
            self.loss_tracker.update_state(loss)
            return {"loss": self.loss_tracker.result()}

        def test_step(self, data):
            x, y = data
            self.loss_tracker.update_state(keras.ops.mean(keras.losses.mean_squared_error(y, self(x))))
            return {"loss": self.loss_tracker.result()}

        @property
        def metrics(self):
            return [self.loss_tracker]

    keras.utils.set_random_seed(3)
    inputs = keras.Input((4,))
    model = GuideModel(inputs, keras.layers.Dense(1)(inputs))
    model.compile(keras.optimizers.SGD(0.1))
    return model


def test_a_models_own_test_step_gets_its_data_as_model_fit_gives_it(tmp_path):
    """``x, y = data`` in the model's own test_step: Keras gives ``(x, y)`` where there are no sample weights
    (keras.utils.pack_x_y_sample_weight); parallax.fit gave ``(x, y, None)`` and the program failed to unpack."""
    import keras

    import parallax

    rng = np.random.RandomState(0)
    x, y = rng.randn(48, 4).astype("float32"), rng.randn(48, 1).astype("float32")
    arguments = dict(batch_size=8, epochs=2, shuffle=False, verbose=0, validation_data=(x[32:], y[32:]))
    reference = _guide_model(keras).fit(x[:32], y[:32], **arguments).history
    (tmp_path / "resource_info").write_text("localhost: cpu:0,cpu:1\n")
    history = parallax.fit(_guide_model(keras), x[:32], y[:32], resource_info=str(tmp_path / "resource_info"),
                           parallax_config=parallax.Config(run_option="PS"), **arguments).history  # 2 replicas here
    for key in ("loss", "val_loss"):
        np.testing.assert_allclose(history[key], reference[key], rtol=1e-5)


def test_an_own_test_step_on_a_batch_that_does_not_split_evenly_over_the_workers_is_said(monkeypatch):
    """Each worker's part is counted as a batch by a tracker of each batch's loss: a last batch of 1 example over
    2 workers weighs as half of a whole one, so the results differ from model.evaluate's, which is said."""
    import keras

    from parallax.tf2 import evaluate
    from parallax.tf2.keras_flavor import flavor_of

    model = _guide_model(keras)
    rng = np.random.RandomState(0)
    x, y = rng.randn(17, 4).astype("float32"), rng.randn(17, 1).astype("float32")
    batches = [(x[:16], y[:16], None), (x[16:], y[16:], None)]
    said: list[str] = []
    monkeypatch.setattr(evaluate.log, "warning", lambda message, *args: said.append(message % args))
    evaluate.evaluate_on(model, flavor_of(model, "test"), _Pair(other=0.0), ((b, None) for b in batches),
                         keras.callbacks.CallbackList([], model=model))
    assert len(said) == 1 and "batch 1 of the evaluation has 1 examples" in said[0], said
    assert "GuideModel's own test_step" in said[0]


def test_a_masked_loss_is_evaluated_by_whole_batches_in_turn():
    """The average of a batch's parts over their own unmasked values is not the batch's: a model whose loss is
    masked is evaluated batch by batch, batch ``i`` whole on worker ``i % n`` (here worker 1 of 2)."""
    import keras

    from parallax.tf2 import evaluate
    from parallax.tf2.keras_flavor import flavor_of

    ids = keras.Input((5,), dtype="int32")
    states = keras.layers.LSTM(3, return_sequences=True)(keras.layers.Embedding(10, 4, mask_zero=True)(ids))
    model = keras.Model(ids, keras.layers.Dense(2)(states))
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    flavor = flavor_of(model, "test")
    taken = []

    class Recorded:
        def __getattr__(self, name):
            return getattr(flavor, name)

        def test_batch(self, model, x, y, sample_weight, counts=None):
            taken.append((len(x), counts))
            flavor.test_batch(model, x, y, sample_weight, 1.0 if counts is None else counts)

    class Second(_Pair):
        index = 1

    rng = np.random.RandomState(0)
    x, y = rng.randint(0, 10, (10, 5)).astype("int32"), rng.randint(0, 2, (10, 5)).astype("int32")
    batches = [(x[:4], y[:4], None), (x[4:8], y[4:8], None), (x[8:], y[8:], None)]
    evaluate.evaluate_on(model, Recorded(), Second(other=0.0), ((b, None) for b in batches),
                         keras.callbacks.CallbackList([]))
    assert taken == [(1, None), (4, 1.0)]  # the metrics built on one example (then reset), then batch 1 whole


def test_each_worker_evaluates_the_block_of_its_share_and_not_its_padding():
    """Where each worker reads its share of the validation data (parallax/tf2/input_split.py), it gets its block of
    every global batch and the batch's examples; a worker the short last batch leaves none gets padding, which it
    must not count. Two workers' evaluations (the second's sums added to the first's) equal model.evaluate's."""
    import keras

    from parallax.tf2 import evaluate
    from parallax.tf2.keras_flavor import flavor_of

    keras.utils.set_random_seed(2)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    rng = np.random.RandomState(0)
    x, y = rng.randn(9, 3).astype("float32"), rng.randn(9, 2).astype("float32")
    expected = model.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)

    class Worker(_Pair):
        def __init__(self, index: int, other) -> None:
            super().__init__(other)
            self.index, self.summed = index, None

        def sum(self, values):
            self.summed = np.array(values)
            return values + self.other

    def blocks(worker: int):  # batches of 4, 4 and 1: blocks of 2, 2 and 1 (worker 1: the padding x[8:9])
        for start, size in ((0, 4), (4, 4), (8, 1)):
            begin = start + min(worker * 2, size - 1) if size > worker * 2 else start
            yield (x[begin:begin + min(2, size)], y[begin:begin + min(2, size)], None), size

    second = Worker(1, other=0.0)
    evaluate.evaluate_on(model, flavor_of(model, "test"), second, blocks(1), keras.callbacks.CallbackList([]),
                         whole=False)
    got = evaluate.evaluate_on(model, flavor_of(model, "test"), Worker(0, other=second.summed), blocks(0),
                               keras.callbacks.CallbackList([]), whole=False)
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-6, err_msg=key)


@pytest.mark.parametrize("module", ["keras", "tf_keras"])
def test_validation_steps_of_a_repeated_dataset_are_taken_as_model_fit_takes_them(tmp_path, module):
    """Keras 3's ``evaluate`` resets the validation iterator ``model.fit`` keeps: each epoch validates on the first
    ``validation_steps`` batches again; tf_keras's data handler goes on where the last pass stopped."""
    import importlib

    import parallax

    keras = importlib.import_module(module)
    rng = np.random.RandomState(0)
    x = rng.randn(64, 5).astype("float32")
    y = (x[:, :2].sum(1, keepdims=True) > 0).astype("float32")

    def run(fit):
        keras.utils.set_random_seed(1)
        model = keras.Sequential([keras.Input((5,)), keras.layers.Dense(8, activation="relu"),
                                  keras.layers.Dense(1, activation="sigmoid")])
        model.compile(keras.optimizers.Adam(0.01), "binary_crossentropy", metrics=["accuracy"])
        batches = tf.data.Dataset.from_tensor_slices((x, y)).batch(8)
        return fit(model, batches, epochs=3, verbose=0, validation_data=batches.repeat(), validation_steps=2).history

    (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
    expected = run(lambda model, *args, **kwargs: model.fit(*args, **kwargs))
    got = run(lambda model, *args, **kwargs: parallax.fit(model, *args, resource_info=str(tmp_path / "resource_info"),
                                                          **kwargs))
    for key, values in expected.items():
        np.testing.assert_allclose(got[key], values, rtol=1e-5, err_msg=key)


@pytest.mark.parametrize("module", ["keras", "tf_keras"])
def test_an_evaluation_after_the_model_is_compiled_again_updates_the_new_metrics(module):
    """A fine-tuning compiles the model again (new metrics, a new loss tracker): the evaluation step made for the
    first compile updated the old ones, and ``parallax.evaluate`` gave 0 for every metric (Keras 3, until
    2026-12-07)."""
    import importlib

    keras = importlib.import_module(module)
    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(1)])
    rng = np.random.RandomState(0)
    x, y = rng.randn(10, 3).astype("float32"), rng.randn(10, 1).astype("float32")
    for rate in (0.1, 0.01):
        model.compile(keras.optimizers.SGD(rate), "mse", metrics=["mae"])
        expected = model.evaluate(x, y, batch_size=4, verbose=0, return_dict=True)
        got = parallax.evaluate(model, x, y, batch_size=4, verbose=0, return_dict=True)
        assert sorted(got) == sorted(expected)
        for key, value in expected.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-6, err_msg=f"{key} after compile at {rate}")
