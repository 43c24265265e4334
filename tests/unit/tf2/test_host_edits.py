"""What the program sets in the step's variables while the job trains reaches the job (parallax/tf2/host_edits.py):
a callback of parallax.fit that sets weights or a loss's weight trains as model.fit does; an optimizer's slot it
sets is refused, naming it and the hook; workers whose callbacks set other values take worker 0's, said."""

from __future__ import annotations

import numpy as np
import pytest

import parallax
from parallax.comm.group import Alone
from parallax.tf2.host_edits import HostEdits, HostWatch


def _model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="first"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


class _Step:
    """A step's side of :class:`HostEdits`: its watch, which variables it can write, and what it wrote."""

    def __init__(self, variables: dict, writable: set[str]) -> None:
        reads = {n: v.numpy for n, v in variables.items()}
        self.host = HostWatch(reads, {n: read() for n, read in reads.items()})
        self._variables, self._writable, self.written = variables, writable, []

    def can_write(self, name: str) -> bool:
        return name in self._writable

    def write_host(self, values: dict) -> None:
        for name, value in values.items():
            self._variables[name].assign(value)
        self.written.append(sorted(values))
        self.host.agree(values)


class _Workers(Alone):
    """Worker 1 of two, whose worker 0 set ``chiefs`` (values by name)."""

    def __init__(self, chiefs: dict) -> None:
        self._chiefs = chiefs

    @property
    def index(self) -> int:
        return 1

    def gather(self, value):  # the names each changed, then worker 0's values (this one sends None)
        return [self._chiefs if value is None else sorted(self._chiefs), value]


def test_what_a_callback_changed_is_written_into_the_job_once_and_a_slot_is_refused():
    model = _model()
    variables = {v.path: v for v in model.weights}
    kernel = model.layers[0].kernel.path
    step = _Step(variables, writable={kernel})
    edits = HostEdits(step, Alone())
    edits.carry("on_train_begin")
    assert step.written == []
    model.layers[0].kernel.assign(model.layers[0].kernel.numpy() * 0.5)
    edits.carry("on_epoch_begin")
    assert step.written == [[kernel]]
    edits.carry("on_epoch_begin")  # agreed since
    assert step.written == [[kernel]]
    model.layers[1].bias.assign([3.0])  # standing for an optimizer's slot: no write of it in the step's graph
    with pytest.raises(ValueError, match=r"a callback changed sequential\w*/dense\w*/bias in on_epoch_end or "
                                         r"on_epoch_begin, an optimizer's slot"):
        edits.carry("on_epoch_end or on_epoch_begin")


def test_a_worker_whose_callbacks_set_another_value_takes_worker_0s_said_once(parallax_warnings):
    import keras

    beta = keras.Variable(0.0, name="beta")
    step = _Step({"beta": beta}, writable={"beta"})
    chiefs = {"beta": np.float32(0.5)}
    edits = HostEdits(step, _Workers(chiefs))
    beta.assign(0.25)  # a callback that drew at random on this worker
    edits.carry("on_epoch_begin")
    assert float(beta.numpy()) == 0.5 and step.written == [["beta"]]
    assert "the callbacks of worker 1 set beta otherwise than worker 0's in on_epoch_begin" in parallax_warnings[0]
    beta.assign(0.125)
    edits.carry("on_epoch_begin")
    assert float(beta.numpy()) == 0.5 and len(parallax_warnings) == 1


def test_a_variable_the_job_is_fed_is_not_watched():
    import keras

    rate, beta = keras.Variable(0.1, name="rate"), keras.Variable(0.0, name="beta")
    reads = {"rate": rate.numpy, "beta": beta.numpy}
    watch = HostWatch(reads, {n: read() for n, read in reads.items()})
    rate.assign(0.05)
    beta.assign(0.5)
    assert watch.changed() == ["rate", "beta"]
    assert watch.changed(["beta", "gone"]) == ["beta"]
    watch.ignore({"rate"})
    assert watch.changed() == ["beta"]
    watch.agree(["beta"])
    assert watch.changed() == []


def _fit_both(build, callbacks, tmp_path, **fit) -> tuple[list, list, dict, dict]:
    """``model.fit`` and ``parallax.fit`` (one worker) of ``build()`` with ``callbacks()``: their weights and logs."""
    rng = np.random.RandomState(0)
    x, y = rng.randn(16, 4).astype("float32"), rng.randn(16, 1).astype("float32")
    reference = build()
    logs = reference.fit(x, y, batch_size=4, epochs=3, verbose=0, shuffle=False, callbacks=callbacks(), **fit)
    model = build()
    (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
    got = parallax.fit(model, x, y, batch_size=4, epochs=3, verbose=0, shuffle=False, callbacks=callbacks(),
                       resource_info=str(tmp_path / "resource_info"), **fit)
    return ([w.numpy() for w in reference.weights], [w.numpy() for w in model.weights], logs.history, got.history)


@pytest.mark.parametrize("hook", ["on_train_begin", "on_epoch_end"])
def test_parallax_fit_trains_with_the_weights_a_callback_set(tmp_path, hook):
    import keras

    class Halves(keras.callbacks.Callback):
        def halve(self, *_):
            self.model.set_weights([w * 0.5 for w in self.model.get_weights()])

    def callbacks():
        callback = Halves()
        setattr(callback, hook, callback.halve)
        return [callback]

    expected, got, expected_logs, logs = _fit_both(_model, callbacks, tmp_path)
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=1e-5)
    np.testing.assert_allclose(logs["loss"], expected_logs["loss"], rtol=1e-5)


