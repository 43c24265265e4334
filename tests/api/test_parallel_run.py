"""parallel_run and the session it returns, in one process with virtual CPU devices."""

from __future__ import annotations

import collections
import os

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.errors import LaunchError, ResourceFileError
from tests.conftest import cpu_resources
from tests.models import build_mlp


def in_process() -> parallax.Config:
    """One worker line with several devices trains in this process (in-graph replicas) with
    run_option='PS' (no server needed); HYBRID and MPI would start one process per device."""
    return parallax.Config(run_option="PS")


def small_graph():
    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.placeholder(tf.float32, shape=[], name="a")
        lr = tf.compat.v1.placeholder_with_default(0.1, [], name="lr")
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
        x = tf.add(a, a, name="x")
        loss = tf.square(w * a, name="loss")
        step = tf.compat.v1.train.get_or_create_global_step()
        train = tf.compat.v1.train.GradientDescentOptimizer(lr).minimize(loss, global_step=step)
    return graph, {"a": a, "lr": lr, "w": w, "x": x, "loss": loss, "train": train, "step": step}


@pytest.fixture
def three_replicas(resource_file):
    graph, t = small_graph()
    sess, num_workers, worker_id, num_replicas = parallax.parallel_run(graph, cpu_resources(resource_file, 3),
                                                                       parallax_config=in_process())
    yield sess, t, (num_workers, worker_id, num_replicas)
    sess.close()


def test_seed_example_fetch_gives_one_value_per_replica(three_replicas):
    sess, t, counts = three_replicas
    assert counts == (1, 0, 3)
    assert sess.run(t["x"], feed_dict={t["a"]: [1.0, 2.0, 3.0]}) == [2.0, 4.0, 6.0]


def test_names_work_like_tensors_and_ops(three_replicas):
    sess, t, _ = three_replicas
    assert sess.run("x:0", feed_dict={"a:0": [1.0, 2.0, 3.0]}) == [2.0, 4.0, 6.0]
    assert sess.run("x:0", feed_dict={"a": [1.0, 1.0, 1.0]}) == [2.0, 2.0, 2.0]
    assert sess.run(t["train"].name, feed_dict={t["a"]: [1.0, 1.0, 1.0]}) == [None, None, None]


def test_nested_fetches_keep_their_structure(three_replicas):
    sess, t, _ = three_replicas
    Pair = collections.namedtuple("Pair", "x loss")
    feed = {t["a"]: [1.0, 2.0, 3.0]}
    out = sess.run({"pair": Pair(t["x"], t["loss"]), "list": [t["x"], (t["train"],)]}, feed_dict=feed)
    assert isinstance(out["pair"], Pair)
    assert out["pair"].x == [2.0, 4.0, 6.0]
    assert out["list"][1] == ([None, None, None],)


def test_shared_tensors_are_fetched_once_and_repeated(three_replicas):
    sess, t, _ = three_replicas
    sess.run(t["train"], feed_dict={t["a"]: [1.0, 2.0, 3.0]})
    steps = sess.run(t["step"])
    assert steps == [1, 1, 1]
    w = sess.run(t["w"])  # a tf.Variable of the single-device graph
    # mean of d(w^2 a^2)/dw = 2 w a^2 over replicas: 2 * (1 + 4 + 9) / 3
    np.testing.assert_allclose(w, [1.0 - 0.1 * 2 * 14 / 3] * 3, rtol=1e-6)


@pytest.mark.parametrize("value, pattern", [
    ([1.0, 2.0], r"feed for 'a:0' must be a list \(or an ndarray whose first axis is the replicas\) with one value "
                 r"per replica \(3 replicas on this worker\), got a list of 2"),
    (np.array([1.0, 2.0]), r"got an ndarray of shape \(2,\)"),
    (1.0, r"got float"),
])
def test_wrong_feeds_are_clear_errors(three_replicas, value, pattern):
    sess, t, _ = three_replicas
    with pytest.raises(ValueError, match=pattern):
        sess.run(t["x"], feed_dict={t["a"]: value})


