"""Keras 3 optimizers' updates fused into one op each (parallax/rewrite/fused_updates.py): a traced step's graph with
its updates fused trains every variable and slot to the same bits as the same graph without, run in the same kind of
session (TensorFlow's graph optimizer on); an update the optimizer rewrites (Adagrad's ``x / sqrt(y)`` into
``x * rsqrt(y)``), one inside a loss scale's conditional, and one of another kind of op (Lion's ``Sign``) keep their
ops; where the op cannot be built nothing changes."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.comm import native
from parallax.plan import build_plan
from parallax.rewrite.fused_updates import OP_NAME, fuse_updates, fused_graph, optimized_nodes
from parallax.tf2.trace import trace_step
from tests.models import averaged_embedding_model, keras_embedding_step
from tests.tf2.optimizer_matrix import batches, build
from tests.unit.rewrite.helpers import export

#: case -> whether every trainable variable's update is fused (else none is)
CASES = {"sgd-nesterov": True, "rmsprop": True, "rmsprop-centered": True, "adamax": True,
         "sgd-global-clipnorm": True, "adagrad": False, "lion": False, "lso-rmsprop": False}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("native"))
    if native.update_ops(root) is None:
        pytest.skip("no C++ compiler here")
    return root


def _plan(graph):
    return build_plan(analyse_graph(graph), [("localhost", ("/device:CPU:0",), "/device:CPU:0")], run_option="MPI",
                      sync=True, average_sparse=True)


def _trained(meta, graph_def, traced, feeds) -> dict[str, np.ndarray]:
    """Every variable after a step on each of ``feeds``, the graph being ``meta`` with ``graph_def``."""
    copy = tf.compat.v1.MetaGraphDef()
    copy.CopyFrom(meta)
    copy.graph_def.CopyFrom(graph_def)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(copy)
        variables = graph.get_collection("variables")
        with tf.compat.v1.Session(graph=graph) as sess:
            sess.run(tf.compat.v1.variables_initializer(variables))
            for feed in feeds:
                sess.run(traced.train_op.name, {t.name: value for t, value in zip(traced.inputs, feed)})
            return {v.op.name: np.atleast_1d(sess.run(v.read_value())) for v in variables}


def _fused_and_trained(step, feeds, cache):
    traced = trace_step(step)
    meta = export(traced.graph)
    plan = _plan(traced.graph)
    graph_def, fused = fuse_updates(meta.graph_def, plan, lambda source: native.build_loop(source, cache),
                                    optimized_nodes(meta))
    assert sum(n.op == OP_NAME for n in graph_def.node) == len(fused)
    before, after = _trained(meta, meta.graph_def, traced, feeds), _trained(meta, graph_def, traced, feeds)
    differ = [k for k in before if not np.array_equal(before[k].view(np.uint8), after[k].view(np.uint8))]
    return fused, differ, {v.name for v in plan.variables if v.trainable and v.gradient is not None}


@pytest.mark.parametrize("case", list(CASES))
def test_a_fused_update_trains_to_the_same_bits(case, cache):
    step, _ = build(case)
    fused, differ, trained = _fused_and_trained(step, batches(3), cache)
    assert not differ, f"{case}: fused {fused}, differ {differ}"
    assert set(fused) == (trained if CASES[case] else set()), case


def test_an_embeddings_sparse_gradient_and_its_adam_update_fused_train_to_the_same_bits(cache):
    """Keras 3's Adam sums the table's sparse gradient into a dense one (``UnsortedSegmentSum``) and its squares
    into another; ids repeated in a batch, rows never looked up (their moments decay all the same)."""
    step = keras_embedding_step()
    rng = np.random.RandomState(0)
    feeds = [(rng.randint(0, 20, (6, 4)).astype(np.int32), rng.randn(6, 1).astype(np.float32)) for _ in range(4)]
    fused, differ, trained = _fused_and_trained(step, feeds, cache)
    assert not differ and set(fused) == trained, (fused, differ)


@pytest.mark.parametrize("run_option", ["HYBRID", "PS"])
def test_a_parameter_servers_updates_are_fused_by_the_workers_of_its_host_only(cache, run_option):
    """A server's update runs in the server's process, which opens the loop's library from the worker's cache: the
    chief on the server's host fuses it (HYBRID: the table; PS: every variable), the chief of another host leaves
    it op by op (the file may not be there). The updates that run in the worker are fused on either host. (Worker 1,
    on the server's host, is the other worker of the job.)"""
    from parallax.plan import TaskSpec
    from parallax.rewrite.pipeline import rewrite_for_task

    traced = trace_step(keras_embedding_step())
    server = "/job:ps/replica:0/task:0/device:CPU:0"
    fused = {}
    for host in ("h", "g"):
        devices = [f"/job:worker/replica:0/task:{w}/device:CPU:0" for w in range(2)]
        workers = [(h, (device,), device) for h, device in zip((host, "h"), devices)]
        plan = build_plan(analyse_graph(traced.graph), workers, run_option=run_option, sync=True,
                          average_sparse=True, cross_worker=run_option.lower(), server_devices=(server,),
                          server_hosts=("h",))
        meta = rewrite_for_task(export(traced.graph), plan, TaskSpec(0))
        graph_def, fused[host] = fuse_updates(meta.graph_def, plan, lambda source: native.build_loop(source, cache),
                                              optimized_nodes(meta), host)
        placed = {n.name.split("/", 1)[1].rsplit("/", 1)[0]: n.device for n in graph_def.node if n.op == OP_NAME}
        assert {v for v, d in placed.items() if d == server} == \
            {v.name for v in plan.variables if v.server is not None and v.name in fused[host]}
        on_servers = {v.name for v in plan.variables if v.server is not None and v.gradient is not None}
        assert on_servers, run_option
        assert on_servers <= set(fused[host]) if host == "h" else not on_servers & set(fused[host]), (host, fused)
    trained = {v.name for v in plan.variables if v.gradient is not None and v.slot_of is None}
    assert set(fused["h"]) == trained
    assert set(fused["g"]) == trained - on_servers


def test_without_the_op_the_graph_is_left_as_it_is(tmp_path, monkeypatch):
    native.update_ops.cache_clear()
    monkeypatch.setenv("CXX", "false")
    monkeypatch.setattr(native, "_update_library", None)  # as in a process that has not loaded it yet
    try:
        step, _ = build("sgd-nesterov")
        traced = trace_step(step)
        meta = export(traced.graph)
        assert fused_graph(meta, _plan(traced.graph), str(tmp_path)) is meta
    finally:
        native.update_ops.cache_clear()


def test_parallax_fit_on_one_worker_runs_adam_fused_to_the_same_bits_as_without(tmp_path):
    """The whole way: ``parallax.fit`` of an Embedding and Dense model with Adam (Keras's shuffled batches) on one
    worker runs every update as one op (the graph it runs, exported) and ends with the weights and moments it
    has without fusing, and ``model.fit``'s, bit for bit."""
    import keras

    import parallax


    rng = np.random.RandomState(4)
    x, y = rng.randint(0, 300, (96, 5)), rng.randint(0, 2, (96, 1)).astype(np.float32)
    reference = averaged_embedding_model(keras)
    reference.fit(x, y, batch_size=16, epochs=2, verbose=0)
    (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
    trained = {}
    for fuse in (True, False):
        model = averaged_embedding_model(keras)
        parallax.fit(model, x, y, batch_size=16, epochs=2, verbose=0, resource_info=str(tmp_path / "resource_info"),
                     parallax_config=parallax.Config(export_graph_path=str(tmp_path / str(fuse)), fuse_updates=fuse))
        ran = (tmp_path / str(fuse) / "worker-0_metagraph").read_text()
        assert ran.count(f'op: "{OP_NAME}"') == (len(model.trainable_variables) if fuse else 0)
        trained[fuse] = [np.atleast_1d(v) for v in model.weights + model.optimizer.variables]
    want = [np.atleast_1d(v) for v in reference.weights + reference.optimizer.variables]
    for got, without, expected in zip(trained[True], trained[False], want):
        assert np.array_equal(got.view(np.uint8), without.view(np.uint8))
        assert np.array_equal(got.view(np.uint8), expected.view(np.uint8))
