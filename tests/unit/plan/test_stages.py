"""Pipeline and model parallelism in the plan (pure: no processes): config checks, the cut, ranks
grouping a pipeline's devices, what is refused and why, and the plan's round trip."""

from __future__ import annotations

import pytest

from parallax.analysis import analyse_graph
from parallax.config import CommunicationConfig, Config, MPIConfig
from parallax.errors import PlanError, ResourceFileError
from parallax.plan import Plan
from parallax.plan.stages import cut_forward, fit_stages
from tests.models import build_deep_mlp, build_embedding, build_mlp
from tests.unit.job.test_plan import job_for


@pytest.fixture(scope="module")
def deep():
    return analyse_graph(build_deep_mlp("adam").graph)


@pytest.mark.parametrize("field, value, message", [
    ("pipeline_stages", 0, "must be a positive int"),
    ("micro_batches", "4", "must be a positive int"),
    ("pipeline_cuts", "layer_2", "must be a list of op or scope names"),
    ("device_memory", "16 parsecs", "must be a size such as 16GB"),
    ("device_memory", -1, "must be a positive number of bytes"),
    ("plan_overrides", {"emb": {"stage": -1}}, "stage must be a pipeline stage's index"),
    ("pipeline_schedule", "interleaved", "must be 'gpipe'"),
])
def test_a_bad_pipeline_field_names_itself(field, value, message):
    with pytest.raises((TypeError, ValueError), match=message):
        Config(**{field: value})


def test_named_cuts_set_the_stages_and_must_agree_with_them():
    assert Config(pipeline_cuts=["a", "b"]).stages == 3
    with pytest.raises(ValueError, match="make 3 stages, but pipeline_stages=2"):
        Config(pipeline_cuts=["a", "b"], pipeline_stages=2).validate()
    with pytest.raises(ValueError, match="needs sync=True"):
        Config(micro_batches=2).validate(sync=False)
    assert Config(device_memory="1.5GiB").device_memory == 1610612736


def test_the_cost_cut_follows_the_layers_and_balances_them(deep):
    cuts, costs = cut_forward(deep.forward, 3)
    assert [c.split("/")[0] for c in cuts] == ["layer_2", "layer_4"]
    assert max(costs) < 0.45 * sum(costs)


def test_mpi_ranks_take_a_pipeline_s_devices_together(deep):
    job = job_for("localhost: cpu:0,cpu:1,cpu:2,cpu:3", deep, run_option="MPI", pipeline_stages=2)
    assert [str(d) for p in job.processes for d in p.devices] == ["cpu:0", "cpu:1", "cpu:2", "cpu:3"]
    assert [len(p.devices) for p in job.processes] == [2, 2]
    assert job.plan.pipeline.devices == ((("/device:CPU:0", "/device:CPU:1"),), (("/device:CPU:2", "/device:CPU:3"),))
    assert job.plan.num_replicas == 2
    with pytest.raises(ResourceFileError, match=r"res lists 3 device\(s\), but pipeline_stages=2 needs each "
                                                r"replica's 2 stages: list a multiple of 2"):
        job_for("localhost: cpu:0,cpu:1,cpu:2", deep, run_option="MPI", pipeline_stages=2)


def test_stages_whose_devices_are_on_several_lines_are_processes_of_their_own(deep):
    """One device a line (here on two hosts): each replica is a worker and a stage server; the worker's
    later stages are the stage servers' devices, reached over gRPC."""
    job = job_for("a: cpu:0\nb: cpu:0\na: cpu:1\nb: cpu:1", deep, run_option="MPI", pipeline_stages=2)
    assert [(p.role, p.index, p.host, str(p.devices[0])) for p in job.processes] == [
        ("worker", 0, "a", "cpu:0"), ("worker", 1, "a", "cpu:1"),
        ("stage", 0, "b", "cpu:0"), ("stage", 1, "b", "cpu:1")]
    assert job.servers and job.layout == "MPI"
    assert job.plan.pipeline.devices == (
        (("/job:worker/replica:0/task:0/device:CPU:0", "/job:stage/replica:0/task:0/device:CPU:0"),),
        (("/job:worker/replica:0/task:1/device:CPU:1", "/job:stage/replica:0/task:1/device:CPU:1"),))
    assert job.plan.num_replicas == 2 and len(job.workers) == 2
    assert "rank 2: stage 0 on b: devices cpu:0" in job.describe()


def test_stages_in_processes_of_their_own_need_mpi_and_its_mpi_backend(deep):
    four = "a: cpu:0\nb: cpu:0\na: cpu:1\nb: cpu:1"
    with pytest.raises(PlanError, match="runs with run_option 'MPI' and the 'mpi' all-reduce backend, not MPI / "
                                        "'collective'"):
        job_for(four, deep, run_option="MPI", pipeline_stages=2,
                communication_config=CommunicationConfig(mpi_config=MPIConfig(backend="collective")))
    with pytest.raises(PlanError, match="does not run with parameter servers across processes"):
        job_for(four, deep, run_option="PS", pipeline_stages=2)


def test_a_pipeline_with_servers_across_processes_is_refused_with_the_reason(deep):
    with pytest.raises(PlanError, match="does not run with parameter servers across processes"):
        job_for("a: cpu:0,cpu:1\nb: cpu:0,cpu:1", deep, run_option="PS", pipeline_stages=2)


def test_a_graph_without_training_has_no_stages_to_cut():
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2])
        tf.matmul(x, tf.compat.v1.get_variable("w", [2, 2]))
    with pytest.raises(PlanError, match="has no optimizer update"):
        job_for("localhost: cpu:0,cpu:1", analyse_graph(graph), run_option="PS", pipeline_stages=2)


def test_a_stage_placed_out_of_range_or_over_memory_is_refused(deep):
    with pytest.raises(PlanError, match="puts layer_0/kernel on stage 2, but the pipeline has 2 stage"):
        job_for("localhost: cpu:0,cpu:1", deep, run_option="PS", pipeline_stages=2,
                plan_overrides={"layer_0/kernel": {"stage": 2}})
    with pytest.raises(PlanError, match=r"device_memory=4000 bytes, but stage 0 holds \d+ bytes"):
        job_for("localhost: cpu:0,cpu:1", deep, run_option="PS", pipeline_stages=2, device_memory=4000)
    with pytest.raises(PlanError, match="largest variable, layer_1/kernel, holds 1024 bytes"):
        fit_stages(deep, 4000, [2])


def test_the_plan_keeps_its_pipeline_through_json():
    job = job_for("localhost: cpu:0,cpu:1", analyse_graph(build_embedding("adam").graph), run_option="PS",
                  pipeline_stages=2, micro_batches=4, plan_overrides={"embedding": {"stage": 1}})
    plan = job.plan
    assert Plan.from_dict(plan.to_dict()) == plan
    assert plan.variable("embedding").stage == 1 and plan.variable("embedding/Adam").stage == 1
    assert "bubble (k-1)/(m+k-1) = 0.20" in plan.describe()


def test_without_a_pipeline_nothing_changes():
    job = job_for("localhost: cpu:0,cpu:1", analyse_graph(build_mlp("adam").graph), run_option="PS")
    assert not job.plan.pipeline.active and "pipeline" not in job.plan.describe()
    assert job.plan.stage_devices(0) == (("/device:CPU:0",), ("/device:CPU:1",))
