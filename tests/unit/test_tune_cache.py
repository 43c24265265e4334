"""The layout parallax tune stored: found for the same graph and resources only, handed to launched processes
through the environment, and never carried from one graph to the next in a process."""

from __future__ import annotations

import json
import os

import pytest
import tensorflow as tf

from parallax.invocation import TUNED_ENV, USE_TUNED_ENV
from parallax.tuning.cache import store_tuned, tune_key, tuned_choice


def graph_of(width: int) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.get_variable("w", [width])
    return graph


@pytest.fixture
def cache(tuned_cache):
    """The cache these tests store in and read, stored tunes on (the suite turns them off elsewhere)."""
    return tuned_cache


def test_the_same_graph_and_resources_find_the_choice_and_pass_it_on(cache, monkeypatch):
    graph, res = graph_of(3), "localhost: cpu:0,cpu:1\n"
    store_tuned(tune_key(graph, res, True), {"run_option": "MPI", "fusion_bytes": 0}, {"step_seconds": 0.01})
    choice, source = tuned_choice(graph, res, True, launched=False)
    assert choice == {"run_option": "MPI", "fusion_bytes": 0} and "tuned.json" in source
    assert json.loads(os.environ[TUNED_ENV]) == choice  # for the processes it launches
    assert tuned_choice(graph_of(9), res, True, launched=True)[0] == choice  # a launched one reads its starter's
    assert tuned_choice(graph, "localhost: cpu:0\n", True, launched=False) == (None, "")  # other resources
    assert TUNED_ENV not in os.environ  # ... and nothing left for a later job's processes
    monkeypatch.setenv(USE_TUNED_ENV, "0")
    assert tuned_choice(graph, res, True, launched=False) == (None, "")


def test_another_graph_in_the_same_process_does_not_inherit_the_choice(cache):
    res = "localhost: cpu:0,cpu:1\n"
    store_tuned(tune_key(graph_of(3), res, True), {"run_option": "PS"}, {})
    assert tuned_choice(graph_of(3), res, True, launched=False)[0] == {"run_option": "PS"}
    assert tuned_choice(graph_of(4), res, True, launched=False) == (None, "")

