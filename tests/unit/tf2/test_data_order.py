"""Pipelines that may yield in another order at each reading are refused where several workers read them
(parallax/tf2/data_order.py)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from parallax.tf2.data_order import check_ordered, unordered


def _unordered_options(dataset: tf.data.Dataset) -> tf.data.Dataset:
    options = tf.data.Options()
    options.deterministic = False
    return dataset.with_options(options)


def test_a_pipeline_in_order_is_taken_as_it_is():
    dataset = tf.data.Dataset.range(8).map(lambda x: x + 1, num_parallel_calls=2).batch(2).prefetch(1)
    assert unordered(dataset) == []
    check_ordered(dataset, 2, "parallax.fit", "x")


@pytest.mark.parametrize("make, found", [
    (lambda d: d.map(lambda x: x + 1, num_parallel_calls=2, deterministic=False).batch(2), "ParallelMapDatasetV2"),
    (lambda d: d.interleave(lambda x: tf.data.Dataset.range(x), num_parallel_calls=2, deterministic=False),
     "ParallelInterleaveDatasetV4"),
    (lambda d: d.batch(3, num_parallel_calls=2, deterministic=False), "ParallelBatchDataset"),
    (lambda d: _unordered_options(d.map(lambda x: x, num_parallel_calls=2)), "options().deterministic = False"),
], ids=["map", "interleave", "batch", "options"])
def test_a_pipeline_that_yields_as_its_work_ends_is_refused_on_several_workers(make, found):
    dataset = make(tf.data.Dataset.range(8))
    assert unordered(dataset) == [found]
    check_ordered(dataset, 1, "parallax.fit", "x")  # one worker reads it alone: any order is one device's
    with pytest.raises(ValueError, match=rf"^parallax.fit: validation_data is a dataset that yields its elements in "
                                         rf"the order their work ends \({found.replace('(', '.').replace(')', '.')}\):"
                                         r" each of the 2 workers would read them in another order"):
        check_ordered(dataset, 2, "parallax.fit", "validation_data")
