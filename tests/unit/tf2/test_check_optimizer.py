"""parallax.fit refuses, before anything starts, what a model's optimizer cannot do in the job asked for
(parallax/tf2/arguments.py: check_optimizer)."""

from __future__ import annotations

import pytest

import parallax
from parallax.tf2.arguments import check_optimizer


def _model(table: bool):
    import keras

    layers = [keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 4, name="ids"),
              keras.layers.GlobalAveragePooling1D()] if table else [keras.Input((3,))]
    model = keras.Sequential(layers + [keras.layers.Dense(1)])
    model.compile(keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), "mse")
    return model


def test_gradient_accumulation_with_a_table_is_refused_in_ps_alone():
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=2 of SGD with a table looked up by ids \(ids\) "
                                         r"is not supported with run_option='PS'.*'MPI' or 'HYBRID'"):
        check_optimizer(_model(table=True), parallax.Config(run_option="PS"))
    for run_option in ("MPI", "HYBRID", None):
        check_optimizer(_model(table=True), parallax.Config(run_option=run_option))
    check_optimizer(_model(table=False), parallax.Config(run_option="PS"))  # trains: equal to one device


def test_zero_stage_takes_keras_3_optimizers_and_refuses_tf_keras_new_ones():
    check_optimizer(_model(table=True), parallax.Config(zero_stage=1))  # element-wise updates: sharded
    import tf_keras

    model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(3,))])
    model.compile(tf_keras.optimizers.Adam(0.1), "mse")
    with pytest.raises(ValueError, match=r"zero_stage=1 shards the slots of Keras 3's optimizers and of "
                                         r"tf_keras.optimizers.legacy.\*; Adam \(tf_keras"):
        check_optimizer(model, parallax.Config(zero_stage=1))
    legacy = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(3,))])
    legacy.compile(tf_keras.optimizers.legacy.Adam(0.1), "mse")
    check_optimizer(legacy, parallax.Config(zero_stage=1))
