"""The rewrite of TF1 idioms (tests/idioms.py), without processes: what runs where, and once."""

from __future__ import annotations

from parallax.analysis import analyse_graph
from parallax.plan import TaskSpec
from parallax.plan.policies import choose_sync
from parallax.rewrite.classify import classify
from parallax.rewrite.pipeline import rewrite_for_task
from tests.idioms import IDIOMS
from tests.unit.rewrite.helpers import export, nodes_of, plan_for
from tests.unit.rewrite.test_ps_sync import SERVERS, ps_plan

EMA_WRITE = "ExponentialMovingAverage/AssignMovingAvg/AssignSubVariableOp"
BN_WRITE = "AssignMovingAvg/AssignSubVariableOp"  # moving/stat_0's update, under UPDATE_OPS


def test_an_ema_after_the_update_is_shared_not_replicated():
    model = IDIOMS["ema"]("momentum")
    plan, _ = plan_for(model, 2)
    roles = classify(export(model.graph).graph_def, plan)
    assert EMA_WRITE in roles.shared and EMA_WRITE not in roles.replicated
    assert BN_WRITE not in roles.shared  # nothing of the kind in this graph


def test_only_replica_0_writes_moving_statistics():
    model = IDIOMS["update_ops"]("adam")
    plan, task = plan_for(model, 3)
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, task))
    assert nodes[BN_WRITE].op == "AssignSubVariableOp"
    for r in (1, 2):
        copy = nodes[f"parallax_replica_{r}/{BN_WRITE}"]
        assert copy.op == "NoOp" and all(i.startswith("^") for i in copy.input)  # waits, writes nothing


def test_only_the_chief_writes_server_variables_outside_the_optimizer():
    model = IDIOMS["ema"]("momentum")
    plan = ps_plan(model)
    chief = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(0)))
    other = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(1)))
    assert chief[EMA_WRITE].op == "AssignSubVariableOp"
    assert other[EMA_WRITE].op == "NoOp"
    for nodes in (chief, other):  # initializers stay: the chief may run them, and they are no step
        assert nodes["net/hidden/kernel/ExponentialMovingAverage/Assign"].op == "AssignVariableOp"


def test_a_group_of_the_training_op_runs_the_protocol_because_the_protocol_has_its_name():
    model = IDIOMS["group"]("adam")
    train = model.train_op.name
    for task in (0, 1):
        nodes = nodes_of(rewrite_for_task(export(model.graph), ps_plan(model), TaskSpec(task)))
        assert nodes[train].input == ["^Adam"]  # the user's tf.group, untouched
        assert nodes["Adam"].op == "NoOp" and nodes["parallax_sync/step/Adam/unsynchronised"].op in (
            "AssignAddVariableOp", "NoOp")


def test_slots_of_an_optimizer_built_in_a_variable_scope_are_found_through_its_updates():
    analysis = analyse_graph(IDIOMS["scoped"]("adagrad").graph)
    slots = {v.name: v.slot_of for v in analysis.variables if v.slot_of}
    assert slots == {"model/model/lm/emb/part_0/Adagrad": "model/lm/emb/part_0",
                     "model/model/lm/emb/part_1/Adagrad": "model/lm/emb/part_1",
                     "model/model/lm/proj/Adagrad": "model/lm/proj"}


def test_in_hybrid_a_scoped_slot_lives_on_its_variable_s_server():
    from parallax.analysis import analyse_graph as analyse
    from parallax.plan import build_plan

    model = IDIOMS["scoped"]("adagrad")
    workers = [("h", (f"/job:worker/task:{w}/device:CPU:0",), f"/job:worker/task:{w}/device:CPU:0") for w in (0, 1)]
    plan = build_plan(analyse(model.graph), workers, run_option="HYBRID", sync=True, average_sparse=True,
                      cross_worker="hybrid", server_devices=SERVERS)
    server = {v.name: v.server for v in plan.variables}
    for part in ("part_0", "part_1"):
        assert server[f"model/lm/emb/{part}"] is not None
        assert server[f"model/model/lm/emb/{part}/Adagrad"] == server[f"model/lm/emb/{part}"]
    assert server["model/lm/proj"] is None and server["model/model/lm/proj/Adagrad"] is None
    choices, _ = choose_sync(analyse(model.graph), 2, 1, "hybrid")
    assert {n: c.sync for n, c in choices.items()} == {"model/lm/emb/part_0": "ps", "model/lm/emb/part_1": "ps",
                                                       "model/lm/proj": "allreduce"}


def test_a_forward_only_graph_rewrites_to_replicas_and_nothing_else():
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        a = tf.compat.v1.placeholder(tf.float32, [], name="a")
        tf.add(a, a, name="x")
    from tests.models import Model

    plan, task = plan_for(Model(graph, {}, None, None), 2)
    assert plan.train_ops == () and not [v for v in plan.variables if v.gradient]
    nodes = nodes_of(rewrite_for_task(export(graph), plan, task))
    assert set(nodes) == {"a", "x", "parallax_replica_1/a", "parallax_replica_1/x"}
