"""The pure parts of the partition search."""

from __future__ import annotations

import pytest
import tensorflow as tf

import parallax
from parallax import search
from parallax.invocation import CACHE_ENV, SEARCH_STEPS_ENV


def test_candidates_double_from_the_minimum_within_the_rows():
    assert search.candidates_from(2, 20) == [2, 4, 8, 16]
    assert search.candidates_from(3, 1_000_000) == [3, 6, 12, 24, 48, 96]  # at most MAX_TRIALS
    assert search.candidates_from(8, 4) == [8]


def test_min_partitions_reads_get_partitioner_uses():
    graph = tf.Graph()
    with graph.as_default():
        assert search.min_partitions(graph) is None
        tf.compat.v1.get_variable("a", [10, 2], partitioner=parallax.get_partitioner(3))
        tf.compat.v1.get_variable("b", [10, 2], partitioner=parallax.get_partitioner(2))
    assert search.min_partitions(graph) == 2
    assert search.partition_counts(graph) == [2, 4, 8]  # from the smallest minimum, within the 10 rows
    assert search.partition_counts(tf.Graph()) is None


def test_cache_round_trip_and_key(tmp_path, monkeypatch):
    monkeypatch.setenv(CACHE_ENV, str(tmp_path))
    graph = tf.Graph()
    with graph.as_default():
        tf.constant(1.0)
    key = search.cache_key(graph, "localhost: cpu:0\n", "MPI", True)
    assert key == search.cache_key(graph, "localhost: cpu:0\n", "MPI", True)
    assert key != search.cache_key(graph, "localhost: cpu:0,cpu:1\n", "MPI", True)
    assert search.cached_count(key) is None
    search.store_count(key, 4, {2: 0.01, 4: 0.008}, 1.5)
    assert search.cached_count(key) == 4


def test_bad_trial_steps(monkeypatch):
    monkeypatch.setenv(SEARCH_STEPS_ENV, "five")
    with pytest.raises(ValueError, match="expected 'warmup,timed'"):
        search.trial_steps()
