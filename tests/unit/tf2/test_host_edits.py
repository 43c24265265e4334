"""A callback that changes the model's weights while parallax.fit trains is refused, naming the weights and the
hook (parallax/tf2/host_edits.py): the job trains its own copies and would not see the change."""

from __future__ import annotations

import numpy as np
import pytest

import parallax
from parallax.tf2.host_edits import HostEdits, HostWatch


def _model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="first"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_weights_set_where_the_model_and_the_job_agree_pass_and_a_change_is_named():
    model = _model()
    variables = {v.path: v for v in model.weights}
    reads = {n: v.numpy for n, v in variables.items()}
    edits = HostEdits(HostWatch(reads, {n: read() for n, read in reads.items()}))
    edits.check("on_train_begin")
    model.layers[0].kernel.assign(model.layers[0].kernel.numpy() * 0.5)
    with pytest.raises(ValueError, match=r"changed the model's weights or a variable the step uses "
                                         r"\(sequential\w*/first/kernel\) in on_epoch_end"):
        edits.check("on_epoch_end")
    edits.agree()  # written back from the job
    edits.check("on_epoch_begin")


@pytest.mark.parametrize("hook", ["on_train_begin", "on_epoch_end"])
def test_parallax_fit_refuses_a_callback_that_sets_weights(tmp_path, hook):
    import keras

    class Halves(keras.callbacks.Callback):
        def halve(self, *_):
            self.model.set_weights([w * 0.5 for w in self.model.get_weights()])

    callback = Halves()
    setattr(callback, hook, callback.halve)
    model = _model()
    rng = np.random.RandomState(0)
    (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
    with pytest.raises(ValueError, match=f"a callback changed the model's weights or a variable the step uses .* "
                                         f"in {hook}"):
        parallax.fit(model, rng.randn(16, 4).astype("float32"), rng.randn(16, 1).astype("float32"), batch_size=8,
                     epochs=2, verbose=0, callbacks=[callback], resource_info=str(tmp_path / "resource_info"))


def test_a_variable_the_job_is_fed_is_not_watched():
    import keras

    rate, beta = keras.Variable(0.1, name="rate"), keras.Variable(0.0, name="beta")
    reads = {"rate": rate.numpy, "beta": beta.numpy}
    watch = HostWatch(reads, {n: read() for n, read in reads.items()})
    rate.assign(0.05)
    beta.assign(0.5)
    assert watch.changed() == ["rate", "beta"]
    watch.ignore({"rate"})
    assert watch.changed() == ["beta"]
    watch.agree()
    assert watch.changed() == []


def test_parallax_fit_refuses_a_callback_that_sets_a_variable_a_loss_reads(tmp_path):
    """Keras's KL-annealing shape: a free variable (no layer's weight) that ``on_epoch_begin`` sets and a loss
    reads; a learning rate a callback sets is fed to the job and passes."""
    import keras

    beta = keras.Variable(0.0, trainable=False, name="beta")

    class Penalty(keras.layers.Layer):
        def call(self, h):
            self.add_loss(beta * keras.ops.mean(keras.ops.square(h)))
            return h

    inputs = keras.Input((4,))
    model = keras.Model(inputs, keras.layers.Dense(1)(Penalty()(keras.layers.Dense(3)(inputs))))
    model.compile(optimizer="sgd", loss="mse")
    callbacks = [keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: beta.assign(0.5 * epoch)),
                 keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.5)]
    rng = np.random.RandomState(0)
    (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
    with pytest.raises(ValueError, match=r"a variable the step uses \(beta\) in on_epoch_end or on_epoch_begin"):
        parallax.fit(model, rng.randn(16, 4).astype("float32"), rng.randn(16, 1).astype("float32"), batch_size=8,
                     epochs=2, verbose=0, callbacks=callbacks, resource_info=str(tmp_path / "resource_info"))
