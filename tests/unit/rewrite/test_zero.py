"""ZeRO as a pure rewrite: what the plan shards, and what each worker's graph holds and runs
(the numbers themselves: tests/multiprocess/test_zero.py)."""

from __future__ import annotations

import pytest
import tensorflow as tf
from tensorflow.core.framework import variable_pb2

from parallax.analysis import analyse_graph
from parallax.config import Config
from parallax.errors import RewriteError
from parallax.plan import TaskSpec, build_plan
from parallax.rewrite.pipeline import rewrite_for_task
from parallax.rewrite.zero import held_in_parts
from tests.models import build_embedding, build_mlp
from tests.unit.rewrite.helpers import export, nodes_of

WORKERS = [("localhost", (f"/job:worker/task:{i}/device:CPU:0",), f"/job:worker/task:{i}/device:CPU:0")
           for i in range(3)]


def plan_of(model, stage: int, workers: int = 2, run_option: str = "MPI"):
    return build_plan(analyse_graph(model.graph), WORKERS[:workers], run_option=run_option, sync=True,
                      average_sparse=True, cross_worker="allreduce", zero_stage=stage)


def collection(meta, key: str) -> set[str]:
    names = set()
    for raw in meta.collection_def[key].bytes_list.value:
        proto = variable_pb2.VariableDef()
        proto.ParseFromString(raw)
        names.add(proto.variable_name.split(":")[0])
    return names


def test_the_plan_shards_the_slots_of_all_reduced_dense_variables_and_counts_their_bytes():
    plan = plan_of(build_mlp("adam"), 1, workers=2)
    sharded = {v.name for v in plan.variables if v.sharded}
    assert sharded == {"dense/kernel", "dense/bias", "out/kernel", "dense/kernel/Adam", "dense/kernel/Adam_1",
                       "dense/bias/Adam", "dense/bias/Adam_1", "out/kernel/Adam", "out/kernel/Adam_1"}
    whole = plan_of(build_mlp("adam"), 0, workers=2)
    assert whole.bytes_per_rank()[1] == 2 * (32 + 8 + 8) * 4  # two Adam slots of 48 floats
    # halves (a part is ceil(n / 2)), and each sharded variable adds its own part
    assert plan.bytes_per_rank() == (whole.bytes_per_rank()[0] + (16 + 4 + 4) * 4, (16 + 4 + 4) * 2 * 4)
    assert "memory per worker:" in plan.describe() and "1/2 on each worker" in plan.describe()
    assert Plan_round_trip(plan) == plan


def Plan_round_trip(plan):  # noqa: N802 - reads as a noun in the assertion
    from parallax.plan import Plan

    return Plan.from_dict(plan.to_dict())


def test_what_cannot_be_sharded_stays_whole_with_a_note():
    plan = plan_of(build_embedding("adam"), 2, workers=2)  # MPI: the sparse embedding is all-gathered
    assert not plan.variable("embedding").sharded and plan.variable("proj/kernel").sharded
    assert any("embedding (sparse gradient)" in n for n in plan.notes), plan.notes
    gd = plan_of(build_mlp("gd"), 1, workers=2)
    assert not any(v.sharded for v in gd.variables)
    assert any("no optimizer slots" in n for n in gd.notes)
    assert plan_of(build_mlp("adam"), 1, workers=1).zero_stage == 0  # one worker: nothing to shard over


@pytest.mark.parametrize("stage", [1, 2])
def test_each_worker_keeps_its_part_of_the_slots_and_gathers_the_updated_parts(stage):
    model = build_mlp("adam")
    with model.graph.as_default():
        tf.compat.v1.global_variables_initializer()  # a program's "init": it runs every initializer
    plan = plan_of(model, stage, workers=3)
    meta = rewrite_for_task(export(model.graph), plan, TaskSpec(1))
    nodes = nodes_of(meta)
    part = nodes["parallax_zero/dense/kernel/part"]
    assert part.op == "VarHandleOp" and list(part.attr["shape"].shape.dim[0:1])[0].size == 11  # ceil(32 / 3)
    apply = nodes["parallax_zero/dense/kernel/apply"]
    assert apply.op == "ResourceApplyAdam"
    assert apply.input[:3] == ["parallax_zero/dense/kernel/part", "parallax_zero/dense/kernel/slot_0",
                               "parallax_zero/dense/kernel/slot_1"]
    original = next(n for n in meta.graph_def.node if n.name.endswith("update_dense/kernel/ResourceApplyAdam"))
    assert original.op == "NoOp" and original.input == ["^parallax_zero/dense/kernel/assign"]
    assert nodes["parallax_zero/dense/kernel/assign"].input[0] == "dense/kernel"
    # the whole slots are neither initialised nor in a collection; every worker initialises its own parts
    assert not {"dense/kernel/Adam", "dense/kernel/Adam_1"} & (collection(meta, "variables")
                                                               | collection(meta, "local_variables"))
    assert {"parallax_zero/dense/kernel/part", "parallax_zero/dense/kernel/slot_0"} <= collection(meta,
                                                                                                 "local_variables")
    slot_inits = {n.name for n in meta.graph_def.node if n.name.startswith("dense/kernel/Adam")
                  and n.op == "AssignVariableOp"}
    assert slot_inits and not any(i[1:] in slot_inits for n in meta.graph_def.node for i in n.input)
    assert "^dense/kernel/Assign" in nodes["init"].input  # the variables' own stay
    # one all-gather of every variable's parts (side by side: one call, not one per variable), after the step's
    # other collectives
    gathers = [n for n in meta.graph_def.node if n.name.startswith("parallax_zero/allgather/") and n.op == "PyFunc"]
    assert len(gathers) == 1 and {g.attr["token"].s for g in gathers} == {b"parallax_comm:mpi_allgather_shards"}
    after = nodes["parallax_zero/after_aggregation"]
    scattered = [n.name for n in meta.graph_def.node if n.op == "PyFunc" and n.name.startswith("parallax_aggregate/")]
    assert scattered and {"^" + s for s in scattered} <= set(after.input)
    reduce_kinds = {nodes[s].attr["token"].s for s in scattered}
    expected_kind = b"parallax_comm:mpi_reduce_scatter" if stage == 2 else b"parallax_comm:mpi_allreduce"
    assert reduce_kinds == {expected_kind}