def test_make_callable_runs_like_run_and_checks_names_at_once(three_replicas):
    sess, t, _ = three_replicas
    double = sess.make_callable(t["x"], [t["a"]])
    assert double([1.0, 2.0, 3.0]) == [2.0, 4.0, 6.0]
    with pytest.raises(TypeError, match=r"takes 1 feed values \(one per feed_list entry\), got 2"):
        double([1.0] * 3, [2.0] * 3)
    with pytest.raises(ValueError, match=r"fetch 'nope:0' is not in the single-device graph"):
        sess.make_callable("nope:0")


def test_partial_run_is_refused_with_the_reason(three_replicas):
    sess, t, _ = three_replicas
    with pytest.raises(NotImplementedError, match=r"does not support partial_run: every worker must run whole "
                                                  r"steps together"):
        sess.partial_run_setup([t["x"]], [t["a"]])


def test_an_ndarray_whose_first_axis_is_the_replicas_feeds_one_row_each_as_in_the_original(three_replicas):
    sess, t, _ = three_replicas
    assert sess.run(t["x"], feed_dict={t["a"]: np.array([1.0, 2.0, 3.0])}) == [2.0, 4.0, 6.0]


def test_a_shared_placeholder_also_takes_one_plain_value_as_in_the_original(three_replicas):
    sess, t, _ = three_replicas
    sess.run(t["train"], feed_dict={t["a"]: [1.0, 1.0, 1.0], t["lr"]: 0.0})
    assert sess.run(t["w"]) == [1.0, 1.0, 1.0]  # learning rate 0: unchanged


def test_shared_placeholder_takes_equal_values(three_replicas):
    sess, t, _ = three_replicas
    sess.run(t["train"], feed_dict={t["a"]: [1.0, 1.0, 1.0], t["lr"]: [0.0, 0.0, 0.0]})
    assert sess.run(t["w"]) == [1.0, 1.0, 1.0]  # learning rate 0: unchanged
    with pytest.raises(ValueError, match=r"'lr:0' is shared by all replicas"):
        sess.run(t["train"], feed_dict={t["a"]: [1.0, 1.0, 1.0], t["lr"]: [0.1, 0.2, 0.3]})


def test_unknown_names_and_foreign_graphs_are_refused(three_replicas):
    sess, t, _ = three_replicas
    with pytest.raises(ValueError, match=r"fetch 'nope:0' is not in the single-device graph"):
        sess.run("nope:0")
    other = tf.Graph()
    with other.as_default():
        c = tf.constant(1.0, name="c")
    with pytest.raises(ValueError, match=r"belongs to another graph"):
        sess.run(c)
    with pytest.raises(TypeError, match=r"fetch must be an op, a tensor or a name"):
        sess.run(3)


def test_bad_arguments(resource_file):
    graph, _ = small_graph()
    path = cpu_resources(resource_file, 1)
    with pytest.raises(TypeError, match="single_gpu_graph must be a tf.Graph"):
        parallax.parallel_run(42, path)
    with pytest.raises(TypeError, match="resource_info must be the path"):
        parallax.parallel_run(graph, 3)
    if "SLURM_JOB_ID" not in os.environ:  # None means the Slurm allocation, outside one a clear error
        with pytest.raises(ResourceFileError, match="no resource file given"):
            parallax.parallel_run(graph, None)
    with pytest.raises(TypeError, match="sync must be True or False"):
        parallax.parallel_run(graph, path, sync="yes")
    with pytest.raises(TypeError, match="parallax_config must be a parallax.Config"):
        parallax.parallel_run(graph, path, parallax_config={"run_option": "PS"})
    with pytest.raises(ValueError, match=r"sync=False needs run_option='PS'"):
        parallax.parallel_run(graph, path, sync=False, parallax_config=parallax.Config(run_option="MPI"))


def test_resource_problems_name_the_file_and_line(resource_file):
    graph, _ = small_graph()
    with pytest.raises(ResourceFileError, match=r"line 2: .* GPU ids must be integers"):
        parallax.parallel_run(graph, resource_file("localhost: cpu:0\nlocalhost: 1,a\n"))
    if not tf.config.list_physical_devices("GPU"):
        path = resource_file("# gpus\nlocalhost: 0,1\n")
        with pytest.raises(LaunchError, match=rf"{path}, line 2: lists GPU 0 of localhost, but TensorFlow sees "
                                              r"0 GPU\(s\).*cpu:<n>"):
            parallax.parallel_run(graph, path)


