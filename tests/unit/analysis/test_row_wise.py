"""Whether a function of batches works row by row (parallax/analysis/row_wise.py), on the functions Keras's
preprocessing layers make, as a ``tf.data`` map after ``batch()`` calls them."""

from __future__ import annotations

import keras
import numpy as np
import pytest
import tensorflow as tf

from parallax.analysis.row_wise import row_wise


def _said(f, *specs: tf.TensorSpec) -> str:
    graph = tf.function(f).get_concrete_function(*specs).graph
    captured = {t.ref() for t in graph.internal_captures}
    return row_wise(graph, [t for t in graph.inputs if t.ref() not in captured], graph.outputs)


_IMAGES = tf.TensorSpec([None, 8, 8, 3], tf.float32)


def _normalization():
    layer = keras.layers.Normalization()
    layer.adapt(np.random.default_rng(0).random((16, 3)).astype(np.float32))
    return layer


@pytest.mark.parametrize("make, spec", [
    (lambda: keras.layers.Rescaling(1 / 255.0, offset=-0.5), _IMAGES),
    (lambda: keras.layers.CenterCrop(4, 4), _IMAGES),
    (lambda: keras.layers.Resizing(4, 4), _IMAGES),
    (lambda: keras.layers.StringLookup(vocabulary=["a", "b"]), tf.TensorSpec([None, 5], tf.string)),
    (lambda: keras.layers.IntegerLookup(vocabulary=[3, 7]), tf.TensorSpec([None], tf.int64)),
    (lambda: keras.layers.Hashing(16), tf.TensorSpec([None, 2], tf.string)),
    (_normalization, tf.TensorSpec([None, 3], tf.float32)),
], ids=["Rescaling", "CenterCrop", "Resizing", "StringLookup", "IntegerLookup", "Hashing", "Normalization"])
def test_kerass_preprocessing_layers_work_row_by_row(make, spec):
    assert _said(make(), spec) == ""


def test_text_vectorization_is_not_followed_naming_the_op():
    layer = keras.layers.TextVectorization(max_tokens=20, output_sequence_length=4)
    layer.adapt(["a b c", "d e"])
    said = _said(layer, tf.TensorSpec([None], tf.string))
    assert said.startswith("StringSplitV2 (") and "not known to keep rows apart" in said, said


def test_a_value_the_same_for_every_row_is_no_output_of_rows():
    said = _said(lambda x: (x, tf.reduce_sum(tf.ones([3]))), tf.TensorSpec([None, 3], tf.float32))
    assert "has no rows of its own" in said, said


def test_a_variables_rows_looked_up_by_rows_of_ids_work_row_by_row():
    table = tf.Variable(np.arange(12.0).reshape(6, 2))
    assert _said(lambda ids: tf.nn.embedding_lookup(table, ids) * 2.0, tf.TensorSpec([None, 3], tf.int32)) == ""
    said = _said(lambda ids: tf.gather(tf.reshape(ids, [-1, 1]) + 0, [0, 1]), tf.TensorSpec([None, 3], tf.int32))
    assert said.startswith("Reshape ("), said
