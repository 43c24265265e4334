from dataclasses import replace

import numpy as np
import pytest
import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.graph.graph_ops import ancestors, parse_input
from parallax.graph.names import release_op, sync_scope, unsynchronised_train_op
from parallax.plan import TaskSpec, build_plan
from parallax.plan.policies import place_by_bytes
from parallax.rewrite.pipeline import rewrite_for_task
from tests.models import build_embedding, build_mlp, build_sequence
from tests.unit.rewrite.helpers import export, nodes_of

SERVERS = ("/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0")


def ps_plan(model, num_workers=2, replicas=1, sync=True, servers=SERVERS):
    workers = []
    for w in range(num_workers):
        prefix = f"/job:worker/replica:0/task:{w}"
        workers.append(("h", tuple(f"{prefix}/device:CPU:{i}" for i in range(replicas)), f"{prefix}/device:CPU:0"))
    return build_plan(analyse_graph(model.graph), workers, run_option="PS", sync=sync, average_sparse=True,
                      cross_worker="ps", server_devices=servers)


def test_placement_balances_bytes_and_keeps_slots_with_their_variable():
    analysis = analyse_graph(build_embedding("adam").graph)
    placement = place_by_bytes(analysis, 2)
    # embedding group (320 B x 3 + beta powers) is the largest: alone on server 0
    assert placement["embedding"] == placement["embedding/Adam"] == placement["embedding/Adam_1"] == 0
    assert placement["proj/kernel"] == placement["proj/kernel/Adam"] == 1
    assert placement["global_step"] == 1


def test_partitions_spread_over_servers():
    plan = ps_plan(build_sequence("adam", partitions=2))
    servers = {v.name: v.server for v in plan.variables}
    assert servers["embedding/part_0"] != servers["embedding/part_1"]


def test_variables_and_their_update_ops_go_to_their_server():
    model = build_embedding("adam")
    plan = ps_plan(model)
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(0)))  # the chief, which updates
    server = SERVERS[plan.variable("embedding").server]
    assert nodes["embedding"].device == server
    assert nodes["embedding/Adam"].device == server
    assert nodes["Adam/update_embedding/ResourceScatterAdd"].device == server
    assert nodes["Adam/update_embedding/UnsortedSegmentSum"].device == server


def test_another_worker_runs_no_update_of_a_server_variable_and_what_follows_one_waits_for_the_chiefs():
    """Reached through a dependency (a traced step's outputs wait for its updates), an update on another
    worker runs nothing but waits for the chief's token, so a read after it sees the chief's update."""
    model = build_embedding("adam")
    nodes = nodes_of(rewrite_for_task(export(model.graph), ps_plan(model), TaskSpec(1)))
    for name in ("Adam/update_embedding/ResourceScatterAdd", "Adam/update_proj/kernel/ResourceApplyAdam"):
        assert nodes[name].op == "NoOp" and "^parallax_sync/step/Adam/wait" in nodes[name].input, name


def test_chief_takes_and_releases_the_others():
    model = build_embedding("adam")
    plan = ps_plan(model, num_workers=3)
    meta = rewrite_for_task(export(model.graph), plan, TaskSpec(0))
    nodes = nodes_of(meta)
    # a sparse gradient's rows: one queue on the server, one take per worker, concatenated
    assert nodes["parallax_sync/embedding/rows"].op == "FIFOQueueV2"
    assert nodes["parallax_sync/embedding/rows"].attr["shared_name"].s == b"parallax_sync/embedding/rows"
    assert nodes["parallax_sync/embedding/rows"].device == SERVERS[plan.variable("embedding").server]
    assert sorted(n for n, node in nodes.items() if node.op == "QueueDequeueV2") == [
        "parallax_sync/embedding/take_0", "parallax_sync/embedding/take_1", "parallax_sync/embedding/take_2"]
    assert nodes["parallax_sync/embedding/take"].op == "ConcatV2"
    assert "parallax_sync/embedding/accumulator" not in nodes
    assert nodes["parallax_sync/proj/kernel/accumulator"].op == "ResourceConditionalAccumulator"
    assert {"parallax_sync/step/Adam/release_1", "parallax_sync/step/Adam/release_2"} <= set(nodes)
    take = [n for n in nodes if n.startswith("parallax_sync/proj/kernel/take")]
    assert take, "chief must take the summed gradient"
    update_inputs = [i for n in nodes.values() if n.name.startswith("Adam/update_proj/kernel/") for i in n.input]
    assert any(i.startswith("parallax_sync/proj/kernel/take") for i in update_inputs)
    # the training op's name runs the original op (renamed), then the releases: nothing else writes a
    # server variable, so the others may go on as soon as the update is done
    assert nodes["parallax_sync/step/Adam/unsynchronised"].op == nodes_of(export(model.graph))["Adam"].op
    assert list(nodes["Adam"].input) == ["^parallax_sync/step/Adam/unsynchronised",
                                         "^parallax_sync/step/Adam/release_in_step"]
    release = nodes["parallax_sync/step/Adam/release_in_step"]
    assert {"^parallax_sync/step/Adam/release_1", "^parallax_sync/step/Adam/release_2"} <= set(release.input)
    assert "^parallax_sync/step/Adam/unsynchronised" in nodes["parallax_sync/step/Adam/release_1"].input
    assert release_op("Adam") not in nodes  # the session has nothing to run after the step


