"""The HYBRID rewrite without processes: what each worker's graph holds."""

from __future__ import annotations

import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.graph.names import sync_scope, unsynchronised_train_op
from parallax.plan import TaskSpec, build_plan
from parallax.rewrite.pipeline import rewrite_for_task
from tests.models import build_embedding
from tests.unit.rewrite.helpers import export, nodes_of

SERVER = "/job:ps/replica:0/task:0/device:CPU:0"


def hybrid(model, hosts=("h", "h", "g")):
    workers = [(host, (f"/job:worker/replica:0/task:{w}/device:CPU:0",), f"/job:worker/replica:0/task:{w}/device:CPU:0")
               for w, host in enumerate(hosts)]
    return build_plan(analyse_graph(model.graph), workers, run_option="HYBRID", sync=True, average_sparse=True,
                      cross_worker="hybrid", server_devices=(SERVER,))


def rewrite(model, plan, worker):
    return rewrite_for_task(export(model.graph), plan, TaskSpec(worker))


def test_server_variables_on_the_server_the_rest_on_the_worker():
    model = build_embedding("adam")
    plan = hybrid(model)
    meta = rewrite(model, plan, 1)
    nodes = nodes_of(meta)
    assert nodes["embedding"].device == nodes["embedding/Adam"].device == SERVER
    worker = "/job:worker/replica:0/task:1/device:CPU:0"
    # Adam's beta1_power is colocated with "embedding" by TensorFlow, but each worker keeps its own
    assert nodes["beta1_power"].device == worker and "_class" not in nodes["beta1_power"].attr
    assert nodes["proj/kernel"].device != SERVER
    local = meta.collection_def[tf.compat.v1.GraphKeys.LOCAL_VARIABLES].bytes_list.value
    assert len(local) == 6  # proj/kernel (+2 slots), global_step, beta1/2_power: each worker initializes its own
    chief = rewrite(model, plan, 0)
    assert not chief.collection_def[tf.compat.v1.GraphKeys.LOCAL_VARIABLES].bytes_list.value  # restored, not re-run


def test_other_workers_leave_server_updates_to_the_chief_but_run_their_own():
    model = build_embedding("adam")
    plan = hybrid(model)
    chief, other = nodes_of(rewrite(model, plan, 0)), nodes_of(rewrite(model, plan, 1))
    sparse_update = [n for n in other if "update_embedding/" in n]
    assert sparse_update and all(other[n].op == "NoOp" for n in sparse_update)
    assert any(chief[n].op != "NoOp" for n in sparse_update)
    assert any(n.op == "ResourceApplyAdam" for n in other.values())  # its own dense update
    wait = other[sync_scope(plan.train_ops[0]) + "wait"]
    # runs the (renamed) training op beside its wait (the wait, on the server, does not wait for it: that
    # would add a round trip to every step's chain); the step is done when both are
    done = other[plan.train_ops[0]]
    assert not any(i.lstrip("^") == unsynchronised_train_op(plan.train_ops[0]) for i in wait.input)
    assert [i.lstrip("^") for i in done.input] == [unsynchronised_train_op(plan.train_ops[0]), wait.name]


def test_host_aggregation_one_sender_per_host():
    model = build_embedding("adam")
    plan = hybrid(model)  # hosts h, h, g: workers 0 and 2 lead their hosts
    applies = {w: [n for n in nodes_of(rewrite(model, plan, w)) if n.endswith("/apply")] for w in range(3)}
    assert len(applies[0]) == 1 and len(applies[2]) == 1 and applies[1] == []
    chief = nodes_of(rewrite(model, plan, 0))
    assert chief["parallax_sync/embedding/take"].op == "ConcatV2"  # the rows of the two hosts
    assert sorted(n for n, node in chief.items() if node.op == "QueueDequeueV2") == [
        "parallax_sync/embedding/take_0", "parallax_sync/embedding/take_1"]
    meta = rewrite(model, plan, 1)
    train_op = nodes_of(meta)[plan.train_ops[0]]  # the training op's name now runs the protocol
    assert train_op.op == "NoOp" and train_op.input == [f"^{unsynchronised_train_op(plan.train_ops[0])}",
                                                        f"^{sync_scope(plan.train_ops[0])}wait"]
    host_ops = {n: node for n, node in nodes_of(meta).items() if n.startswith("parallax_aggregate/host/")}
    # the rows go to the host's first worker only (Gatherv), after each worker merged its duplicates
    assert [n.attr["token"].s for n in host_ops.values() if n.op == "PyFunc"] == [b"parallax_comm:mpi_gatherv@host"]
    assert any(n.startswith("parallax_aggregate/embedding/dedup/") for n in nodes_of(meta))


def test_the_chiefs_chain_stays_on_the_server():
    """The chief's takes, the updates of the server variables and the tokens for the others follow each other
    on the server: no control edge goes back to the chief's worker in between (each one a round trip on every
    step's chain)."""
    model = build_embedding("adam")
    plan = hybrid(model)
    chief = nodes_of(rewrite(model, plan, 0))
    step = sync_scope(plan.train_ops[0])
    updates = [n for n, node in chief.items() if "update_embedding/" in n and node.op != "NoOp"
               and node.device == SERVER and node.op.startswith(("Resource", "Assign"))]
    assert updates
    assert not any(i.lstrip("^") == f"{step}taken" for n in updates for i in chief[n].input)
    release = chief[f"{step}release_1"]
    assert release.device == SERVER
    after = {i.lstrip("^") for i in release.input if i.startswith("^")}
    assert set(updates) <= after and unsynchronised_train_op(plan.train_ops[0]) not in after
    assert all(chief[n].device == SERVER for n in after)


def test_a_keras_3_embeddings_rows_are_gathered_on_the_server():
    """Keras 3's Embedding takes its rows by a ``GatherV2`` of the table's value (``ops.take``), not a
    ``ResourceGather``: the gather runs on the server, of the batch's distinct ids, and only those rows travel, as
    for TF1's ``embedding_lookup`` (it used to carry the whole table to every worker each step)."""
    from parallax.graph.graph_ops import parse_input
    from parallax.tf2.trace import trace_step
    from tests.models import keras_embedding_step

    traced = trace_step(keras_embedding_step())
    plan = hybrid(traced)
    [table] = [v.name for v in plan.variables if v.server is not None and v.slot_of is None]  # Keras names it
    assert table.endswith("/embeddings"), table
    nodes = nodes_of(rewrite_for_task(export(traced.graph), plan, TaskSpec(1)))
    [rows] = [n for n in nodes.values() if n.name.endswith("/parallax_rows")]
    assert rows.op == "GatherV2" and rows.device == SERVER and sorted(rows.attr) == ["Taxis", "Tindices", "Tparams",
                                                                                  "batch_dims"]
    assert nodes[parse_input(rows.input[1])[0]].op == "Unique"
    assert nodes[parse_input(rows.input[2])[0]].device == SERVER  # the axis: no transfer of its own
    spread = nodes[rows.name.rsplit("/", 1)[0]]
    assert spread.op == "Reshape" and spread.device == "/job:worker/replica:0/task:1/device:CPU:0"
    reads = {n.name for n in nodes.values() if n.op == "ReadVariableOp" and n.input[0] == table}
    off_server = [n.name for n in nodes.values() if n.device != SERVER
                  and {parse_input(i)[0] for i in n.input if not i.startswith("^")} & reads]
    assert not off_server, f"the whole table goes to the worker for {off_server}"
