"""parallax.tf2.part_loss: a loss averaged over each batch's unmasked time steps is named at WARNING."""

from __future__ import annotations

import pytest

from parallax.tf2.part_loss import warn_masked_loss


def _tagger(keras, mask_zero: bool, loss):
    ids = keras.Input((5,), dtype="int32")
    states = keras.layers.LSTM(3, return_sequences=True)(keras.layers.Embedding(10, 4, mask_zero=mask_zero)(ids))
    model = keras.Model(ids, keras.layers.Dense(2)(states))
    model.compile(optimizer="sgd", loss=loss)
    return model


@pytest.mark.parametrize("mask_zero, loss, said", [
    (True, "sparse_categorical_crossentropy", "output 0 is masked"),
    (False, "ignore", "SparseCategoricalCrossentropy(ignore_class=0)"),
    (False, "sparse_categorical_crossentropy", None),
])
def test_a_loss_over_the_unmasked_steps_is_named(parallax_warnings, mask_zero, loss, said):
    import keras

    if loss == "ignore":
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    model = _tagger(keras, mask_zero, loss)
    warn_masked_loss(model, 1)
    assert parallax_warnings == []
    warn_masked_loss(model, 2)
    if said is None:
        assert parallax_warnings == []
    else:
        assert len(parallax_warnings) == 1 and said in parallax_warnings[0]
        assert "each of the 2 replicas divides by its part's" in parallax_warnings[0]


def test_tf_keras_which_divides_so_too_is_told(parallax_warnings):
    import tf_keras

    warn_masked_loss(_tagger(tf_keras, True, "sparse_categorical_crossentropy"), 2)
    assert len(parallax_warnings) == 1 and "output 0 is masked" in parallax_warnings[0]