@pytest.mark.parametrize("idiom, later", [("group", []), ("deps_update_ops", []),
                                          ("update_ops", [f"moving/stat_{i}" for i in range(4)]),
                                          ("ema", ["net/hidden/bias/ExponentialMovingAverage",
                                                   "net/hidden/kernel/ExponentialMovingAverage",
                                                   "net/out/bias/ExponentialMovingAverage",
                                                   "net/out/kernel/ExponentialMovingAverage"])])
def test_the_release_waits_for_the_whole_step_when_something_writes_after_the_update(idiom, later):
    from parallax.rewrite.ps_sync import written_after
    from tests.idioms import IDIOMS

    model = IDIOMS[idiom]()
    plan = ps_plan(model, num_workers=2, servers=SERVERS[:1])
    train = plan.train_ops[0]
    meta = export(model.graph)
    assert written_after(meta, plan, train) == later
    nodes = nodes_of(rewrite_for_task(meta, plan, TaskSpec(0)))
    in_step = f"{sync_scope(train)}release_in_step"
    assert (in_step in nodes) == (not later)
    assert (release_op(train) in nodes) == bool(later)  # run by the session after the step and its hooks
    if later:
        assert not ancestors(nodes, [train]) & ancestors(nodes, [release_op(train)])


def test_with_the_users_hooks_the_session_releases_after_them():

    from parallax.plan.model import PSSpec

    model = build_embedding("adam")
    plan = replace(ps_plan(model, num_workers=2), ps=PSSpec(release_in_step=False))
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(0)))
    assert release_op("Adam") in nodes and "parallax_sync/step/Adam/release_in_step" not in nodes


def test_other_workers_apply_and_wait_for_their_token():
    model = build_embedding("adam")
    plan = ps_plan(model, num_workers=3)
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(2)))
    assert not [n for n in nodes if "/take" in n]
    assert nodes["parallax_sync/step/Adam/token_2"].attr["shared_name"].s == b"parallax_sync/step/Adam/token_2"
    assert "parallax_sync/step/Adam/token_1" not in nodes
    assert nodes["parallax_sync/step/Adam/wait"].op == "QueueDequeueV2"
    assert nodes["parallax_sync/step/Adam/wait"].device == SERVERS[0]
    assert nodes["Adam"].input == ["^parallax_sync/step/Adam/wait"]


@pytest.mark.parametrize("sync, divisor", [(True, 4.0), (False, 2.0)], ids=["sync", "async"])
def test_a_worker_averages_over_the_job_in_sync_and_over_its_own_replicas_in_async(sync, divisor):
    """Synchronous PS: each worker's part of the union-batch mean (the chief sums them). Asynchronous PS:
    each worker applies its own gradient, the mean over its own replicas' batches, as TF's between-graph
    asynchronous training does, not a 1/num_workers part of it."""
    import tensorflow as tf

    model = build_mlp("gd")
    plan = ps_plan(model, num_workers=2, replicas=2, sync=sync)
    meta = rewrite_for_task(export(model.graph), plan, TaskSpec(1))
    nodes = nodes_of(meta)
    division = nodes["parallax_aggregate/dense/kernel/truediv"]
    [constant] = [nodes[parse_input(i)[0]] for i in division.input if nodes[parse_input(i)[0]].op == "Const"]
    assert tf.make_ndarray(constant.attr["value"].tensor) == divisor


def test_async_adds_no_protocol():
    model = build_embedding("adam")
    nodes = nodes_of(rewrite_for_task(export(model.graph), ps_plan(model, sync=False), TaskSpec(1)))
    assert not [n for n in nodes if n.startswith("parallax_sync/")]
    assert nodes["embedding"].device.startswith("/job:ps/")


