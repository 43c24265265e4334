"""The layout parallax tune stored: found for the same graph and resources only, handed to launched processes
(the caller gives the choice to the launcher, which puts it in their environment), and never carried from one
graph to the next in a process."""

from __future__ import annotations

import json
import os

import pytest
import tensorflow as tf

from parallax.invocation import TUNED_ENV, Invocation
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


def test_the_same_graph_and_resources_find_the_choice_and_pass_it_on(cache):
    graph, res = graph_of(3), "localhost: cpu:0,cpu:1\n"
    asked = Invocation(cache_dir=str(cache))
    store_tuned(tune_key(graph, res, True), {"run_option": "MPI", "fusion_bytes": 0}, {"step_seconds": 0.01},
                str(cache))
    choice, source = tuned_choice(graph, res, True, False, asked)
    assert choice == {"run_option": "MPI", "fusion_bytes": 0} and "tuned.json" in source
    assert TUNED_ENV not in os.environ  # the choice goes to the launcher as an argument, not into this process
    sent = Invocation.from_env(Invocation(tuned=choice).to_env())  # a launched one, as the launcher starts it
    assert tuned_choice(graph_of(9), res, True, True, sent) == (choice, TUNED_ENV)  # it reads its starter's
    assert json.loads(Invocation(tuned=choice).to_env()[TUNED_ENV]) == choice
    assert tuned_choice(graph, "localhost: cpu:0\n", True, False, asked) == (None, "")  # other resources
    off = Invocation(cache_dir=str(cache), use_tuned=False, tuned=choice)
    assert tuned_choice(graph, res, True, False, off) == (None, "") == tuned_choice(graph, res, True, True, off)


def test_another_graph_in_the_same_process_does_not_inherit_the_choice(cache):
    res, asked = "localhost: cpu:0,cpu:1\n", Invocation(cache_dir=str(cache))
    store_tuned(tune_key(graph_of(3), res, True), {"run_option": "PS"}, {}, str(cache))
    assert tuned_choice(graph_of(3), res, True, False, asked)[0] == {"run_option": "PS"}
    assert tuned_choice(graph_of(4), res, True, False, asked) == (None, "")

