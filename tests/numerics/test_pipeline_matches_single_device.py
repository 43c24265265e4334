"""Pipeline stages and micro-batches in one process, on virtual CPU devices, train exactly like one
device on the same (union) batch: stages alone (model parallelism), micro-batches alone (gradient
accumulation), both, and both with in-graph replicas (dp+pp)."""

from __future__ import annotations

import re

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.errors import ParallaxError
from tests.models import train_single_device
from tests.multiprocess.train_script import BUILDERS, DATA

STEPS, BATCH = 3, 12

# case: (model, optimizer, devices, stages, micro-batches, named cuts)
CASES = {
    "pp-mlp-adam": ("mlp", "adam", 2, 2, 4, None),
    "micro-batches-only": ("mlp", "momentum", 1, 1, 4, None),
    "mp-stages-only": ("deep_mlp", "adam", 3, 3, 1, None),
    "pp-deep-mlp-3-stages": ("deep_mlp", "adam", 3, 3, 6, None),
    "pp-named-cuts": ("deep_mlp", "rmsprop", 3, 3, 2, ["layer_2", "layer_4"]),
    "dp+pp-in-process": ("deep_mlp", "adam", 4, 2, 3, None),
    "pp-embedding": ("embedding", "adagrad", 2, 2, 2, None),
    "pp-lstm-while-loop": ("sequence", "adam", 2, 2, 3, None),
    "pp-partitioned-lm": ("lm1b", "adagrad", 2, 2, 2, None),
    "pp-idioms": ("everything", "adagrad", 2, 2, 2, None),
    "pp-two-optimizers": ("two_optimizers", "adam", 2, 2, 2, None),
    "pp-clipped": ("mlp", "momentum", 2, 2, 3, None),
    "mp-cnn-batch-norm": ("cnn_bn", "momentum", 2, 2, 1, None),
    "mp-cnn-batch-norm-3": ("cnn_bn", "adam", 3, 3, 1, None),
    "1f1b-deep-mlp": ("deep_mlp", "adam", 3, 3, 6, None),
    "1f1b-lstm-while-loop": ("sequence", "adam", 2, 2, 4, None),
    "1f1b-embedding": ("embedding", "adagrad", 2, 2, 3, None),
}


def build(model: str, optimizer: str, case: str):
    return BUILDERS[model](optimizer, clip=0.05) if case.endswith("clipped") else BUILDERS[model](optimizer)


def train_pipelined(model, data, resource_path, config):
    sess, num_workers, worker_id, num_replicas = parallax.parallel_run(model.graph, resource_path,
                                                                       parallax_config=config)
    assert (num_workers, worker_id) == (1, 0)
    for step, feed in enumerate(data):
        sess.run(model.step_op(step), feed_dict={model.inputs[k]: np.split(v, num_replicas) for k, v in feed.items()})
    variables = model.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    values = sess.run(variables)
    graph = sess.raw_session.graph.as_graph_def()  # the rewritten graph (sess.graph is the single-device one)
    sess.close()
    return {v.op.name: value for v, value in zip(variables, values)}, num_replicas, graph


@pytest.mark.slow
@pytest.mark.parametrize("case", list(CASES))
def test_a_pipelined_replica_trains_as_one_device(resource_file, case):
    model_name, optimizer, devices, stages, micro, cuts = CASES[case]
    data = DATA[model_name](STEPS, BATCH)
    expected = train_single_device(build(model_name, optimizer, case), data)
    resources = resource_file("localhost: " + ",".join(f"cpu:{i}" for i in range(devices)) + "\n")
    # one resource line, run_option PS: one process, its replicas in its graph (as in test_replicas_match_...)
    config = parallax.Config(run_option="PS", pipeline_stages=stages, micro_batches=micro, pipeline_cuts=cuts,
                             average_sparse=True, pipeline_schedule="1f1b" if case.startswith("1f1b") else "gpipe")
    got, replicas, graph = train_pipelined(build(model_name, optimizer, case), data, resources, config)
    assert replicas == devices // stages
    for name, value in expected.items():
        assert len(got[name]) == replicas
        for replica_value in got[name]:
            np.testing.assert_allclose(replica_value, value, rtol=1e-5, atol=1e-6, err_msg=name)
    used = {n.device.rsplit(":", 1)[-1] for n in graph.node if "CPU:" in n.device and not n.device.endswith("*")}
    assert used == {str(d) for d in range(devices)}  # every stage of every replica on its own device
    copies = {n.name.split("/", 1)[0] for n in graph.node if n.name.startswith("parallax_micro_")}
    assert copies == ({f"parallax_micro_{j}" for j in range(micro)} if micro > 1 else set())


