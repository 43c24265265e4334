import pytest
import tensorflow as tf

import parallax
from parallax.errors import RewriteError
from parallax.rewrite.classify import classify
from parallax.rewrite.replicate import replicate_graph
from tests.models import build_embedding, build_mlp
from tests.unit.rewrite.helpers import export, nodes_of, plan_for


def test_does_not_modify_its_input():
    model = build_mlp("adam")
    meta = export(model.graph)
    before = meta.SerializeToString(deterministic=True)
    plan, task = plan_for(model, 3)
    replicate_graph(meta, plan, task)
    assert meta.SerializeToString(deterministic=True) == before


def test_same_plan_gives_the_same_graph():
    model = build_embedding("adagrad")
    meta = export(model.graph)
    plan, task = plan_for(model, 2)
    a = replicate_graph(meta, plan, task).graph_def.SerializeToString(deterministic=True)
    b = replicate_graph(meta, plan, task).graph_def.SerializeToString(deterministic=True)
    assert a == b


def test_replicated_ops_are_copied_per_device_and_shared_ops_are_not():
    model = build_mlp("adam")
    meta = export(model.graph)
    plan, task = plan_for(model, 3)
    nodes = nodes_of(replicate_graph(meta, plan, task))
    assert nodes["MatMul"].device == "/device:CPU:0"
    assert nodes["parallax_replica_1/MatMul"].device == "/device:CPU:1"
    assert nodes["parallax_replica_2/MatMul"].device == "/device:CPU:2"
    assert nodes["parallax_replica_2/MatMul"].input[0] == "parallax_replica_2/x"
    assert "parallax_replica_1/dense/kernel" not in nodes  # variables are shared
    assert "parallax_replica_1/Adam" not in nodes  # so is the training op
    assert "parallax_replica_1/gradients/MatMul_grad/MatMul" in nodes
    assert nodes["dense/kernel"].device == "/device:CPU:0"


def test_update_path_and_hyper_parameters_are_shared():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        lr = tf.compat.v1.placeholder(tf.float32, [], name="lr")
        w = tf.compat.v1.get_variable("w", [2, 1])
        loss = tf.reduce_mean(tf.matmul(x, w), name="loss")
        accuracy = tf.reduce_mean(x, name="accuracy")  # fed by the input, not by the gradient
        tf.compat.v1.train.GradientDescentOptimizer(lr).minimize(loss)
    from parallax.analysis import analyse_graph
    from parallax.plan import build_plan
    plan = build_plan(analyse_graph(graph), [("h", ("/device:CPU:0", "/device:CPU:1"), "/device:CPU:0")],
                      run_option="HYBRID", sync=True, average_sparse=False)
    roles = classify(export(graph).graph_def, plan)
    assert {"x", "loss", accuracy.op.name} <= roles.replicated
    assert {"lr", "w", "GradientDescent"} <= roles.shared
    assert "GradientDescent/update_w/ResourceApplyGradientDescent" in roles.update_path


def test_reserved_prefix_is_refused():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="parallax_replica_1/x")
        w = tf.compat.v1.get_variable("w", [2, 1])
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(tf.matmul(x, w)))
    from tests.models import Model

    model = Model(graph, {}, None, None)
    plan, task = plan_for(model, 2)
    with pytest.raises(RewriteError, match=r'op "parallax_replica_1/x" already uses the prefix'):
        replicate_graph(export(graph), plan, task)


def test_shard_ids_become_each_replicas_global_index():
    graph = tf.Graph()
    with graph.as_default():
        ds = parallax.shard.shard(tf.data.Dataset.range(100).batch(2))
        it = tf.compat.v1.data.make_initializable_iterator(ds)
        x = tf.cast(it.get_next(), tf.float32)
        w = tf.compat.v1.get_variable("w", [])
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(x * w))
    from tests.models import Model

    plan, task = plan_for(Model(graph, {}, None, None), 3)
    nodes = nodes_of(replicate_graph(export(graph), plan, task))
    ids = [nodes[name].attr["value"].tensor.int64_val[0] for name in
           ("parallax_shard_id", "parallax_replica_1/parallax_shard_id", "parallax_replica_2/parallax_shard_id")]
    assert ids == [0, 1, 2]
    assert nodes["parallax_replica_2/parallax_num_shards"].attr["value"].tensor.int64_val[0] == 3
