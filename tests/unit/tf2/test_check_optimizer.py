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


def test_zero_stage_with_an_optimizer_that_assigns_its_slots_is_refused():
    with pytest.raises(ValueError, match="zero_stage=1 shards the slots of optimizers that update through Apply"):
        check_optimizer(_model(table=False), parallax.Config(zero_stage=1))
