"""Gradients all-reduced in the order the backward pass makes them ready (MPIConfig.overlap)."""

import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.graph.graph_ops import ancestors, node_map, op_of
from parallax.plan import TaskSpec, build_plan
from parallax.plan.buckets import MIN_BUCKET_BYTES, overlap_buckets
from parallax.plan.model import CommSpec
from parallax.rewrite.pipeline import rewrite_for_task
from parallax.rewrite.readiness import op_depths, readiness_order
from tests.models import build_deep_mlp, build_sequence
from tests.unit.rewrite.helpers import export

MiB = 1024 * 1024


def _mpi_plan(model, **comm):
    workers = [("localhost", (f"/job:worker/task:{w}/device:CPU:0",), f"/job:worker/task:{w}/device:CPU:0")
               for w in range(2)]
    return build_plan(analyse_graph(model.graph), workers, run_option="MPI", sync=True, average_sparse=True,
                      cross_worker="allreduce", comm=CommSpec(**comm))


def _layers(names):
    return [n.split("/")[0] for n in names]


def test_the_last_layer_s_gradient_is_ready_first():
    model = build_deep_mlp("adam", layers=4)
    plan = _mpi_plan(model)
    graph_def = export(model.graph).graph_def
    order = readiness_order(graph_def, {v.name: [v.gradient.tensor] for v in plan.variables if v.gradient})
    assert _layers(order)[0] == "head"
    layers = [layer for layer in dict.fromkeys(_layers(order)) if layer != "head"]
    assert layers == ["layer_3", "layer_2", "layer_1", "layer_0"]  # the backward pass, layer by layer


def test_depths_follow_inputs_and_a_tf1_loop_does_not_hang():
    model = build_sequence("adam", loop=True)  # a tf.compat.v1.while_loop: NextIteration closes a cycle
    graph_def = export(model.graph).graph_def
    depth = op_depths(graph_def)
    assert set(depth) == {n.name for n in graph_def.node}
    nodes = node_map(graph_def)
    for node in graph_def.node:
        for text in node.input:
            source = op_of(text.lstrip("^"))
            if source in nodes and nodes[source].op not in ("NextIteration", "RefNextIteration"):
                assert depth[node.name] > depth[source], (node.name, source)


def test_buckets_hold_about_an_eighth_of_the_bytes_within_the_fusion_size():
    assert overlap_buckets([], 64 * MiB) == []
    assert overlap_buckets([MiB] * 16, 64 * MiB) == [[2 * k, 2 * k + 1] for k in range(8)]
    assert overlap_buckets([MiB] * 16, MiB) == [[k] for k in range(16)]  # fusion_bytes bounds them
    assert overlap_buckets([100 * MiB, MiB, MiB], 64 * MiB) == [[0], [1, 2]]  # too big: alone
    small = overlap_buckets([1000] * 10, 64 * MiB)
    assert small == [list(range(10))] and 10 * 1000 < MIN_BUCKET_BYTES


def _allreduce_calls(meta):
    return [n for n in meta.graph_def.node if n.op in ("PyFunc", "PyFuncStateless") and "allreduce_" in n.name]


def test_each_bucket_waits_for_its_own_gradients_only_and_calls_come_in_readiness_order():
    model = build_deep_mlp("adam", layers=4)
    plan = _mpi_plan(model, fusion_bytes=4)  # every variable a bucket of its own
    meta = rewrite_for_task(export(model.graph), plan, TaskSpec(0))
    nodes = node_map(meta.graph_def)
    calls = _allreduce_calls(meta)
    buckets = sorted({c.name.split("/bucket_")[1].split("/")[0] for c in calls}, key=int)
    assert len(buckets) == len([v for v in plan.variables if v.gradient])
    first = next(c for c in calls if "/bucket_0/" in c.name)
    deepest = plan.variable("layer_0/kernel").gradient.tensor
    assert op_of(deepest) not in ancestors(nodes, [first.name])  # the first layer's gradient is not waited for
    assert op_of(plan.variable("head/kernel").gradient.tensor) in ancestors(nodes, [first.name])
    last = next(c for c in calls if f"/bucket_{buckets[-1]}/" in c.name)
    assert first.name in ancestors(nodes, [last.name])  # one order of calls on every worker


def test_without_overlap_the_all_reduce_waits_for_the_whole_backward_pass():
    model = build_deep_mlp("adam", layers=4)
    plan = _mpi_plan(model, overlap=False, fusion_bytes=4)
    assert not plan.overlaps_backward and "after the backward pass" in plan.describe()
    meta = rewrite_for_task(export(model.graph), plan, TaskSpec(0))
    nodes = node_map(meta.graph_def)
    calls = _allreduce_calls(meta)
    assert calls and not any("/bucket_" in c.name for c in calls)
    every = {op_of(v.gradient.tensor) for v in plan.variables if v.gradient}
    for call in calls:
        assert every <= ancestors(nodes, [call.name])


def test_the_inter_op_pool_gets_a_thread_for_the_waiting_all_reduce():
    from parallax.member.servers import session_config

    assert session_config(None, threads=1, waiting_threads=1).inter_op_parallelism_threads == 2
    assert session_config(None, threads=1, waiting_threads=1).intra_op_parallelism_threads == 1
    own = tf.compat.v1.ConfigProto(inter_op_parallelism_threads=3)
    assert session_config(own, threads=1, waiting_threads=1).inter_op_parallelism_threads == 3
    assert _mpi_plan(build_deep_mlp("adam", layers=2), fusion_bytes=4).overlaps_backward


def test_gradients_that_make_one_bucket_are_all_reduced_after_the_backward_pass_without_a_waiting_thread():
    model = build_deep_mlp("adam", layers=4)  # a few kB: one bucket of at least MIN_BUCKET_BYTES
    plan = _mpi_plan(model)
    assert plan.comm.overlap and not plan.overlaps_backward and "after the backward pass" in plan.describe()
    meta = rewrite_for_task(export(model.graph), plan, TaskSpec(0))
    nodes = node_map(meta.graph_def)
    calls = _allreduce_calls(meta)
    assert calls and not any("/bucket_" in c.name for c in calls)
    every = {op_of(v.gradient.tensor) for v in plan.variables if v.gradient}
    assert all(every <= ancestors(nodes, [c.name]) for c in calls)


def test_a_process_alone_on_its_host_gets_one_inter_op_thread_more_than_its_environment_says(monkeypatch):
    from parallax.member.servers import session_config

    monkeypatch.setenv("TF_NUM_INTEROP_THREADS", "1")
    assert session_config(None, waiting_threads=1).inter_op_parallelism_threads == 2
    assert session_config(None).inter_op_parallelism_threads == 0  # TensorFlow's own choice


def test_a_model_of_one_mib_layers_is_all_reduced_in_a_bucket_per_layer_by_default():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 512], name="x")
        h = x
        for i in range(6):  # 1 MiB each: 6 MiB in all, so buckets of at least 1 MiB hold one layer
            h = tf.tanh(tf.matmul(h, tf.compat.v1.get_variable(f"layer_{i}/kernel", [512, 512])))
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(h))

    class Built:
        pass

    model = Built()
    model.graph = graph
    meta = rewrite_for_task(export(graph), _mpi_plan(model), TaskSpec(0))
    calls = sorted(_allreduce_calls(meta), key=lambda c: int(c.name.split("/bucket_")[1].split("/")[0]))
    assert len(calls) == 6
    nodes = node_map(meta.graph_def)
    first = ancestors(nodes, [calls[0].name])
    assert not any(name.startswith("gradients/MatMul_grad/") for name in first)  # layer 0's is not waited for