def test_same_plan_gives_the_same_graph_on_every_call():
    model = build_embedding("adagrad")
    plan = ps_plan(model)
    meta = export(model.graph)
    a = rewrite_for_task(meta, plan, TaskSpec(1)).graph_def.SerializeToString(deterministic=True)
    b = rewrite_for_task(meta, plan, TaskSpec(1)).graph_def.SerializeToString(deterministic=True)
    assert a == b


def _two_optimizers():
    import tensorflow as tf

    from tests.models import Model
    from tests.unit.analysis.test_analyse import two_variable_loss

    graph = tf.Graph()
    with graph.as_default():
        a, b, loss = two_variable_loss()
        first = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=[a])
        second = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, var_list=[b])
        tf.group(first, second, name="both")
    return Model(graph, {}, None, None), first.name, second.name


def test_each_training_op_gets_its_own_protocol_over_its_own_variables():
    model, first, second = _two_optimizers()
    for task in (0, 1):
        nodes = nodes_of(rewrite_for_task(export(model.graph), ps_plan(model), TaskSpec(task)))
        for train_op in (first, second):
            assert nodes[train_op].op == "NoOp"  # the name now runs the protocol
            assert f"parallax_sync/step/{train_op}/token_1" in nodes
        assert sorted(i.lstrip("^") for i in nodes["both"].input) == sorted([first, second])  # the group kept


def test_a_variable_updated_by_two_optimizer_calls_is_refused_with_its_name():
    import tensorflow as tf

    from parallax.analysis import analyse_graph
    from parallax.errors import AnalysisError
    from tests.unit.analysis.test_analyse import two_variable_loss

    graph = tf.Graph()
    with graph.as_default():
        a, b, loss = two_variable_loss()
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=[a])
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=[a, b], name="again")
    with pytest.raises(AnalysisError, match=r'^variable "a" is updated by 2 optimizer calls '
                                            r"\(GradientDescent, again\); .* var_list="):
        analyse_graph(graph)


@pytest.mark.parametrize("local_aggregation, applies, required", [(True, 1, 2), (False, 3, 6)])
def test_local_aggregation_sends_one_gradient_per_worker_instead_of_per_replica(local_aggregation, applies,
                                                                                 required):

    from parallax.plan.model import PSSpec

    model = build_embedding("adam")
    plan = replace(ps_plan(model, num_workers=2, replicas=3), ps=PSSpec(local_aggregation=local_aggregation))
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(0)))
    for var in ("embedding", "proj/kernel"):
        sends = [n for n in nodes.values() if n.name.startswith(f"parallax_sync/{var}/apply")
                 and ("Apply" in n.op or n.op == "QueueEnqueueV2")]
        assert len(sends) == applies
    assert nodes["parallax_sync/proj/kernel/take/num_required"].attr["value"].tensor.int_val == [required]
    takes = [n for n in nodes.values() if n.name.startswith("parallax_sync/embedding/") and n.op == "QueueDequeueV2"]
    assert len(takes) == required  # a sparse gradient: one take per sender's rows


@pytest.mark.parametrize("replicate", [True, False])
def test_replicate_variables_gives_each_replica_a_local_copy_of_dense_variables(replicate):

    from parallax.plan.model import PSSpec

    model = build_embedding("adam")
    plan = replace(ps_plan(model, num_workers=2, replicas=2), ps=PSSpec(replicate_variables=replicate))
    meta = rewrite_for_task(export(model.graph), plan, TaskSpec(1))
    nodes = nodes_of(meta)
    read0, read1 = nodes["MatMul/ReadVariableOp"], nodes["parallax_replica_1/MatMul/ReadVariableOp"]
    if not replicate:
        assert read0.input[0] == read1.input[0] == "proj/kernel"
        assert not [n for n in nodes if n.startswith("parallax_local/")]
        return
    assert read0.input[0] == "parallax_local/replica_0/proj/kernel"
    assert read1.input[0] == "parallax_local/replica_1/proj/kernel"
    assert "^parallax_local/replica_1/proj/kernel/refresh" in read1.input
    assert nodes["parallax_local/replica_1/proj/kernel"].device == "/job:worker/replica:0/task:1/device:CPU:1"
    assert len(meta.collection_def["local_variables"].bytes_list.value) == 2
    # sparse variables are read on the server (gathered rows), the chief's update reads the server
    assert not [n for n in nodes if n.startswith("parallax_local/") and "embedding" in n]
    chief = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(0)))
    assert "proj/kernel" in chief["Adam/update_proj/kernel/ResourceApplyAdam"].input


