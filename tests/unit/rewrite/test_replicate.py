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


def _dropout_step():
    import keras

    from parallax.tf2.trace import trace_step

    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dropout(0.5), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 1])])
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x, training=True) - y))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    return trace_step(step)


def _workers_plan(traced, workers: int, replicas: int):
    from parallax.analysis import analyse_graph
    from parallax.plan import build_plan

    layout = [("h", tuple(f"/job:worker/replica:0/task:{w}/device:CPU:{r}" for r in range(replicas)),
               f"/job:worker/replica:0/task:{w}/device:CPU:0") for w in range(workers)]
    return build_plan(analyse_graph(traced.graph), layout, run_option="MPI", sync=True, average_sparse=False)


def test_each_replica_draws_its_own_dropout_masks_where_they_take_no_rows_of_one_devices_draw():
    from parallax.graph.names import EXACT_DRAWS
    from parallax.plan import TaskSpec

    traced = _dropout_step()
    plan = _workers_plan(traced, workers=2, replicas=2)
    for worker, first in ((0, 0), (1, 2)):
        meta = export(traced.graph)
        del meta.collection_def[EXACT_DRAWS]  # as a step whose draws are not marked exact
        nodes = nodes_of(replicate_graph(meta, plan, TaskSpec(worker)))
        keys = sorted(n for n, node in nodes.items() if node.op == "StatelessRandomGetKeyCounter")
        assert len(keys) == 2  # replica 0's (the original name) and replica 1's copy
        for name in keys:
            index = first + (1 if name.startswith("parallax_replica_1/") else 0)
            seed = nodes[name].input[0]
            if index == 0:
                assert not seed.endswith("/parallax_seed")
                continue
            assert seed == f"{name}/parallax_seed"
            offset = tf.make_ndarray(nodes[f"{name}/parallax_seed_offset"].attr["value"].tensor)
            assert list(offset) == [index * 933199, 0]


def test_a_traced_loops_dropout_keeps_one_devices_seed_and_each_replica_knows_its_part():
    # parallax/tf2/draws.py: the loop's step is marked with the replica's global index and the job's replicas,
    # which each replica's copy sets; every replica draws with one device's seed and takes its rows
    from parallax.plan import TaskSpec

    traced = _dropout_step()
    plan = _workers_plan(traced, workers=2, replicas=2)
    for worker, first in ((0, 0), (1, 2)):
        nodes = nodes_of(replicate_graph(export(traced.graph), plan, TaskSpec(worker)))
        keys = sorted(n for n, node in nodes.items() if node.op == "StatelessRandomGetKeyCounter")
        assert len(keys) == 2 and not any(nodes[k].input[0].endswith("/parallax_seed") for k in keys)
        for r in (0, 1):
            prefix = "parallax_replica_1/" if r else ""
            index = tf.make_ndarray(nodes[f"{prefix}parallax_part/replica"].attr["value"].tensor)
            count = tf.make_ndarray(nodes[f"{prefix}parallax_part/replicas"].attr["value"].tensor)
            assert (int(index), int(count)) == (first + r, 4)


def test_each_replica_of_a_seeded_tf1_random_op_draws_its_own_numbers():

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4])
        kept = tf.compat.v1.nn.dropout(x, rate=0.5, seed=7)
        w = tf.compat.v1.get_variable("w", [4, 1])
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(kept, w)))

    class Model:
        pass

    model = Model()
    model.graph = graph
    plan, task = plan_for(model, 2)
    nodes = nodes_of(replicate_graph(export(graph), plan, task))
    draws = {n: node.attr["seed2"].i for n, node in nodes.items() if node.op == "RandomUniform"}
    original = next(n for n in draws if not n.startswith("parallax_replica_"))
    assert draws[f"parallax_replica_1/{original}"] == draws[original] + 7919


@pytest.mark.parametrize("resource", [True, False], ids=["resource", "ref"])
def test_a_queue_and_a_placeholder_that_only_sets_a_variable_are_shared(resource):
    """Every replica's dequeue takes its batch from the one queue the program's queue runners fill (a copy of the
    queue would be filled by nothing), and a learning rate assigned from a feed is set once, with one value."""
    graph = tf.Graph()
    with graph.as_default():
        queue = tf.queue.FIFOQueue(8, [tf.float32], shapes=[[2]], name="queue")
        tf.compat.v1.train.add_queue_runner(tf.compat.v1.train.QueueRunner(queue, [queue.enqueue([[1.0, 2.0]])]))
        x = queue.dequeue_many(2, name="x")
        new_lr = tf.compat.v1.placeholder(tf.float32, [], name="new_lr")
        lr = tf.compat.v1.get_variable("lr", initializer=0.1, trainable=False, use_resource=resource)
        tf.compat.v1.assign(lr, new_lr, name="lr_update")
        w = tf.compat.v1.get_variable("w", [2, 1], use_resource=resource)
        tf.compat.v1.train.GradientDescentOptimizer(lr).minimize(tf.reduce_mean(tf.matmul(x, w), name="loss"))
    from parallax.analysis import analyse_graph
    from parallax.plan import TaskSpec, build_plan
    plan = build_plan(analyse_graph(graph), [("h", ("/device:CPU:0", "/device:CPU:1"), "/device:CPU:0")],
                      run_option="PS", sync=True, average_sparse=False)
    roles = classify(export(graph).graph_def, plan)
    assert {"x", "loss"} <= roles.replicated
    assert {"queue", "new_lr", "lr_update"} <= roles.shared
    nodes = nodes_of(replicate_graph(export(graph), plan, TaskSpec(0)))
    assert nodes["parallax_replica_1/x"].input[0] == "queue"