def test_parallax_fit_trains_with_the_loss_weight_callbacks_anneal(tmp_path):
    """Keras's KL-annealing shape: a free variable (no layer's weight) that ``on_epoch_begin`` sets and a loss
    reads, a second one set ``on_train_batch_begin``, beside a ``LearningRateScheduler`` (whose rate is carried so
    too)."""
    import keras

    made = {}

    def build():
        keras.utils.set_random_seed(0)
        made["beta"] = beta = keras.Variable(0.0, trainable=False, name="beta")
        made["gamma"] = gamma = keras.Variable(0.0, trainable=False, name="gamma")

        class Penalty(keras.layers.Layer):
            def call(self, h):
                self.add_loss(beta * gamma * keras.ops.mean(keras.ops.square(h)))
                return h

        inputs = keras.Input((4,))
        model = keras.Model(inputs, keras.layers.Dense(1)(Penalty()(keras.layers.Dense(3)(inputs))))
        model.compile(optimizer="sgd", loss="mse")
        return model

    def callbacks():
        return [keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: made["beta"].assign(0.5 * epoch)),
                keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: made["gamma"].assign(
                    1.0 + batch)),
                keras.callbacks.LearningRateScheduler(lambda epoch, rate: rate * 0.5)]

    expected, got, expected_logs, logs = _fit_both(build, callbacks, tmp_path)
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=1e-5)
    np.testing.assert_allclose(logs["loss"], expected_logs["loss"], rtol=1e-5)
    assert float(made["beta"].numpy()) == 1.0 and float(made["gamma"].numpy()) == 4.0


def test_a_models_own_train_step_trains_with_the_rates_its_callbacks_set(tmp_path):
    """A model that overrides ``train_step`` (Keras's guide "Customizing what happens in fit()") reads the
    optimizer's rate in its own step: a ``LearningRateScheduler`` between epochs and a callback that sets the rate
    before each batch reach the job, as ``model.fit`` trains with them (they were lost before: 16 % off)."""
    import keras
    import tensorflow as tf

    def build():
        class Custom(keras.Model):
            def train_step(self, data):
                x, y = data
                with tf.GradientTape() as tape:
                    loss = self.compute_loss(y=y, y_pred=self(x, training=True))
                self.optimizer.apply_gradients(zip(tape.gradient(loss, self.trainable_variables),
                                                   self.trainable_variables))
                self.metrics[0].update_state(loss)
                return {"loss": self.metrics[0].result()}

        keras.utils.set_random_seed(1)
        inputs = keras.Input((4,))
        model = Custom(inputs, keras.layers.Dense(1)(keras.layers.Dense(8, activation="relu")(inputs)))
        model.compile(optimizer=keras.optimizers.SGD(0.1), loss="mse")
        return model

    class Warmup(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            if self.params.get("steps") and batch == 0:
                self.model.optimizer.learning_rate.assign(self.model.optimizer.learning_rate * 0.9)

    def callbacks():
        return [keras.callbacks.LearningRateScheduler(lambda epoch, rate: 0.1 * 0.3 ** epoch), Warmup()]

    expected, got, expected_logs, logs = _fit_both(build, callbacks, tmp_path)
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=1e-5)
    np.testing.assert_allclose(logs["loss"], expected_logs["loss"], rtol=1e-5)


def test_a_loop_trains_with_the_rate_it_sets_between_steps(tmp_path):
    """A custom loop's ``optimizer.learning_rate = ...`` between steps reaches the job before the next step."""
    import keras
    import tensorflow as tf

    def run(job):
        model = _model()
        optimizer = keras.optimizers.SGD(0.1)

        @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 1])])
        def step(x, y):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(model(x) - y))
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
            return loss

        if job:
            (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
            step, *_ = parallax.parallel_run(step, str(tmp_path / "resource_info"))
        rng = np.random.RandomState(1)
        for i in range(4):
            optimizer.learning_rate = 0.1 / (1 + i)
            step(rng.randn(8, 4).astype("float32"), rng.randn(8, 1).astype("float32"))
        if job:
            step.close()
        return [w.numpy() for w in model.weights]

    for want, have in zip(run(False), run(True)):
        np.testing.assert_allclose(have, want, rtol=1e-5)