@pytest.mark.parametrize("boundary", [True, False])
def test_boundary_among_servers_moves_clipping_to_the_servers(boundary):

    from parallax.plan.model import PSSpec
    from tests.models import build_mlp

    model = build_mlp("adam", clip=1.0)
    plan = replace(ps_plan(model), ps=PSSpec(boundary_among_servers=boundary))
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(0)))
    scaling = ["clip_by_global_norm/mul_1", "clip_by_global_norm/clip_by_global_norm/_0",
               "clip_by_global_norm/Minimum"]
    devices = {nodes[name].device for name in scaling}
    if boundary:
        assert all(d.startswith("/job:ps/") for d in devices), devices
    else:
        assert devices == {"/job:worker/replica:0/task:0/device:CPU:0"}


@pytest.mark.parametrize("boundary", [True, False])
def test_boundary_between_workers_and_servers_decides_where_rows_are_gathered(boundary):

    from parallax.plan.model import PSSpec

    model = build_embedding("adam")
    plan = replace(ps_plan(model, replicas=2), ps=PSSpec(boundary_between_workers_and_servers=boundary))
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(1)))
    for r, name in enumerate(("embedding_lookup", "parallax_replica_1/embedding_lookup")):
        gather = nodes[name]
        if boundary:  # on the server, through colocation with the variable: only distinct rows travel
            rows = nodes[f"{name}/parallax_rows"]
            assert rows.op == "ResourceGather" and rows.device == SERVERS[plan.variable("embedding").server]
            assert nodes[parse_input(rows.input[1])[0]].op == "Unique"
            # the replica spreads them back, under the original name (readers and fetches unchanged)
            assert gather.op == "Reshape" and gather.device == f"/job:worker/replica:0/task:1/device:CPU:{r}"
        else:  # the replica reads the whole table and gathers locally
            assert gather.op == "GatherV2"
            assert gather.device == f"/job:worker/replica:0/task:1/device:CPU:{r}"
            read = nodes[f"{name}/parallax_read"]
            assert read.op == "ReadVariableOp" and read.input == ["embedding"]
            # read directly, or (a small table) packed with the worker's other reads from that server, once
            packed = [nodes[nodes[parse_input(i)[0]].input[0]] for n in nodes.values()
                      if n.name.startswith("parallax_reads/") and n.op == "ConcatV2" for i in n.input[:-1]]
            assert gather.input[0] == read.name or (
                gather.input[0].startswith("parallax_reads/")
                and [p.input for p in packed if p.input == ["embedding"]] == [["embedding"]])


def test_small_dense_gradients_bound_for_one_server_are_pushed_packed():
    import tensorflow as tf

    model = build_mlp("momentum")
    with model.graph.as_default():
        tf.reshape(model.loss, [-1])  # the program's own "Reshape": Parallax's ops must not take its name
        tf.concat([tf.reshape(model.loss, [1])] * 2, 0)
    plan = ps_plan(model, servers=SERVERS[:1])
    trainable = [v.name for v in plan.variables if v.gradient is not None]
    for task in (0, 1):
        nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(task)))
        scope = "parallax_sync/step/Momentum/packed_0/"
        assert nodes[scope + "accumulator"].device == SERVERS[0]
        assert nodes[scope + "apply"].device == SERVERS[0]
        pack = nodes["parallax_sync/step/Momentum/pack_0_0"]
        assert pack.op == "ConcatV2" and pack.device == plan.workers[task].shared_device
        assert not [n for n in nodes if n.startswith(tuple(f"parallax_sync/{v}/" for v in trainable))]
        takes = [n for n in nodes if n.startswith(scope + "take")]
        assert bool(takes) == (task == 0)  # only the chief takes, and its updates read the pieces
        if task == 0:
            update_inputs = {i for n in nodes.values() if n.name.startswith("Momentum/update_") for i in n.input}
            assert {f"{scope}unpack/Reshape{s}" for s in ("", "_1", "_2")} <= update_inputs


def test_a_gradient_of_256_kib_or_more_is_pushed_alone():
    from parallax.comm.packing import PACK_BELOW_BYTES

    model = build_embedding("adam")
    plan = ps_plan(model, servers=SERVERS[:1])
    big = [v.name for v in plan.variables if v.gradient is not None and not v.sparse
           and np.prod(v.shape) * 4 >= PACK_BELOW_BYTES]
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(0)))
    for name in big:
        assert f"parallax_sync/{name}/accumulator" in nodes
    assert "parallax_sync/embedding/rows" in nodes  # sparse: never packed