def test_1f1b_makes_each_stage_s_forward_wait_for_the_backward_k_minus_s_micro_batches_before():
    from parallax.analysis import analyse_graph
    from parallax.plan import TaskSpec, build_plan
    from parallax.rewrite.pipeline import rewrite_for_task
    from tests.unit.rewrite.helpers import export

    model = BUILDERS["deep_mlp"]("adam")
    devices = ("/device:CPU:0", "/device:CPU:1")
    plan = build_plan(analyse_graph(model.graph), [("localhost", devices, "/device:CPU:0")], run_option="HYBRID",
                      sync=True, average_sparse=True, pipeline_stages=2, micro_batches=4, pipeline_schedule="1f1b")
    nodes = {n.name: n for n in rewrite_for_task(export(model.graph), plan, TaskSpec(0)).graph_def.node}
    first = nodes["parallax_micro_2/layer_0/MatMul"]  # stage 0 of 2: micro-batch 2 waits for 0's backward
    waits = {t[1:] for t in first.input if t.startswith("^")}
    assert waits and all(w.startswith("parallax_micro_0/gradients/") for w in waits)
    assert not any(t.startswith("^") for t in nodes["parallax_micro_1/layer_0/MatMul"].input)
    assert "schedule 1f1b" in plan.describe()


def test_a_named_cut_puts_its_scope_first_on_the_next_stage():
    from parallax.analysis import analyse_graph
    from parallax.plan import build_plan

    model = BUILDERS["deep_mlp"]("adam")
    devices = ("/device:CPU:0", "/device:CPU:1", "/device:CPU:2")
    plan = build_plan(analyse_graph(model.graph), [("localhost", devices, "/device:CPU:0")], run_option="HYBRID",
                      sync=True, average_sparse=True, pipeline_stages=3, micro_batches=2,
                      pipeline_cuts=("layer_2", "layer_4"))
    stage = {v.name: v.stage for v in plan.variables}
    assert [stage[f"layer_{i}/kernel"] for i in range(6)] == [0, 0, 1, 1, 2, 2]
    assert stage["head/kernel"] == 2 and stage["layer_3/kernel/Adam"] == 1
    text = plan.describe()
    assert "pipeline: 3 stage(s), 2 micro-batch(es)" in text and "cut by user, schedule gpipe" in text
    assert "stage 1: from layer_2/" in text and "on /device:CPU:1" in text


def test_a_batch_the_micro_batches_cannot_split_is_refused_by_name(resource_file):
    model = BUILDERS["mlp"]("adam")
    sess, *_ = parallax.parallel_run(model.graph, resource_file("localhost: cpu:0,cpu:1\n"),
                                     parallax_config=parallax.Config(pipeline_stages=2, micro_batches=4))
    with pytest.raises(tf.errors.InvalidArgumentError, match=r"(?s)parallax_pipeline/split/[xy]_0.*num_split 4"):
        sess.run(model.train_op, {model.inputs["x"]: [np.zeros((6, 4), np.float32)],
                                  model.inputs["y"]: [np.zeros((6, 1), np.float32)]})
    sess.close()


@pytest.mark.parametrize("resources, config, message", [
    ("localhost: cpu:0,cpu:1,cpu:2\n", dict(pipeline_stages=2),
     r"resource_info\S* lists 3 device\(s\), but pipeline_stages=2 needs each replica's 2 stages"),
    ("localhost: cpu:0,cpu:1\n", dict(pipeline_cuts=["no_such_scope"]), "'no_such_scope' names no op"),
    ("localhost: cpu:0,cpu:1,cpu:2\n", dict(pipeline_cuts=["layer_4", "layer_2"]), "in the order the model"),
])
def test_a_pipeline_that_cannot_be_laid_out_is_refused_with_the_reason(resource_file, resources, config, message):
    model = BUILDERS["deep_mlp"]("adam")
    with pytest.raises(ParallaxError, match=message):
        parallax.parallel_run(model.graph, resource_file(resources), parallax_config=parallax.Config(**config))