def test_a_graph_without_training_op_runs_forward_on_every_replica_as_the_seed_api_shows(resource_file):
    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [])
        x = tf.add(a, a)
    sess, num_workers, worker_id, replicas = parallax.parallel_run(graph, cpu_resources(resource_file, 3),
                                                                   parallax_config=in_process())
    assert (num_workers, worker_id, replicas) == (1, 0, 3)
    assert sess.run(x, feed_dict={a: [1.0, 2.0, 3.0]}) == [2.0, 4.0, 6.0]
    sess.close()


def test_bare_local_host_runs_one_replica_per_gpu_or_one_on_the_cpu(resource_file):
    """In one process (PS): every GPU of the host as an in-graph replica. (MPI and HYBRID run a
    process per GPU, tests/unit/job/test_plan.py.)"""
    graph, t = small_graph()
    sess, _, _, num_replicas = parallax.parallel_run(graph, resource_file("localhost\n"), parallax_config=in_process())
    assert num_replicas == max(1, len(tf.config.list_physical_devices("GPU")))
    sess.close()


def test_one_worker_alone_warns_of_each_setting_it_does_not_use_and_not_of_defaults(resource_file,
                                                                                      parallax_warnings):
    graph, t = small_graph()
    cfg = parallax.Config(run_option="PS", communication_config=parallax.CommunicationConfig(
        ps_config=parallax.PSConfig(local_aggregation=False)))
    parallax.parallel_run(graph, cpu_resources(resource_file, 2), sync=False, parallax_config=cfg)[0].close()
    assert parallax_warnings == [
        "Parallax: one worker trains alone here (the local layout): nothing crosses workers, so these settings are "
        "not used: sync=False (its replicas average their gradients in every step, in-graph), "
        "PSConfig.local_aggregation=False"]
    parallax_warnings.clear()
    graph, t = small_graph()
    parallax.parallel_run(graph, cpu_resources(resource_file, 2), parallax_config=in_process())[0].close()
    assert parallax_warnings == []


def test_meta_graph_file_is_accepted(resource_file, tmp_path):
    model = build_mlp("adam")
    path = str(tmp_path / "model.meta")
    with model.graph.as_default():
        tf.compat.v1.train.export_meta_graph(path)
    sess, _, _, n = parallax.parallel_run(path, cpu_resources(resource_file, 2), parallax_config=in_process())
    losses = sess.run("loss:0", feed_dict={"x:0": [np.ones((2, 4), np.float32)] * 2,
                                           "y:0": [np.ones((2, 1), np.float32)] * 2})
    assert len(losses) == n == 2 and losses[0] == losses[1]
    sess.close()


def test_sharded_dataset_gives_each_replica_its_own_part(resource_file):
    graph = tf.Graph()
    with graph.as_default():
        ds = parallax.shard.shard(tf.data.Dataset.range(8).batch(2))
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        batch = tf.cast(it.get_next(), tf.float32, name="batch")
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.zeros_initializer())
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(batch * w))
    sess, _, _, n = parallax.parallel_run(graph, cpu_resources(resource_file, 2), parallax_config=in_process())
    sess.run(it.initializer)
    first = sess.run(batch)
    second = sess.run(batch)
    assert [list(v) for v in first] == [[0, 1], [2, 3]]
    assert [list(v) for v in second] == [[4, 5], [6, 7]]
    sess.close()


def test_a_one_shot_iterator_with_shard_gives_each_replica_its_own_part_as_in_the_original(resource_file):
    graph = tf.Graph()
    with graph.as_default():
        ds = parallax.shard.shard(tf.data.Dataset.range(8).batch(2))
        batch = tf.cast(tf.compat.v1.data.make_one_shot_iterator(ds).get_next(), tf.float32, name="batch")
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.zeros_initializer())
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(batch * w))
    sess, _, _, n = parallax.parallel_run(graph, cpu_resources(resource_file, 2), parallax_config=in_process())
    assert [list(v) for v in sess.run(batch)] == [[0, 1], [2, 3]]
    assert [list(v) for v in sess.run(batch)] == [[4, 5], [6, 7]]
    sess.close()


