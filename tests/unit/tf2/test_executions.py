"""A model compiled with ``steps_per_execution``: ``parallax.fit`` trains every batch ``model.fit`` trains and calls the
batch hooks where it does (parallax/tf2/executions.py), Keras 3 and tf_keras, on one worker in this process."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.tf2.executions import Executions


def test_the_hooks_go_around_each_execution_and_name_its_last_batch_as_each_keras_does():
    keras_3, legacy = Executions(4, legacy=False), Executions(4, legacy=True)
    assert [i for i in range(6) if keras_3.begins(i)] == [0, 4]
    assert [i for i in range(6) if keras_3.ends(i, 6)] == [3, 5]
    assert [i for i in range(6) if keras_3.ends(i, None)] == [3]  # the data's end says the rest
    assert keras_3.end_index(5, 6) == 7  # Keras 3 counts in whole executions
    assert legacy.end_index(5, 6) == 5 and legacy.end_index(5, None) == 7  # tf_keras: the last, where it knows it
    assert all(Executions(1, legacy=False).ends(i, None) for i in range(3))
    with pytest.raises(ValueError, match="steps_per_execution must be 1 or more, got 0"):
        Executions(0, legacy=False)


def _keras(flavor: str):
    if flavor == "tf_keras":
        import tf_keras

        return tf_keras
    import keras

    return keras


def _hooks(keras, calls: list):
    """A callback that records the batch hooks' calls in ``calls``, and the loss each ``on_train_batch_end`` gets."""

    class Hooks(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            calls.append(("begin", batch))

        def on_train_batch_end(self, batch, logs=None):
            calls.append(("end", batch, float(logs["loss"])))

    return Hooks()


def _fit(flavor: str, tmp_path, data, job: bool, size: int = 4) -> tuple[list, list, dict]:
    keras = _keras(flavor)
    keras.utils.set_random_seed(2)
    inputs = keras.Input((3,))
    model = keras.Model(inputs, keras.layers.Dense(2)(keras.layers.Dense(5, activation="relu")(inputs)))
    model.compile(keras.optimizers.Adam(0.05), "mse", steps_per_execution=size)
    calls: list = []
    arguments = dict(epochs=3, verbose=0, callbacks=[_hooks(keras, calls)], **data())
    if job:
        (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
        history = parallax.fit(model, resource_info=str(tmp_path / "resource_info"), **arguments)
    else:
        history = model.fit(**arguments)
    return [w.numpy() for w in model.weights], calls, history.history


def _arrays():
    rng = np.random.RandomState(0)
    return {"x": rng.randn(24, 3).astype("float32"), "y": rng.randn(24, 2).astype("float32"), "batch_size": 4}


def _unknown_length():
    """A dataset whose length Keras learns only by reading it: 22 examples of 24 kept, in 6 batches."""
    x, y = _arrays()["x"], _arrays()["y"]
    kept = tf.data.Dataset.from_tensor_slices((x, y, np.arange(24))).filter(lambda a, b, i: i % 12 != 5)
    return {"x": kept.map(lambda a, b, i: (a, b)).batch(4)}


@pytest.mark.parametrize("flavor, data, size", [("keras", _arrays, 4), ("tf_keras", _arrays, 4),
                                                ("keras", _unknown_length, 4), ("keras", _unknown_length, 1)],
                         ids=["keras-arrays", "tf_keras-arrays", "keras-unknown-length", "keras-unknown-length-1"])
def test_fit_with_steps_per_execution_trains_every_batch_and_calls_the_hooks_as_model_fit(tmp_path, flavor, data,
                                                                                          size):
    """6 batches an epoch in executions of 4: tf_keras's data handler gives one step an execution, which parallax.fit
    trained alone (2 batches of 6 an epoch, silently; found 2026-12-07), and the hooks ran at every batch. Of data
    whose length Keras 3 does not know, it calls ``on_train_batch_begin`` once more an epoch, for the execution that
    finds the data exhausted (also of one step: ``keras-unknown-length-1``), which counts an optimizer step only
    where it is of one step."""
    expected, expected_calls, expected_history = _fit(flavor, tmp_path, data, job=False, size=size)
    got, calls, history = _fit(flavor, tmp_path, data, job=True, size=size)
    assert [c[:2] for c in calls] == [c[:2] for c in expected_calls]
    np.testing.assert_allclose([c[2] for c in calls if c[0] == "end"],
                               [c[2] for c in expected_calls if c[0] == "end"], rtol=1e-5)
    for want, have in zip(expected, got):
        np.testing.assert_allclose(have, want, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(history["loss"], expected_history["loss"], rtol=1e-5)


@pytest.mark.parametrize("job", [False, True], ids=["model.fit", "parallax.fit"])
def test_tf_keras_refuses_data_of_unknown_length_in_executions_as_model_fit_does(tmp_path, job):
    with pytest.raises(ValueError, match="Could not infer the size of the data. With `steps_per_execution > 1`"):
        _fit("tf_keras", tmp_path, _unknown_length, job)


def test_tf_keras_evaluate_and_predict_of_a_model_of_executions_equal_its_own():
    """tf_keras's ``test_on_batch`` and ``predict_on_batch`` fail on a model compiled with ``steps_per_execution``
    above 1 (they read that many batches of one); ``parallax.evaluate`` and ``predict`` evaluate batch by batch with
    functions of one step, and leave the model's own to ``model.evaluate``."""
    import tf_keras

    tf_keras.utils.set_random_seed(4)
    model = tf_keras.Sequential([tf_keras.layers.Input((3,)), tf_keras.layers.Dense(2)])
    model.compile("adam", "mse", metrics=["mae"], steps_per_execution=3)
    data = _arrays()
    x, y = data["x"][:10], data["y"][:10]
    expected, predicted = model.evaluate(x, y, batch_size=4, verbose=0, return_dict=True), model.predict(x, 4, 0)
    got = parallax.evaluate(model, x, y, batch_size=4, verbose=0, return_dict=True)
    assert sorted(got) == sorted(expected)
    for key, value in expected.items():
        np.testing.assert_allclose(got[key], value, rtol=1e-6)
    np.testing.assert_allclose(parallax.predict(model, x, batch_size=4, verbose=0), predicted, rtol=1e-6)
    assert model.evaluate(x, y, batch_size=4, verbose=0, return_dict=True) == expected  # the model's own still
