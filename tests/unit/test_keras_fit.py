"""parallax.fit's own checks and its batches (parallax/tf2/fit.py), without processes."""

from __future__ import annotations

import numpy as np
import pytest

import parallax
from parallax.tf2.fit import _Batches, parts


def test_a_model_that_is_not_compiled_is_refused_saying_what_to_do():
    import keras

    model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"^parallax.fit: the model is not compiled; call model.compile\("):
        parallax.fit(model, np.zeros((4, 2)), np.zeros((4, 1)), resource_info="unused")


def test_something_other_than_a_keras_3_model_is_refused():
    with pytest.raises(TypeError, match=r"^parallax.fit: model must be a Keras 3 model \(keras.Model\), got str"):
        parallax.fit("model", np.zeros((4, 2)), np.zeros((4, 1)), resource_info="unused")


def test_each_replica_takes_its_equal_part_of_each_global_batch():
    batch = {"ids": np.arange(12).reshape(6, 2), "mask": np.arange(6)}
    mine = parts(batch, 3, 1, 1)  # worker 1 of 3
    np.testing.assert_array_equal(mine[0]["mask"], [2, 3])
    two = parts(np.arange(8), 2, 1, 2)  # worker 1 of 2, 2 replicas each: parts 2 and 3 of 4
    np.testing.assert_array_equal(two[0], [4, 5])
    np.testing.assert_array_equal(two[1], [6, 7])


def test_the_epochs_are_batches_in_order_or_one_seeded_permutation_each_and_a_ragged_end_is_left_out(caplog):
    x, y = np.arange(10)[:, None], np.arange(10)[:, None]
    ordered = _Batches(x, y, 4, shuffle=False, seed=0, steps_per_epoch=None)
    cut = [b[0][:, 0].tolist() for b in ordered.epoch(0, 2)]
    assert cut == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]  # the last batch splits into 2 parts: kept
    assert [b[0][:, 0].tolist() for b in ordered.epoch(0, 4)] == [[0, 1, 2, 3], [4, 5, 6, 7]]  # 2 of 4: left out
    assert "the last 2 example(s) of each epoch do not split into 4 equal parts" in caplog.text
    shuffled = _Batches(x, y, 5, shuffle=True, seed=3, steps_per_epoch=None)
    order = np.random.RandomState(3 + 1).permutation(10)
    assert [b[0][:, 0].tolist() for b in shuffled.epoch(1, 1)] == [order[:5].tolist(), order[5:].tolist()]