def _decoupled_weight_decay():
    """A TF1 program's decoupled weight decay: every weight shrunk in the step, before the update and after
    the gradients (as Keras 3's AdamW does), written by the program itself."""
    from types import SimpleNamespace

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 1]), use_resource=True)
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
        opt = tf.compat.v1.train.AdamOptimizer(0.1)
        grads = opt.compute_gradients(loss)
        with tf.control_dependencies([g for g, _ in grads]):
            decay = w.assign_sub(w * 0.01, name="decay").op
        with tf.control_dependencies([decay]):
            train = opt.apply_gradients(grads, name="train")
        graph.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train)
    return SimpleNamespace(graph=graph)


def test_the_chiefs_writes_in_the_step_wait_for_every_workers_gradient():
    """Another worker reads a server variable for its forward pass until its gradient is in: a write of the
    step that no gradient waits for (a weight decay) waits on the chief for every worker's gradients, as the
    update does; the other workers run none."""
    model = _decoupled_weight_decay()
    plan = ps_plan(model, num_workers=2, servers=SERVERS[:1])
    chief = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(0)))
    taken = f"{sync_scope('train')}taken"
    assert f"^{taken}" in chief["decay"].input
    assert {parse_input(i)[0] for i in chief[taken].input} == {"parallax_sync/w/take"}
    assert "decay" not in ancestors(chief, [taken])  # no cycle: the gradients come before the decay
    other = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(1)))
    assert other["decay"].op == "NoOp" and taken not in other


@pytest.mark.parametrize("fmt, wire", [("fp16", tf.float16), ("bf16", tf.bfloat16)])
@pytest.mark.parametrize("model_name", ["mlp", "embedding"])
def test_compressed_pushes_cast_on_the_worker_and_back_on_the_server(fmt, wire, model_name):
    """What crosses from the worker to the server is the 16-bit tensor: the cast to it runs on the worker,
    the cast back (and fp16's division by its scale) on the server, before the accumulator or queue."""
    model = {"mlp": build_mlp, "embedding": build_embedding}[model_name]("adam")
    plan = ps_plan(model)
    plan = replace(plan, comm=replace(plan.comm, compression=fmt))
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(1)))
    worker = "/job:worker/replica:0/task:1/device:CPU:0"
    down = [n for n in nodes.values() if n.op == "Cast" and n.attr["DstT"].type == wire.as_datatype_enum]
    assert down and all(n.device == worker and "/compress_" in n.name for n in down)
    up = [n for n in nodes.values() if n.op == "Cast" and nodes[parse_input(n.input[0])[0]] in down]
    assert len(up) == len(down) and all(n.device in SERVERS for n in up)
    scales = [n for n in nodes.values() if "/compress_" in n.name and n.op == "Pow"]
    assert bool(scales) == (fmt == "fp16")


def test_the_release_follows_the_writes_on_the_servers_unless_the_step_has_control_flow():
    """The tokens follow the step's writes of server variables, on the servers; a step with a conditional
    (here a learning rate; a traced step's update that may not run, as a loss scale's skipped step) releases
    after the training op instead: a token after an op that never runs would never be put."""
    from types import SimpleNamespace

    from parallax.rewrite.ps_sync import _server_writes

    def program(conditional: bool):
        graph = tf.Graph()
        with graph.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
            w = tf.compat.v1.get_variable("w", initializer=tf.ones([3, 1]), use_resource=True)
            loss = tf.reduce_mean(tf.square(tf.matmul(x, w)))
            rate = tf.cond(loss > 1.0, lambda: 0.1, lambda: 0.01) if conditional else 0.1  # an If op
            opt = tf.compat.v1.train.GradientDescentOptimizer(rate)
            train = opt.apply_gradients(opt.compute_gradients(loss), name="train")
            graph.add_to_collection(tf.compat.v1.GraphKeys.TRAIN_OP, train)
        return SimpleNamespace(graph=graph)

    for conditional in (False, True):
        model = program(conditional)
        plan = ps_plan(model, num_workers=2, servers=SERVERS[:1])
        writes = _server_writes(export(model.graph).graph_def, plan, plan.train_ops[0])
        assert bool(writes) != conditional
        chief = nodes_of(rewrite_for_task(export(model.graph), plan, TaskSpec(0)))
        after = {parse_input(i)[0] for i in chief[f"{sync_scope(plan.train_ops[0])}release_1"].input
                 if i.startswith("^")}
        assert after == ({unsynchronised_train_op(plan.train_ops[0])} if conditional else set(writes))
