"""The pure parts of the partition search."""

from __future__ import annotations

import pytest
import tensorflow as tf

import parallax
from parallax.invocation import PARTITIONS_ENV, RERUN_ENV, Invocation, SearchRequest
from parallax.tuning import search


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


def test_cache_round_trip_and_key(tmp_path):
    graph = tf.Graph()
    with graph.as_default():
        tf.constant(1.0)
    key = search.cache_key(graph, "localhost: cpu:0\n", "MPI", True)
    assert key == search.cache_key(graph, "localhost: cpu:0\n", "MPI", True)
    assert key != search.cache_key(graph, "localhost: cpu:0,cpu:1\n", "MPI", True)
    assert search.cached_count(key, str(tmp_path)) is None
    path = search.store_count(key, 4, {2: 0.01, 4: 0.008}, 1.5, str(tmp_path))
    assert search.cached_count(key, str(tmp_path)) == 4 and path == str(tmp_path / "partitions.json")


def test_the_search_takes_what_it_was_asked_from_the_invocation(monkeypatch):
    monkeypatch.setenv(RERUN_ENV, "1")  # this process's environment is not read
    assert not search.in_final_run(Invocation())
    assert search.in_final_run(Invocation(search=SearchRequest(rerun=True)))
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.get_variable("a", [10, 2], partitioner=parallax.get_partitioner(2))
    given = Invocation.from_env({PARTITIONS_ENV: "4"})  # a count given: no search, the call goes on
    assert search.partition_search(graph, "localhost: cpu:0\n", None, ("localhost/cpu:0",), given) is None


def test_bad_trial_steps():
    with pytest.raises(ValueError, match="PARALLAX_SEARCH_STEPS='five': expected 'warmup,timed'"):
        Invocation.from_env({"PARALLAX_SEARCH_STEPS": "five"})
