"""Bad input on the TensorFlow 2 surfaces (parallax.fit, parallax.evaluate, parallax.predict, parallel_run of a step),
answered in the process the user started, before anything starts: a TypeError or ValueError that names the
argument and what is expected, never a NumPy or TensorFlow traceback from a launched worker
(parallax/tf2/arguments.py). Keras's own silent acceptances (batch_size=0 trains as if 32) are refused too."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import parallax

X, Y = np.zeros((8, 2), np.float32), np.zeros((8, 1), np.float32)


def _model(optimizer="sgd"):
    import keras

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer=optimizer, loss="mse")
    return model


def _dataset():
    return tf.data.Dataset.from_tensor_slices((X, Y)).batch(4)


FIT = [  # (id, arguments beside the model, the error, a pattern its message starts with)
    ("batch_size-0", dict(x=X, y=Y, batch_size=0), ValueError, r"parallax.fit: batch_size must be at least 1, got 0"),
    ("batch_size-negative", dict(x=X, y=Y, batch_size=-4), ValueError, r"parallax.fit: batch_size must be at least 1"),
    ("batch_size-str", dict(x=X, y=Y, batch_size="64"), TypeError, r"parallax.fit: batch_size must be an int or None, "
                                                                    r"got str '64'"),
    ("batch_size-float", dict(x=X, y=Y, batch_size=4.0), TypeError, r"parallax.fit: batch_size must be an int"),
    ("batch_size-bool", dict(x=X, y=Y, batch_size=True), TypeError, r"parallax.fit: batch_size must be an int"),
    ("epochs-0", dict(x=X, y=Y, epochs=0), ValueError, r"parallax.fit: epochs must be at least 1, got 0"),
    ("epochs-negative", dict(x=X, y=Y, epochs=-1), ValueError, r"parallax.fit: epochs must be at least 1, got -1"),
    ("epochs-none", dict(x=X, y=Y, epochs=None), TypeError, r"parallax.fit: epochs must be an int, got NoneType"),
    ("epochs-str", dict(x=X, y=Y, epochs="3"), TypeError, r"parallax.fit: epochs must be an int"),
    ("initial_epoch-negative", dict(x=X, y=Y, initial_epoch=-1), ValueError,
     r"parallax.fit: initial_epoch must be at least 0"),
    ("initial_epoch-past-epochs", dict(x=X, y=Y, epochs=2, initial_epoch=2), ValueError,
     r"parallax.fit: initial_epoch \(2\) must be less than epochs \(2\)"),
    ("steps_per_epoch-0", dict(x=X, y=Y, steps_per_epoch=0), ValueError,
     r"parallax.fit: steps_per_epoch must be at least 1, got 0"),
    ("steps_per_epoch-str", dict(x=X, y=Y, steps_per_epoch="2"), TypeError, r"parallax.fit: steps_per_epoch must be"),
    ("validation_steps-0", dict(x=X, y=Y, validation_steps=0), ValueError,
     r"parallax.fit: validation_steps must be at least 1"),
    ("validation_batch_size-0", dict(x=X, y=Y, validation_batch_size=0), ValueError,
     r"parallax.fit: validation_batch_size must be at least 1"),
    ("validation_freq-list", dict(x=X, y=Y, validation_freq=[1, 2]), TypeError,
     r"parallax.fit: validation_freq must be an int \(every that many epochs\), got list \[1, 2\]; a list of epochs"),
    ("validation_freq-0", dict(x=X, y=Y, validation_freq=0), ValueError, r"parallax.fit: validation_freq must be at "
                                                                          r"least 1"),
    ("verbose-3", dict(x=X, y=Y, verbose=3), ValueError, r"parallax.fit: verbose must be 'auto', 0, 1 or 2, got 3"),
    ("verbose-str", dict(x=X, y=Y, verbose="loud"), ValueError, r"parallax.fit: verbose must be"),
    ("shuffle-str", dict(x=X, y=Y, shuffle="yes"), ValueError, r"parallax.fit: shuffle must be True, False or 'batch'"),
    ("validation_split-1", dict(x=X, y=Y, validation_split=1.0), ValueError,
     r"parallax.fit: validation_split must be a number in \[0, 1\), got 1.0"),
    ("validation_split-negative", dict(x=X, y=Y, validation_split=-0.1), ValueError,
     r"parallax.fit: validation_split must be a number"),
    ("validation_split-str", dict(x=X, y=Y, validation_split="0.2"), ValueError,
     r"parallax.fit: validation_split must be a number"),
    ("class_weight-list", dict(x=X, y=Y, class_weight=[1.0, 2.0]), TypeError,
     r"parallax.fit: class_weight must be a dict"),
    ("callbacks-one", dict(x=X, y=Y, callbacks=object()), TypeError, r"parallax.fit: callbacks must be a list"),
    ("seed-str", dict(x=X, y=Y, seed="0"), TypeError, r"parallax.fit: seed must be an int, got str"),
    ("x-missing", dict(y=Y), TypeError, r"parallax.fit: x is missing"),
    ("x-and-y-lengths", dict(x=X, y=Y[:5]), ValueError,
     r"parallax.fit: y must have one entry per example of x \(8\), got 5"),
    ("sample_weight-length", dict(x=X, y=Y, sample_weight=np.ones(3)), ValueError,
     r"parallax.fit: sample_weight must have one entry per example of x \(8\), got 3"),
    ("x-empty", dict(x=X[:0], y=Y[:0]), ValueError, r"parallax.fit: x has no examples"),
    ("x-ragged-dict", dict(x={"a": X, "b": X[:3]}, y=Y), ValueError,
     r"parallax.fit: x must be arrays .* of arrays of different lengths"),
    ("x-scalar", dict(x=3.0, y=Y), ValueError, r"parallax.fit: x must be arrays"),
    ("y-beside-a-dataset", dict(x=_dataset(), y=Y), ValueError,
     r"parallax.fit: y goes with arrays; x is a \w+, which yields its own batches"),
    ("batch_size-beside-a-dataset", dict(x=_dataset(), batch_size=4), ValueError,
     r"parallax.fit: batch_size goes with arrays"),
    ("sample_weight-beside-a-dataset", dict(x=_dataset(), sample_weight=np.ones(8)), ValueError,
     r"parallax.fit: sample_weight goes with arrays"),
    ("validation_data-alone", dict(x=X, y=Y, validation_data=X), ValueError,
     r"parallax.fit: validation_data must be \(x_val, y_val\), \(x_val, y_val, val_sample_weight\) or a "
     r"tf.data.Dataset, got ndarray"),
    ("validation_data-of-4", dict(x=X, y=Y, validation_data=(X, Y, None, None)), ValueError,
     r"parallax.fit: validation_data must be .* got tuple of 4"),
    ("validation_data-lengths", dict(x=X, y=Y, validation_data=(X, Y[:2])), ValueError,
     r"parallax.fit: validation_data: y must have one entry per example of x \(8\), got 2"),
    ("class-and-sample-weights", dict(x=X, y=Y, class_weight={0: 1.0}, sample_weight=np.ones(8)), ValueError,
     r"parallax.fit: class_weight goes with arrays x, y and no sample_weight"),
    ("config-not-a-config", dict(x=X, y=Y, parallax_config={"run_option": "MPI"}), TypeError,
     r"parallel_run: parallax_config must be a parallax.Config, got dict"),
]


@pytest.mark.parametrize("arguments, error, message", [pytest.param(*case[1:], id=case[0]) for case in FIT])
def test_bad_input_to_fit_is_refused_before_anything_starts_naming_the_argument(arguments, error, message):
    with pytest.raises(error, match=rf"^{message}"):
        parallax.fit(_model(), **{"resource_info": "not read: refused before", **arguments})


EVALUATE = [
    ("batch_size-0", dict(x=X, y=Y, batch_size=0), ValueError, r"parallax.evaluate: batch_size must be at least 1"),
    ("steps-negative", dict(x=X, y=Y, steps=-1), ValueError, r"parallax.evaluate: steps must be at least 1, got -1"),
    ("steps-str", dict(x=X, y=Y, steps="1"), TypeError, r"parallax.evaluate: steps must be an int or None"),
    ("verbose", dict(x=X, y=Y, verbose=5), ValueError, r"parallax.evaluate: verbose must be"),
    ("lengths", dict(x=X, y=Y[:1]), ValueError, r"parallax.evaluate: y must have one entry per example of x"),
    ("y-beside-a-dataset", dict(x=_dataset(), y=Y), ValueError, r"parallax.evaluate: y goes with arrays"),
]
PREDICT = [
    ("batch_size-0", dict(x=X, batch_size=0), ValueError, r"parallax.predict: batch_size must be at least 1"),
    ("steps-0", dict(x=X, steps=0), ValueError, r"parallax.predict: steps must be at least 1, got 0"),
    ("x-missing", dict(x=None), TypeError, r"parallax.predict: x is missing"),
]


@pytest.mark.parametrize("call, arguments, error, message",
                         [pytest.param(parallax.evaluate, *c[1:], id=f"evaluate-{c[0]}") for c in EVALUATE]
                         + [pytest.param(parallax.predict, *c[1:], id=f"predict-{c[0]}") for c in PREDICT])
def test_bad_input_to_evaluate_and_predict_is_refused_naming_the_argument(call, arguments, error, message):
    with pytest.raises(error, match=rf"^{message}"):
        call(_model(), **arguments)


def test_parallel_run_of_a_plain_python_function_says_to_make_it_a_tf_function():
    def train_step(x):
        return x

    with pytest.raises(TypeError, match=r"^parallel_run: single_gpu_graph must be a tf.Graph, a MetaGraphDef .* or a "
                                        r"tf.function training step, got function \(a plain Python function: decorate "
                                        r"your training step with @tf.function\)"):
        parallax.parallel_run(train_step, "resource_info")


def test_a_stateful_recurrent_layer_is_refused_naming_it_before_anything_starts(tmp_path):
    """``LSTM(stateful=True)`` behind ``Input(batch_shape=(8, 5, 3))`` carries each batch's state to the next;
    a replica's part of a batch cannot (TensorFlow failed inside the loss's gradient: "Incompatible shapes")."""
    import keras

    keras.utils.set_random_seed(0)
    inputs = keras.Input(batch_shape=(8, 5, 3))
    model = keras.Model(inputs, keras.layers.Dense(1)(keras.layers.LSTM(4, stateful=True, name="memory")(inputs)))
    model.compile("sgd", "mse")
    (tmp_path / "resource_info").write_text("localhost: cpu:0,cpu:1\n")
    with pytest.raises(ValueError, match=r"parallax.fit: memory is stateful \(stateful=True\).*train it on one device"):
        parallax.fit(model, np.zeros((16, 5, 3), np.float32), np.zeros((16, 1), np.float32), batch_size=8,
                     resource_info=str(tmp_path / "resource_info"))
