"""A worker's reads of small server variables travel packed, one transfer per server and dtype."""

from dataclasses import replace

import pytest
import tensorflow as tf

from parallax.graph.graph_ops import parse_input
from parallax.plan import TaskSpec
from parallax.plan.model import PSSpec
from parallax.rewrite.pipeline import rewrite_for_task
from tests.models import build_mlp
from tests.unit.rewrite.helpers import export, nodes_of
from tests.unit.rewrite.test_ps_sync import SERVERS, ps_plan

PACK, UNPACK = "parallax_reads/0/pack", "parallax_reads/0/unpack"


def packed_variables(nodes) -> list[str]:
    """The variables whose reads the first pack concatenates, in order."""
    reads = [nodes[parse_input(nodes[parse_input(i)[0]].input[0])[0]] for i in nodes[PACK].input[:-1]]
    return [parse_input(r.input[0])[0] for r in reads]


@pytest.mark.parametrize("task", [0, 1])
def test_local_copies_are_refreshed_from_one_packed_read(task):
    model = build_mlp("momentum")
    plan = ps_plan(model, servers=SERVERS[:1])
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(task)))
    assert nodes[PACK].op == "ConcatV2" and nodes[PACK].device == SERVERS[0]
    assert nodes[UNPACK].device == plan.workers[task].shared_device
    assert packed_variables(nodes) == ["dense/bias", "dense/kernel", "out/kernel"]  # not the int64 global step
    for i, name in enumerate(("dense/bias", "dense/kernel", "out/kernel")):
        refresh = nodes[f"parallax_local/replica_0/{name}/refresh"]
        assert refresh.input[1] == f"{UNPACK}/Reshape{'_' + str(i) if i else ''}"


def test_without_local_copies_the_forward_pass_reads_the_pieces_and_reference_variables_too():
    model = build_mlp("gd", resource=False)
    plan = replace(ps_plan(model, servers=SERVERS[:1]), ps=PSSpec(replicate_variables=False))
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(1)))
    assert packed_variables(nodes) == ["dense/bias", "dense/kernel", "out/kernel"]
    assert nodes["MatMul"].input[1].startswith(UNPACK)
    # the server's own readers (the chief's updates; the others run none) keep reading the variables there
    chief = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(0)))
    updates = [n for n in chief.values() if n.op == "ApplyGradientDescent"]
    assert updates and all(not i.startswith("parallax_reads/") for n in updates for i in n.input)


def test_a_read_after_the_update_or_of_a_big_variable_keeps_its_own_transfer():
    model = build_mlp("gd")
    with model.graph.as_default():
        big = tf.compat.v1.get_variable("big", [256, 256], trainable=False)  # 256 KiB: alone
        kernel = [v for v in tf.compat.v1.global_variables() if v.op.name == "dense/kernel"][0]
        with tf.control_dependencies([model.train_op]):
            after = tf.identity(kernel.read_value(), name="after")
        tf.reduce_sum(big, name="uses_big")
    plan = replace(ps_plan(model, servers=SERVERS[:1]), ps=PSSpec(replicate_variables=False))
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(0)))
    assert "big" not in packed_variables(nodes)
    assert not nodes["uses_big"].input[0].startswith("parallax_reads/")
    waiting = [n for n in nodes.values() if n.op == "ReadVariableOp" and n.input[0] == "dense/kernel"
               and any(i.startswith("^") for i in n.input)]
    assert len(waiting) == 1  # read_value() under control_dependencies([train_op]): its reader still reads it
    readers = [n.name for n in nodes.values() if waiting[0].name in n.input]
    assert readers and nodes[after.op.name].input[0] in readers  # read_value()'s Identity, then ours


def test_one_variable_per_server_packs_nothing():
    model = build_mlp("gd")
    plan = ps_plan(model, servers=SERVERS[:1])
    plan = replace(plan, variables=tuple(v for v in plan.variables if v.name in ("dense/kernel", "global_step")))
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(0)))
    assert not [n for n in nodes if n.startswith("parallax_reads/")]