def test_keras_dense_layers_on_placeholders(resource_file):
    """Keras 3 layers build resource variables in a v1 graph; the result still matches."""
    def build():
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.set_random_seed(3)
            x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
            y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
            layer = tf.keras.layers.Dense(1, kernel_initializer="ones")
            loss = tf.reduce_mean(tf.square(layer(x) - y))
            train = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss)
        return graph, x, y, train
    rng = np.random.RandomState(0)
    xs, ys = rng.randn(8, 4).astype(np.float32), rng.randn(8, 1).astype(np.float32)
    graph, x, y, train = build()
    with graph.as_default(), tf.compat.v1.Session() as s:
        s.run(tf.compat.v1.global_variables_initializer())
        for _ in range(3):
            s.run(train, {x: xs, y: ys})
        variables = graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)
        expected = s.run(variables)
    graph, x, y, train = build()
    sess, _, _, n = parallax.parallel_run(graph, cpu_resources(resource_file, 2), parallax_config=in_process())
    for _ in range(3):
        sess.run(train, {x: np.split(xs, 2), y: np.split(ys, 2)})
    got = sess.run(graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES))
    for e, g in zip(expected, got):
        np.testing.assert_allclose(g[0], e, rtol=1e-5, atol=1e-6)
    sess.close()


def test_two_jobs_one_after_the_other_in_one_process_each_train_as_their_own(resource_file, tmp_path, capfd):
    """Nothing a first in-process job leaves behind (a tee of the output, bound functions, a
    cached server) changes a second one with other devices and another output directory."""
    results = []
    for replicas, logs in ((2, tmp_path / "first"), (3, tmp_path / "second")):
        graph, t = small_graph()
        cfg = parallax.Config(run_option="PS", redirect_path=str(logs))
        sess, num_workers, worker_id, num_replicas = parallax.parallel_run(
            graph, cpu_resources(resource_file, replicas), parallax_config=cfg)
        with sess:
            sess.run(t["train"], feed_dict={t["a"]: [float(r + 1) for r in range(replicas)]})
            os.write(1, f"job with {replicas} replicas trained\n".encode())  # the tee works on the descriptors
            results.append(((num_workers, worker_id, num_replicas), sess.run(t["w"])[0]))
        os.write(1, b"after the job\n")
    # mean over replicas of d(w^2 a^2)/dw = 2 w a^2, from w = 1 with lr 0.1
    assert results[0][0] == (1, 0, 2) and results[1][0] == (1, 0, 3)
    np.testing.assert_allclose(results[0][1], 1.0 - 0.1 * 2 * (1 + 4) / 2, rtol=1e-6)
    np.testing.assert_allclose(results[1][1], 1.0 - 0.1 * 2 * (1 + 4 + 9) / 3, rtol=1e-6)
    first, second = ((tmp_path / d / "worker_0.stdout").read_text() for d in ("first", "second"))
    assert "job with 2 replicas trained" in first and "3 replicas" not in first
    assert "job with 3 replicas trained" in second and "2 replicas" not in second
    assert "after the job" not in first + second  # each tee ended with its session
    assert capfd.readouterr().out.count("after the job") == 2


def test_parallel_run_embeds_in_a_program_twice_in_a_try_block_and_ends_nothing(resource_file):
    """A notebook's or a test's calls: a graph and a tf.function step, each trained alone in this process,
    return their sessions and raise nothing, SystemExit included, from the call or the session."""
    def step_of(w):
        @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
        def step(a):
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(w * a))
            w.assign_sub(0.1 * tape.gradient(loss, w))
            return loss
        return step

    ended = []
    try:
        for _ in range(2):
            graph, t = small_graph()
            sess, *_ = parallax.parallel_run(graph, cpu_resources(resource_file, 2), parallax_config=in_process())
            with sess:
                sess.run(t["train"], feed_dict={t["a"]: [1.0, 2.0]})
            w = tf.Variable(1.0)
            step, *_ = parallax.parallel_run(step_of(w), cpu_resources(resource_file, 1), parallax_config=in_process())
            step([np.array([1.0, 2.0], np.float32)])
            step.close()
    except BaseException as e:  # noqa: BLE001 - what escapes is the finding
        ended.append(e)
    assert not ended, ended
