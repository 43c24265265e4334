"""Layers that normalise by their batch's statistics (parallax/analysis/batch_statistics.py): found in the graph of
every front end, said at WARNING in the job's notes when several replicas each normalise their own part (a layer
that synchronises its statistics: tests/unit/tf2/test_replica_sums.py)."""

from __future__ import annotations

import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.config import Config
from parallax.job.plan import make_job_plan
from parallax.job.settings import derive
from parallax.resources.files import parse_resource_text
from parallax.tf2.trace import trace_step
from tests.tf2.programs import squared_error_step

NOTE = "batch statistics (batch normalisation)"


def _keras_step(**norm):
    import keras

    return _step_of(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3),
                                      keras.layers.BatchNormalization(name="norm", **norm), keras.layers.Dense(1)]))


def _step_of(model, keras=None):
    """A training step of ``model`` (SGD of ``keras``, Keras 3 by default; a mean squared error), and the model."""
    if keras is None:
        import keras
    optimizer = (keras.optimizers.legacy.SGD if keras.__name__ == "tf_keras" else keras.optimizers.SGD)(0.1)
    return squared_error_step(model, optimizer), model


def _notes(graph, resources: str) -> tuple[str, ...]:
    cluster = parse_resource_text(resources)
    analysis = analyse_graph(graph)
    return make_job_plan(cluster, derive(Config(run_option="MPI"), True, cluster, gpus=0), analysis).notes


def test_a_keras_batch_norm_is_named_in_a_warning_when_several_replicas_each_normalise_their_part():
    graph = trace_step(_keras_step()[0]).graph
    (layer,) = analyse_graph(graph).batch_statistics  # the layer's scope in the traced step: sequential_1/norm_1
    assert layer.split("/")[-1].startswith("norm")
    notes = [n for n in _notes(graph, "localhost: cpu:0,cpu:1\n") if n.startswith(NOTE)]
    assert len(notes) == 1 and f"{layer} normalises each example" in notes[0]
    assert "each of the 2 replicas normalises its own part" in notes[0] and "LayerNormalization" in notes[0]
    assert "synchronise the statistics (parallax.Config(sync_batch_norm=True)" in notes[0]
    assert not [n for n in _notes(graph, "localhost: cpu:0\n") if n.startswith(NOTE)]  # one replica


def test_a_tf1_fused_batch_norm_is_found_too():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2, 2, 3])
        scale, offset = tf.Variable(tf.ones([3])), tf.Variable(tf.zeros([3]))
        with tf.name_scope("block1/bn"):
            y, _, _ = tf.compat.v1.nn.fused_batch_norm(x, scale, offset, is_training=True)
        loss = tf.reduce_mean(y)
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss)
    assert analyse_graph(graph).batch_statistics == ("block1/bn",)


def test_layer_normalisation_normalises_each_example_by_its_own_statistics_and_is_not_named():
    import keras

    step, _ = _step_of(keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), keras.layers.LayerNormalization(),
                                         keras.layers.Dense(1)]))
    assert analyse_graph(trace_step(step).graph).batch_statistics == ()
