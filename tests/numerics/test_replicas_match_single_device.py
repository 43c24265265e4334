"""N in-graph replicas on virtual CPU devices train exactly like one device on the union batch."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import parallax
from tests.conftest import cpu_resources
from tests.models import batches, build_embedding, build_mlp, train_single_device

STEPS = 4
BATCH = 8  # union batch, split evenly over the replicas
BUILDERS = {"mlp": build_mlp, "embedding": build_embedding}


def train_parallel(model, data, resource_path, config=None):
    sess, num_workers, worker_id, num_replicas = parallax.parallel_run(
        model.graph, resource_path, parallax_config=config or parallax.Config(run_option="PS", average_sparse=True))
    assert (num_workers, worker_id) == (1, 0)
    for feed in data:
        sess.run(model.train_op, feed_dict={model.inputs[k]: np.split(v, num_replicas)
                                            for k, v in feed.items()})
    variables = model.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    values = sess.run(variables)
    sess.close()
    return {v.op.name: value for v, value in zip(variables, values)}, num_replicas


def assert_same_variables(expected, got, num_replicas):
    assert set(expected) == set(got)
    for name, value in expected.items():
        assert len(got[name]) == num_replicas, name
        for replica_value in got[name]:
            np.testing.assert_allclose(replica_value, value, rtol=1e-5, atol=1e-6, err_msg=name)


@pytest.mark.slow
@pytest.mark.parametrize("num_replicas", [1, 2, 4])
@pytest.mark.parametrize("optimizer", ["gd", "momentum", "adam", "adagrad"])
@pytest.mark.parametrize("model_name", ["mlp", "embedding"])
def test_replicas_leave_every_variable_equal_to_single_device(resource_file, model_name, optimizer,
                                                               num_replicas):
    data = batches(model_name, STEPS, BATCH)
    expected = train_single_device(BUILDERS[model_name](optimizer), data)
    got, n = train_parallel(BUILDERS[model_name](optimizer), data, cpu_resources(resource_file, num_replicas))
    assert n == num_replicas
    assert_same_variables(expected, got, num_replicas)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["rmsprop", "adadelta", "ftrl"])
@pytest.mark.parametrize("model_name", ["mlp", "embedding"])
def test_other_optimizers_match_single_device(resource_file, model_name, optimizer):
    data = batches(model_name, STEPS, BATCH)
    expected = train_single_device(BUILDERS[model_name](optimizer), data)
    got, n = train_parallel(BUILDERS[model_name](optimizer), data, cpu_resources(resource_file, 2))
    assert_same_variables(expected, got, n)


@pytest.mark.slow
@pytest.mark.parametrize("optimizer", ["gd", "adam"])
@pytest.mark.parametrize("model_name", ["mlp", "embedding"])
def test_ref_variables_match_single_device(resource_file, model_name, optimizer):
    data = batches(model_name, STEPS, BATCH)
    expected = train_single_device(BUILDERS[model_name](optimizer, resource=False), data)
    got, n = train_parallel(BUILDERS[model_name](optimizer, resource=False), data,
                            cpu_resources(resource_file, 2))
    assert_same_variables(expected, got, n)


@pytest.mark.slow
def test_without_global_step_matches_single_device(resource_file):
    data = batches("mlp", STEPS, BATCH)
    expected = train_single_device(build_mlp("momentum", global_step=False), data)
    got, n = train_parallel(build_mlp("momentum", global_step=False), data, cpu_resources(resource_file, 2))
    assert_same_variables(expected, got, n)


@pytest.mark.slow
@pytest.mark.parametrize("clip", [100.0, 0.05], ids=["loose", "binding"])
@pytest.mark.parametrize("model_name, optimizer", [("embedding", "adam"), ("mlp", "gd"), ("embedding", "adagrad")])
@pytest.mark.parametrize("num_replicas", [2, 4])
def test_clip_by_global_norm_matches_single_device(resource_file, model_name, optimizer, clip, num_replicas):
    """Clipping runs once, on the aggregated gradient, as on one device (even when it binds)."""
    data = batches(model_name, STEPS, BATCH)
    expected = train_single_device(BUILDERS[model_name](optimizer, clip=clip), data)
    got, n = train_parallel(BUILDERS[model_name](optimizer, clip=clip), data,
                            cpu_resources(resource_file, num_replicas))
    assert_same_variables(expected, got, n)


@pytest.mark.slow
@pytest.mark.parametrize("num_replicas", [2, 4])
def test_sparse_gradients_are_summed_by_default(resource_file, num_replicas):
    """Seed semantics: without average_sparse, a sparse variable gets the sum of the
    replicas' gradients, i.e. num_replicas times the union-batch mean gradient."""
    data = batches("embedding", STEPS, BATCH)
    expected = train_single_device(build_embedding("gd", dense_part=False, lr_scale=num_replicas), data)
    got, n = train_parallel(build_embedding("gd", dense_part=False), data,
                            cpu_resources(resource_file, num_replicas),
                            config=parallax.Config(run_option="PS", average_sparse=False))
    assert_same_variables(expected, got, n)


@pytest.mark.slow
@pytest.mark.parametrize("partitions, loop", [(3, False), (None, True), (2, True)],
                         ids=["partitioned", "while-loop-rnn", "partitioned-rnn"])
def test_sequence_models_match_single_device(resource_file, partitions, loop):
    from tests.models import build_sequence, sequence_batches

    data = sequence_batches(STEPS, BATCH)
    expected = train_single_device(build_sequence("adam", partitions, loop), data)
    if partitions:
        assert f"embedding/part_{partitions - 1}" in expected
    got, n = train_parallel(build_sequence("adam", partitions, loop), data, cpu_resources(resource_file, 2))
    assert_same_variables(expected, got, n)


@pytest.mark.parametrize("optimizer", ["gd", "adagrad"])
def test_static_batch_shapes_with_several_replicas(resource_file, optimizer):
    """Placeholders with a fixed batch: the joined sparse gradient has twice the rows the
    single-device graph recorded for its update ops (their shapes are inferred again)."""
    def build(rows):
        graph = tf.Graph()
        with graph.as_default():
            ids = tf.compat.v1.placeholder(tf.int64, [rows, 2], name="ids")
            emb = tf.compat.v1.get_variable("emb", [10, 3], initializer=tf.compat.v1.constant_initializer(
                np.arange(30, dtype=np.float32).reshape(10, 3) / 30))
            loss = tf.reduce_sum(tf.nn.embedding_lookup(emb, ids))
            cls = {"gd": tf.compat.v1.train.GradientDescentOptimizer,
                   "adagrad": tf.compat.v1.train.AdagradOptimizer}[optimizer]
            train = cls(0.1).minimize(loss)
        return graph, ids, emb, train

    graph, ids, emb, train = build(4)
    feeds = [np.array([[1, 2], [3, 4]]), np.array([[1, 1], [5, 6]])]
    with tf.compat.v1.Session(graph=graph) as sess:  # one device, the union batch (the loss is a sum)
        sess.run(tf.compat.v1.global_variables_initializer())
        sess.run(train, {ids: np.concatenate(feeds)})
        expected = sess.run(emb)
    graph, ids, emb, train = build(2)
    sess, _, _, n = parallax.parallel_run(graph, cpu_resources(resource_file, 2),
                                          parallax_config=parallax.Config(run_option="PS"))
    sess.run(train, feed_dict={ids: feeds})
    np.testing.assert_allclose(sess.run(emb)[0], expected, rtol=1e-6)
    sess.close()
