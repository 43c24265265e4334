"""How the analysis reads an embedding's gradient by how the table is looked up (parallax/analysis/): by the
batch's ids (sparse rows, gathered), by indices every replica shares (a ``range`` of positions: rows aggregated
elementwise, as a dense tensor of their shape), by both (refused where the update squares rows), and with a
regulariser beside the lookup (dense). Traced from Keras 3 ``tf.function`` steps, without processes."""

from __future__ import annotations

import pytest
import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.errors import AnalysisError
from parallax.tf2.trace import trace_step

MAXLEN, VOCAB, WIDTH = 5, 11, 3


def _step(lookup: str, optimizer: str = "adam"):
    import keras

    keras.utils.set_random_seed(0)
    tokens = keras.layers.Embedding(VOCAB, WIDTH, name="tokens",
                                    embeddings_regularizer="l2" if lookup == "regularised" else None)
    positions = keras.layers.Embedding(MAXLEN, WIDTH, name="positions")
    head = keras.layers.Dense(1, name="head")
    opt = keras.optimizers.get(optimizer)

    def forward(ids):
        if lookup == "positions":
            return tokens(ids) + positions(keras.ops.arange(0, MAXLEN))
        if lookup == "positions-from-shape":  # the length read off the batch, as keras-io's layer does
            return tokens(ids) + positions(keras.ops.arange(0, keras.ops.shape(ids)[-1]))
        if lookup == "ids-and-range":  # one table looked up by the batch and by positions
            return tokens(ids) + tokens(keras.ops.arange(0, MAXLEN))
        if lookup == "twice-by-ids":
            return tokens(ids) + tokens(keras.ops.flip(ids, axis=1))
        return tokens(ids)

    @tf.function(input_signature=[tf.TensorSpec([None, MAXLEN], tf.int32), tf.TensorSpec([None, 1], tf.float32)])
    def step(ids, y):
        with tf.GradientTape() as tape:
            out = head(keras.ops.mean(forward(ids), axis=1))
            loss = keras.ops.mean((out - y) ** 2) + sum(tokens.losses)
        variables = tokens.trainable_variables + positions.trainable_variables + head.trainable_variables
        variables = [v for v in variables if v.trainable]
        grads = tape.gradient(loss, variables)
        opt.apply_gradients([(g, v) for g, v in zip(grads, variables) if g is not None])
        return loss

    tokens.build((None, MAXLEN))
    positions.build((MAXLEN,))
    head.build((None, WIDTH))
    return step


def _gradients(lookup: str, optimizer: str = "adam") -> dict:
    traced = trace_step(_step(lookup, optimizer))
    analysis = analyse_graph(traced.graph)
    return {g.variable.split("/")[0]: g for g in analysis.gradients}


@pytest.mark.parametrize("lookup", ["positions", "positions-from-shape"])
def test_positions_looked_up_with_a_range_are_rows_every_replica_shares_aggregated_elementwise(lookup):
    grads = _gradients(lookup)
    assert not grads["positions"].sparse and grads["positions"].shape == (MAXLEN, WIDTH)
    assert grads["tokens"].sparse and grads["tokens"].shape is None  # the batch's ids: rows gathered


def test_a_table_looked_up_twice_by_the_batch_stays_sparse():
    assert _gradients("twice-by-ids")["tokens"].sparse


def test_a_table_looked_up_by_the_batch_and_by_a_range_is_refused_where_the_update_squares_its_rows():
    with pytest.raises(AnalysisError, match=r'^the gradient of "tokens.*" gathers rows of several lookups, some by '
                                            r"the batch and some by indices every replica computes alike"):
        _gradients("ids-and-range", "adam")


def test_a_table_with_a_regulariser_has_a_dense_gradient():
    grads = _gradients("regularised")
    assert not grads["tokens"].sparse and grads["tokens"].shape is None