def test_a_model_over_the_device_memory_is_cut_into_the_fewest_stages_that_fit(resource_file):
    model_name, data = "deep_mlp", DATA["deep_mlp"](STEPS, BATCH)
    expected = train_single_device(BUILDERS[model_name]("adam"), data)
    resources = resource_file("localhost: cpu:0,cpu:1,cpu:2,cpu:3\n")
    config = parallax.Config(run_option="PS", device_memory="9kB")  # 17.5 kB of variables and slots
    plan = parallax.preview_plan(BUILDERS[model_name]("adam").graph, resources, parallax_config=config)
    assert (plan.pipeline.stages, plan.pipeline.cut_by, plan.num_replicas) == (4, "memory", 1)
    by_stage = [sum(v.num_bytes for v in plan.variables if v.stage == s) for s in range(4)]
    assert max(by_stage) <= 9000 and sum(by_stage) == sum(v.num_bytes for v in plan.variables)
    got, replicas, _ = train_pipelined(BUILDERS[model_name]("adam"), data, resources, config)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name][0], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_variable_the_user_places_on_a_stage_computes_there(resource_file):
    data = DATA["embedding"](STEPS, BATCH)
    expected = train_single_device(BUILDERS["embedding"]("adam"), data)
    config = parallax.Config(run_option="PS", pipeline_stages=2, micro_batches=2, average_sparse=True,
                             plan_overrides={"embedding": {"stage": 1}, "proj/*": {"stage": 0}})
    got, _, graph = train_pipelined(BUILDERS["embedding"]("adam"), data,
                                    resource_file("localhost: cpu:0,cpu:1\n"), config)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name][0], value, rtol=1e-5, atol=1e-6, err_msg=name)
    devices = {n.name: n.device for n in graph.node}
    assert devices["embedding"].endswith("CPU:1") and devices["embedding/Adam"].endswith("CPU:1")
    gathers = [n for n in graph.node if n.op == "ResourceGather" and n.name.startswith("parallax_micro_")]
    assert gathers and all(n.device.endswith("CPU:1") for n in gathers)  # the lookup runs with its table
    assert devices["proj/kernel"].endswith("CPU:0")


@pytest.mark.parametrize("one_shot", [False, True], ids=["initializable", "one-shot"])
def test_a_tf_data_batch_is_split_into_micro_batches(resource_file, one_shot):
    from tests.idioms import build_dataset, dataset_union_batches

    expected = train_single_device(build_dataset("adam", one_shot), dataset_union_batches(STEPS, 1))
    model = build_dataset("adam", one_shot)
    config = parallax.Config(run_option="PS", pipeline_stages=2, micro_batches=2)
    sess, *_ = parallax.parallel_run(model.graph, resource_file("localhost: cpu:0,cpu:1\n"), parallax_config=config)
    sess.run(model.initializer)
    for _ in range(STEPS):
        sess.run(model.train_op)
    variables = model.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    got = dict(zip([v.op.name for v in variables], sess.run(variables)))
    splits = [n.name for n in sess.raw_session.graph.as_graph_def().node if n.op == "Split"]
    sess.close()
    assert any(name.startswith("parallax_pipeline/split/IteratorGetNext") for name in splits)
    for name, value in expected.items():
        np.testing.assert_allclose(got[name][0], value, rtol=1e-5, atol=1e-6, err_msg=name)


def test_a_static_batch_the_micro_batches_cannot_split_is_refused_when_rewritten():
    from parallax.analysis import analyse_graph
    from parallax.errors import RewriteError
    from parallax.plan import TaskSpec, build_plan
    from parallax.rewrite.pipeline import rewrite_for_task

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [6, 4], name="x")
        w = tf.compat.v1.get_variable("w", [4, 1])
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(x, w)))
        meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    del train
    plan = build_plan(analyse_graph(graph), [("h", ("/device:CPU:0",), "/device:CPU:0")], run_option="PS",
                      sync=True, average_sparse=False, micro_batches=4)
    with pytest.raises(RewriteError, match=r'micro_batches=4 splits the batch of "x:0" .* its static size is 6'):
        rewrite_for_task(meta, plan, TaskSpec(0))


