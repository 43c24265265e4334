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


@pytest.mark.parametrize("options, said", [
    ({"output_sequence_length": 4}, ""),
    ({}, "RaggedTensorToTensor ("),  # each row padded to the batch's longest
    ({"output_sequence_length": 4, "ngrams": 2}, "Cast ("),  # its row partition: not followed
    ({"output_mode": "multi_hot"}, "Cast ("),
], ids=["fixed length", "longest", "ngrams", "multi_hot"])
def test_text_vectorization_to_a_fixed_length_works_row_by_row(options, said):
    layer = keras.layers.TextVectorization(max_tokens=20, **options)
    layer.adapt(["a b c", "d e"])
    got = _said(layer, tf.TensorSpec([None], tf.string))
    assert got.startswith(said) if said else got == "", got


def test_a_ragged_split_cut_to_a_fixed_length_works_row_by_row_and_its_longest_row_does_not():
    lines = tf.TensorSpec([None], tf.string)
    assert _said(lambda x: tf.strings.to_hash_bucket_fast(tf.strings.split(x), 9).to_tensor(shape=[None, 5]),
                 lines) == ""
    assert "pads each row to the batch's longest" in _said(lambda x: tf.strings.split(x).to_tensor(), lines)

    def longest_added(x):  # every row's ids plus the batch's longest row's length
        words = tf.strings.split(x)
        return tf.strings.to_hash_bucket_fast(words, 9).to_tensor(shape=[None, 5]) + words.bounding_shape()[1]

    said = _said(longest_added, lines)
    assert said.startswith(("StridedSlice (", "Cast (", "Max (")), said


def test_a_value_the_same_for_every_row_is_no_output_of_rows():
    said = _said(lambda x: (x, tf.reduce_sum(tf.ones([3]))), tf.TensorSpec([None, 3], tf.float32))
    assert "has no rows of its own" in said, said


def test_a_variables_rows_looked_up_by_rows_of_ids_work_row_by_row():
    table = tf.Variable(np.arange(12.0).reshape(6, 2))
    assert _said(lambda ids: tf.nn.embedding_lookup(table, ids) * 2.0, tf.TensorSpec([None, 3], tf.int32)) == ""
    said = _said(lambda ids: tf.gather(tf.reshape(ids, [-1, 1]) + 0, [0, 1]), tf.TensorSpec([None, 3], tf.int32))
    assert said.startswith("Reshape ("), said