def test_stage_two_sums_a_global_norm_over_the_workers():
    model = build_mlp("adam", clip=0.05)
    meta = rewrite_for_task(export(model.graph), plan_of(model, 2, workers=2), TaskSpec(0))
    norms = [n for n in meta.graph_def.node if n.name.startswith("parallax_zero/norms/") and n.op == "PyFunc"]
    assert len(norms) == 1  # the three gradients' L2Loss terms, summed in one call
    sums = [n.name for n in meta.graph_def.node if n.name.startswith("parallax_zero/norms/sum_")]
    assert len(sums) == 3
    readers = [n for n in meta.graph_def.node if any(i.startswith("parallax_zero/norms/sum_") for i in n.input)
               and not n.name.startswith("parallax_zero/")]
    assert readers and all("global_norm" in n.name or "clip" in n.name.lower() for n in readers)


def one_variable_model(transform):
    """``w`` [4, 2] trained by Adam on ``transform(its gradient)``."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", [4, 2], initializer=tf.compat.v1.ones_initializer())
        opt = tf.compat.v1.train.AdamOptimizer(0.1)
        (g, v), = opt.compute_gradients(tf.reduce_sum(tf.matmul(x, w)))
        opt.apply_gradients([(transform(g), v)])
    return type("M", (), {"graph": graph})


def test_stage_two_refuses_an_update_that_needs_the_gradient_whole():
    # the gradient scaled by its own largest element: needs it whole
    model = one_variable_model(lambda g: g / tf.reduce_max(tf.abs(g)))
    graph = model.graph
    with pytest.raises(RewriteError, match=r'zero_stage=2 gives each worker a part of the gradient of "w", but '
                                           r'".*" \((Abs|Max)\) needs it whole; use zero_stage=1'):
        rewrite_for_task(export(graph), plan_of(model, 2), TaskSpec(0))
    rewrite_for_task(export(graph), plan_of(model, 1), TaskSpec(0))  # stage 1 all-reduces it whole


def test_a_fetch_of_a_sharded_slot_is_explained():
    reasons = held_in_parts(plan_of(build_mlp("momentum"), 1, workers=2))
    assert set(reasons) == {"dense/kernel/Momentum", "dense/bias/Momentum", "out/kernel/Momentum"}
    assert "zero_stage=1 keeps this optimizer slot of 'dense/kernel' in 2 parts" in reasons["dense/kernel/Momentum"]


@pytest.mark.parametrize("kwargs, message", [
    ({"zero_stage": 3}, r"zero_stage must be 0 \(off\), 1 .* or 2 .*, got int 3"),
    ({"zero_stage": True}, r"zero_stage must be 0"),
])
def test_zero_stage_is_checked(kwargs, message):
    with pytest.raises(ValueError, match=message):
        Config(**kwargs)


def test_zero_stage_needs_workers_that_all_reduce():
    with pytest.raises(ValueError, match=r"zero_stage=1 shards optimizer states over workers that all-reduce; "
                                         r"run_option='PS' has none"):
        Config(run_option="PS", zero_stage=1).validate()
    with pytest.raises(ValueError, match=r"zero_stage=2 needs synchronous training"):
        Config(zero_stage=2).validate(sync=False)


def test_a_backend_without_shards_is_refused_naming_the_one_to_use():
    from dataclasses import replace

    from parallax.plan.model import CommSpec

    model = build_mlp("adam")
    plan = replace(plan_of(model, 1), comm=CommSpec(backend="collective"))
    with pytest.raises(RewriteError, match=r"the collective backend cannot shard optimizer states \(zero_stage\); "
                                           r"use MPIConfig\(backend='mpi'\)"):
        rewrite_for_task(export(model.graph), plan, TaskSpec(0))


def test_stage_two_refuses_a_gradient_combined_with_a_tensor_of_its_shape():
    # elementwise, but with a tensor of the gradient's whole shape
    model = one_variable_model(lambda g: g * tf.constant([[1.0, 0.0]] * 4, name="mask"))
    with pytest.raises(RewriteError, match=r'"w", but ".*" \(Mul\) combines it with mask of shape \(4, 2\)'):
        rewrite_for_task(export(model.graph), plan_of(model, 2), TaskSpec(0))


@pytest.mark.parametrize("name", ["keras3-adam", "keras3-adamw", "keras3-nadam", "keras3-rmsprop", "keras3-adagrad",
                                  "keras3-sgd"])
def test_a_keras_3_optimizers_element_wise_update_is_copied_onto_each_workers_parts(name):
    from parallax.tf2.trace import trace_step
    from tests.tf2.programs import build

    traced = trace_step(build(name)[0])
    plan = plan_of(traced, 1)
    sharded = [v for v in plan.variables if v.sharded and v.slot_of is None]
    assert sharded
    meta = rewrite_for_task(export(traced.graph), plan, TaskSpec(1))
    nodes = nodes_of(meta)
    for v in sharded:
        scope = f"parallax_zero/{v.name}/"
        copies = [n for n in meta.graph_def.node if n.name.startswith(scope + "region/")]
        handles = {n.input[0] for n in copies if n.op == "ReadVariableOp" or n.op.endswith("VariableOp")
                   and n.op != "ReadVariableOp"}
        assert scope + "part" in handles and handles <= {scope + "part"} | {f"{scope}slot_{i}" for i in range(4)}
        # the original update: its writes wait for the gathered value, nothing reads the whole slots any more
        writes = [n for n in meta.graph_def.node if f"update_{v.name}/" in n.name and n.op.startswith("Assign")]
        assert not writes
        assert nodes[scope + "assign"].input[0] == v.name
    slots = {s.name for s in plan.variables if s.sharded and s.slot_of is not None}
    for node in meta.graph_def.node:  # the updates' reads of the whole slots are gone (waits for the new value)
        assert not (node.op == "ReadVariableOp" and node.input[0] in slots and "/update_" in node.name), node.name


def test_a_keras_3_update_inside_a_loss_scale_conditional_is_refused_naming_it():
    from parallax.tf2.trace import trace_step
    from tests.tf2.programs import build

    traced = trace_step(build("keras3-lso-adam")[0])
    with pytest.raises(RewriteError, match=r"cannot be cut into parts: .* reaches it through a conditional"):
        rewrite_for_task(export(traced.graph), plan_of(traced, 1), TaskSpec(0))


def _keras3_step(optimizer):
    import keras

    from tests.tf2.programs import squared_error_step

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((5,), dtype="int32"), keras.layers.Embedding(100, 8),
                              keras.layers.GlobalAveragePooling1D(), keras.layers.Dense(1)])
    return squared_error_step(model, optimizer, tf.TensorSpec([None, 5], tf.int32))


def test_a_table_whose_keras_3_update_makes_its_sparse_gradient_whole_is_sharded():
    import keras

    from parallax.tf2.trace import trace_step

    traced = trace_step(_keras3_step(keras.optimizers.Adam(0.01)))
    analysis = analyse_graph(traced.graph)
    name = next(v.name for v in analysis.variables if v.name.endswith("embeddings"))
    table = analysis.gradient(name)
    assert table.sparse and table.densified  # Keras 3 sums its rows into a table-shaped tensor, then updates all
    plan = plan_of(traced, 1)
    assert plan.variable(name).sharded
    meta = rewrite_for_task(export(traced.graph), plan, TaskSpec(0))
    # the rows summed into the whole table as one device sums them, then cut: this worker's part of it
    grad_parts = [n for n in meta.graph_def.node if n.name.startswith(f"parallax_zero/{name}/grad_part")]
    assert len(grad_parts) == 2  # Adam's two sums: of the rows, of their squares


def test_an_update_that_reduces_over_the_variable_stays_refused_naming_the_op():
    import keras

    from parallax.tf2.trace import trace_step

    traced = trace_step(_keras3_step(keras.optimizers.Lamb(0.01)))  # the trust ratio: a norm of the variable
    with pytest.raises(RewriteError, match=r"cannot be cut into parts: .*\((Sum|Max|Mean|Norm|EuclideanNorm)\) is "
                                           r"no element-wise op"):
        rewrite_for_task(export(traced.graph), plan_of(traced, 1), TaskSpec(0))