def test_a_pipelined_job_checkpoints_under_single_device_names(resource_file, tmp_path):
    data = DATA["mlp"](STEPS, BATCH)
    model = BUILDERS["mlp"]("adam")
    ckpt = parallax.CheckPointConfig(ckpt_dir=str(tmp_path / "ckpt"), save_ckpt_steps=1)
    config = parallax.Config(run_option="PS", pipeline_stages=2, micro_batches=2, ckpt_config=ckpt)
    got, _, _ = train_pipelined(model, data, resource_file("localhost: cpu:0,cpu:1\n"), config)
    plain = BUILDERS["mlp"]("adam")
    with plain.graph.as_default(), tf.compat.v1.Session() as sess:
        tf.compat.v1.train.Saver().restore(sess, tf.train.latest_checkpoint(str(tmp_path / "ckpt")))
        for v in plain.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES):
            np.testing.assert_allclose(sess.run(v), got[v.op.name][0], rtol=1e-6, err_msg=v.op.name)


def test_micro_batches_without_a_batch_input_to_split_are_refused():
    from parallax.analysis import analyse_graph
    from parallax.errors import RewriteError
    from parallax.plan import TaskSpec, build_plan
    from parallax.rewrite.pipeline import rewrite_for_task

    graph = tf.Graph()
    with graph.as_default():  # synthetic data made in the graph: nothing to split
        x = tf.random.uniform([8, 4], seed=1)
        w = tf.compat.v1.get_variable("w", [4, 1])
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(x, w)))
        meta = tf.compat.v1.train.export_meta_graph(graph=graph)
    plan = build_plan(analyse_graph(graph), [("h", ("/device:CPU:0",), "/device:CPU:0")], run_option="PS",
                      sync=True, average_sparse=False, micro_batches=2)
    with pytest.raises(RewriteError, match="micro_batches=2 splits each batch input .* computed from none"):
        rewrite_for_task(meta, plan, TaskSpec(0))


def test_batch_statistics_split_by_micro_batches_are_named_in_a_warning(parallax_warnings):
    """Batch norm (hand-written tf.nn.moments, and the fused op in training) normalises each micro-batch by
    its own statistics: the rewrite says so, naming the ops, since training then differs from one device."""
    from parallax.analysis import analyse_graph
    from parallax.plan import TaskSpec, build_plan
    from parallax.rewrite.pipeline import rewrite_for_task

    model = BUILDERS["cnn_bn"]("momentum")
    with model.graph.as_default():
        meta = tf.compat.v1.train.export_meta_graph(graph=model.graph)
    plan = build_plan(analyse_graph(model.graph), [("h", ("/device:CPU:0",), "/device:CPU:0")], run_option="PS",
                      sync=True, average_sparse=False, micro_batches=2)
    rewrite_for_task(meta, plan, TaskSpec(0))
    err = "\n".join(parallax_warnings)
    assert re.search(r"micro_batches=2: the batch statistics of \S*moments/mean are computed per micro-batch: each "
                     r"micro-batch is normalised by its own", err), err

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2, 2, 3], name="x")
        scale, offset = tf.compat.v1.get_variable("gamma", [3]), tf.compat.v1.get_variable("beta", [3])
        y, _, _ = tf.compat.v1.nn.fused_batch_norm(x, scale, offset, is_training=True, name="batch_normalization")
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(y))
        fused = tf.compat.v1.train.export_meta_graph(graph=graph)
    del train
    plan = build_plan(analyse_graph(graph), [("h", ("/device:CPU:0",), "/device:CPU:0")], run_option="PS",
                      sync=True, average_sparse=False, micro_batches=2)
    parallax_warnings.clear()
    rewrite_for_task(fused, plan, TaskSpec(0))
    err = "\n".join(parallax_warnings)
    assert re.search(r"the batch statistics of batch_normalization\S* are computed per micro-batch", err), err
