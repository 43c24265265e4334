from parallax.rewrite.aggregate import aggregate_gradients
from parallax.rewrite.pipeline import rewrite_for_task
from parallax.rewrite.replicate import replicate_graph
from tests.models import build_embedding
from tests.unit.rewrite.helpers import export, nodes_of, plan_for


def test_does_not_modify_its_input():
    model = build_embedding("adam")
    plan, task = plan_for(model, 2)
    replicated = replicate_graph(export(model.graph), plan, task)
    before = replicated.SerializeToString(deterministic=True)
    aggregate_gradients(replicated, plan, task)
    assert replicated.SerializeToString(deterministic=True) == before


def test_dense_gradients_are_averaged_and_sparse_ones_concatenated():
    model = build_embedding("adam")
    plan, task = plan_for(model, 2, average_sparse=False)
    nodes = nodes_of(rewrite_for_task(export(model.graph), plan, task))
    dense = plan.variable("proj/kernel").gradient.tensor
    add = nodes["parallax_aggregate/proj/kernel/local/AddN"]
    assert list(add.input) == [dense, "parallax_replica_1/" + dense]
    assert nodes["parallax_aggregate/proj/kernel/truediv"].op == "RealDiv"
    assert nodes["parallax_aggregate/proj/kernel/grad"].input == ["parallax_aggregate/proj/kernel/truediv"]
    sparse = plan.variable("embedding").gradient
    concat = [n for n in nodes.values() if n.name.startswith("parallax_aggregate/embedding/")
              and n.op == "ConcatV2"]
    assert len(concat) == 2  # values and indices
    assert not any(n.name.startswith("parallax_aggregate/embedding/") and n.op == "RealDiv"
                   for n in nodes.values())  # summed: average_sparse=False
    apply = nodes["Adam/update_proj/kernel/ResourceApplyAdam"]
    assert "parallax_aggregate/proj/kernel/grad" in apply.input
    assert "parallax_aggregate/embedding/values" in [
        i for n in nodes.values() if n.name.startswith("Adam/update_embedding/") for i in n.input]
    assert sparse.tensor not in [i for n in nodes.values() if n.name.startswith("Adam/update_embedding/")
                                 for i in n.input]


def test_aggregate_ops_live_on_the_shared_device_and_names_are_stable():
    model = build_embedding("gd")
    plan, task = plan_for(model, 2, average_sparse=True)
    meta = export(model.graph)
    a = rewrite_for_task(meta, plan, task)
    b = rewrite_for_task(meta, plan, task)
    assert a.graph_def.SerializeToString(deterministic=True) == b.graph_def.SerializeToString(deterministic=True)
    for n in a.graph_def.node:
        if n.name.startswith("parallax_aggregate/"):
            assert n.device == "/device:CPU:0"


def test_debug_dir_receives_one_file_per_pass(tmp_path):
    model = build_embedding("gd")
    plan, task = plan_for(model, 2)
    rewrite_for_task(export(model.graph), plan, task, debug_dir=str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "01_split_micro_batches.pbtxt", "02_replicate_graph.pbtxt", "03_aggregate_gradients.pbtxt",
        "04_shard_optimizer_states.pbtxt", "05_place_variables.pbtxt", "06_add_ps_sync.pbtxt",
        "07_use_local_copies.pbtxt", "08_pack_server_reads.pbtxt"]


def test_an_op_name_parallax_needs_is_a_clear_error():
    import pytest
    import tensorflow as tf

    from parallax.errors import RewriteError
    from tests.models import Model

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2])
        w = tf.compat.v1.get_variable("w", [2, 1])
        tf.identity(x, name="parallax_aggregate/w/grad")
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(tf.matmul(x, w)))
    plan, task = plan_for(Model(graph, {}, None, None), 2)
    with pytest.raises(RewriteError, match=r'op "parallax_aggregate/w/grad" that Parallax adds already exists'):
        rewrite_for_task(export(graph), plan, task)


def _mpi_plan(model, use_allgatherv: bool, backend: str = "mpi"):
    from parallax.analysis import analyse_graph
    from parallax.plan import build_plan
    from parallax.plan.model import CommSpec

    workers = [("localhost", (f"/job:worker/task:{w}/device:CPU:0",), f"/job:worker/task:{w}/device:CPU:0")
               for w in range(2)]
    return build_plan(analyse_graph(model.graph), workers, run_option="MPI", sync=True, average_sparse=True,
                      cross_worker="allreduce", comm=CommSpec(backend=backend, use_allgatherv=use_allgatherv))


def _gathers(meta):
    return sorted((n.name.rsplit("/", 1)[-1], n.attr["token"].s.decode()) for n in meta.graph_def.node
                  if n.op in ("PyFunc", "PyFuncStateless") and "allgather" in n.name)


def test_use_allgatherv_chooses_the_mpi_call_that_gathers_sparse_gradients():
    from parallax.plan import TaskSpec

    model = build_embedding("adam")
    with_v = rewrite_for_task(export(model.graph), _mpi_plan(model, True), TaskSpec(0))
    without = rewrite_for_task(export(model.graph), _mpi_plan(model, False), TaskSpec(0))
    assert _gathers(with_v) == [("allgatherv", "parallax_comm:mpi_allgatherv")]
    assert _gathers(without) == [("allgather", "parallax_comm:mpi_allgather")]  # padded, NCCL-style


def test_use_allgatherv_moves_the_collective_backend_s_sparse_gradients_to_mpi():
    from parallax.plan import TaskSpec

    model = build_embedding("adam")
    meta = rewrite_for_task(export(model.graph), _mpi_plan(model, True, backend="collective"), TaskSpec(0))
    assert _gathers(meta) == [("allgatherv", "parallax_comm:mpi_allgatherv")]
    plain = rewrite_for_task(export(model.graph), _mpi_plan(model, False, backend="collective"), TaskSpec(0))
    assert _gathers(plain) == [] and any(n.op == "CollectiveGatherV2" for n in plain.graph_def.node)
