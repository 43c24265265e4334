"""parallax.fit refuses, before anything starts, what a model's optimizer cannot do in the job asked for
(parallax/tf2/arguments.py: check_optimizer)."""

from __future__ import annotations

import pytest

import parallax
from parallax.tf2.arguments import check_optimizer


def _model(table: bool, optimizer=None):
    import keras

    layers = [keras.Input((3,), dtype="int32"), keras.layers.Embedding(10, 4, name="ids"),
              keras.layers.GlobalAveragePooling1D()] if table else [keras.Input((3,))]
    model = keras.Sequential(layers + [keras.layers.Dense(1)])
    model.compile(optimizer or keras.optimizers.SGD(0.1, gradient_accumulation_steps=2), "mse")
    return model


def test_gradient_accumulation_with_a_table_is_refused_in_ps_alone():
    with pytest.raises(ValueError, match=r"gradient_accumulation_steps=2 of SGD with a table looked up by ids \(ids\) "
                                         r"is not supported with run_option='PS'.*'MPI' or 'HYBRID'"):
        check_optimizer(_model(table=True), parallax.Config(run_option="PS"))
    for run_option in ("MPI", "HYBRID", None):
        check_optimizer(_model(table=True), parallax.Config(run_option=run_option))
    check_optimizer(_model(table=False), parallax.Config(run_option="PS"))  # trains: equal to one device


def test_zero_stage_takes_keras_3_optimizers_and_refuses_tf_keras_new_ones():
    import keras

    for optimizer in (keras.optimizers.Adam(0.1), keras.optimizers.Lion(0.1), keras.optimizers.Ftrl(0.1)):
        check_optimizer(_model(True, optimizer), parallax.Config(zero_stage=1))  # element-wise updates: sharded
    import tf_keras

    model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(3,))])
    model.compile(tf_keras.optimizers.Adam(0.1), "mse")
    with pytest.raises(ValueError, match=r"zero_stage=1 shards the slots of Keras 3's optimizers and of "
                                         r"tf_keras.optimizers.legacy.\*; Adam \(tf_keras"):
        check_optimizer(model, parallax.Config(zero_stage=1))
    legacy = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(3,))])
    legacy.compile(tf_keras.optimizers.legacy.Adam(0.1), "mse")
    check_optimizer(legacy, parallax.Config(zero_stage=1))


@pytest.mark.parametrize("make, stage, message", [
    (lambda k: k.optimizers.Adam(0.1), 2, r"zero_stage=2 with Adam, a Keras 3 optimizer: .* use zero_stage=1"),
    (lambda k: k.optimizers.LossScaleOptimizer(k.optimizers.Adam(0.1)), 1,
     r"zero_stage=1 with LossScaleOptimizer, which skips the update on a step whose scaled gradients overflow: the "
     r"update runs inside a conditional"),
    (lambda k: None, 1, r"zero_stage=1 with SGD, which applies the gradients every 2 steps: the update runs inside "
                        r"a conditional"),  # _model's own SGD
    (lambda k: k.optimizers.Lamb(0.1), 1, r"zero_stage=1 with Lamb, whose update reads a norm of each variable"),
    (lambda k: k.optimizers.Adafactor(0.1), 1,
     r"zero_stage=1 with Adafactor, whose update reads means over each variable's rows"),
], ids=["stage-2", "loss-scaled", "accumulating", "lamb", "adafactor"])
def test_zero_stage_refuses_before_launch_a_keras_3_update_the_workers_could_not_cut(make, stage, message):
    """What each worker's rewrite refuses after launch (tests/unit/rewrite/test_zero.py), said before it."""
    import keras

    with pytest.raises(ValueError, match=message):
        check_optimizer(_model(True, make(keras)), parallax.Config(zero_stage=stage))
