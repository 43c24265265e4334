"""The PS rewrite of a program's own writes of server variables (rewrite/program_writes.py): the chief writes,
once per step as on one device; on the other workers a write runs nothing but still gives what one device
would give a fetch, a reader or a graph collection; writes outside a step take the writes barrier."""

from __future__ import annotations

import pytest
import tensorflow as tf

from parallax.graph.graph_ops import ancestors
from parallax.graph.names import writes_barrier_op
from parallax.plan import TaskSpec
from parallax.rewrite.pipeline import rewrite_for_task
from parallax.rewrite.ps_sync import PROGRAM_WRITES, UNSYNCHRONISED
from tests.models import Model, _init
from tests.unit.rewrite.helpers import export, nodes_of
from tests.unit.rewrite.test_ps_sync import SERVERS, ps_plan


def program(resource: bool) -> Model:
    """tf_cnn_benchmarks' and the PTB model's writes: the global step's increment under the update's control
    dependency (fetched), a learning-rate variable assigned from a placeholder (kept in a collection), and a
    moving statistic in UPDATE_OPS grouped with the update."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2], name="x")
        w = tf.compat.v1.get_variable("w", [2, 1], initializer=_init([2, 1], 1), use_resource=resource)
        step = tf.compat.v1.get_variable("global_step", [], tf.int64, tf.compat.v1.zeros_initializer(),
                                         trainable=False, use_resource=resource)
        lr = tf.compat.v1.get_variable("lr", [], initializer=tf.compat.v1.constant_initializer(0.1),
                                       trainable=False, use_resource=resource)
        stat = tf.compat.v1.get_variable("stat", [], initializer=tf.compat.v1.zeros_initializer(),
                                         trainable=False, use_resource=resource)
        loss = tf.reduce_mean(tf.matmul(x, w), name="loss")
        update = tf.compat.v1.assign_add(stat, loss, name="stat_update")
        apply = tf.compat.v1.train.GradientDescentOptimizer(lr).minimize(loss)
        train = tf.group(apply, update, name="train")
        with tf.control_dependencies([train]):
            inc = tf.compat.v1.assign_add(step, 1, name="inc")
        new_lr = tf.compat.v1.placeholder(tf.float32, [], name="new_lr")
        lr_update = tf.compat.v1.assign(lr, new_lr, name="lr_update")
        tf.compat.v1.add_to_collection("Train/lr_update", lr_update)
        tf.compat.v1.add_to_collection("inc", inc)
    return Model(graph, {"x": x, "new_lr": new_lr}, loss, apply)


def rewritten(resource: bool, worker: int):
    model = program(resource)
    plan = ps_plan(model, num_workers=3, servers=SERVERS[:1])
    return model, rewrite_for_task(export(model.graph), plan, TaskSpec(worker))


def writes_of(model: Model) -> dict[str, str]:
    """The program's write of each of its variables, by role (a resource write takes no name of its own)."""
    from parallax.graph.graph_ops import node_map, written_variable

    nodes = node_map(model.graph.as_graph_def())
    found = {written_variable(n, nodes): n.name for n in nodes.values()
             if written_variable(n, nodes) in ("global_step", "lr", "stat") and not n.name.endswith("/Assign")}
    return {"inc": found["global_step"], "lr_update": found["lr"], "stat_update": found["stat"]}


def _import(meta) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(meta)
    return graph


@pytest.mark.parametrize("resource", [False, True], ids=["ref", "resource"])
def test_the_chief_keeps_the_programs_writes_and_releases_the_others_after_those_outside_a_step(resource):
    model, meta = rewritten(resource, 0)
    nodes, writes = nodes_of(meta), writes_of(model)
    for role, op in {"inc": "AssignAdd", "lr_update": "Assign", "stat_update": "AssignAdd"}.items():
        assert nodes[writes[role]].op == (op + "VariableOp" if resource else op), role
    assert sorted(v.decode() for v in meta.collection_def[PROGRAM_WRITES].bytes_list.value) == sorted(
        [writes["lr_update"], writes["stat_update"]])  # inc follows the training op: the step's token orders it
    assert len(nodes[writes_barrier_op(True)].input) == 2  # a token for each other worker
    assert UNSYNCHRONISED not in meta.collection_def
    _import(meta)


@pytest.mark.parametrize("resource", [False, True], ids=["ref", "resource"])
def test_another_worker_runs_none_of_them_but_gives_what_one_device_would(resource):
    model, meta = rewritten(resource, 1)
    nodes, writes = nodes_of(meta), writes_of(model)
    if resource:
        assert {nodes[n].op for n in writes.values()} == {"NoOp"}
        read = [n for n in nodes.values() if n.op == "Identity" and "^lr_update" in n.input]
        assert [r.input[0] for r in read] == ["new_lr"]  # lr.assign(new_lr)'s value: what was fed
        increment = [n for n in nodes.values() if n.op == "ReadVariableOp" and f"^{writes['inc']}" in n.input]
        assert increment and "train" in ancestors(nodes, [increment[0].name])  # assign_add's value: after the step
    else:
        assert (nodes["inc"].op, nodes["inc"].input[0]) == ("Identity", "global_step")  # read after the step
        assert "train" in ancestors(nodes, ["inc"])
        assert (nodes["lr_update"].op, nodes["lr_update"].input[0]) == ("Identity", "new_lr")
        assert (nodes["stat_update"].op, nodes["stat_update"].input[0]) == ("Identity", "stat")
    unsynchronised = {v.decode() for v in meta.collection_def[UNSYNCHRONISED].bytes_list.value}
    assert writes["stat_update"] in unsynchronised
    assert not {writes["lr_update"], writes["inc"]} & unsynchronised
    assert nodes[writes_barrier_op(False)].op == "NoOp" and writes_barrier_op(True) not in nodes
    graph = _import(meta)  # the collections' entries still name tensors of the graph
    assert graph.get_collection("Train/lr_update") and graph.get_collection("inc")


def test_a_savers_restore_is_a_write_of_the_program_and_does_not_hold_the_release_back():
    from parallax.rewrite.ps_sync import written_after

    model = program(False)
    with model.graph.as_default():
        saver = tf.compat.v1.train.Saver()
    plan = ps_plan(model, num_workers=2, servers=SERVERS[:1])
    meta = export(model.graph)
    assert written_after(meta, plan, plan.train_ops[0]) == ["global_step", "lr", "stat"]  # not because of restore
    chief = rewrite_for_task(meta, plan, TaskSpec(0))
    writes = {v.decode() for v in chief.collection_def[PROGRAM_WRITES].bytes_list.value}
    restores = {n.name for n in chief.graph_def.node if n.name.startswith("save/Assign")}
    assert restores and restores <= writes
    other = nodes_of(rewrite_for_task(meta, plan, TaskSpec(1)))
    assert {other[n].op for n in restores} == {"Identity"}  # the chief restores; the others wait for it
    assert saver.saver_def.restore_op_name in other
