"""The job plan: which processes, which roles and devices, which variables where (pure, no processes)."""

from __future__ import annotations

import pytest

from parallax.analysis import analyse_graph
from parallax.config import CommunicationConfig as Comm
from parallax.config import Config, MPIConfig, PSConfig
from parallax.job import make_job_plan
from parallax.resources import Device, parse_resource_text
from parallax.settings import derive
from tests.models import build_embedding, build_mlp


@pytest.fixture(scope="module")
def mlp():
    return analyse_graph(build_mlp("adam").graph)


@pytest.fixture(scope="module")
def embedding():
    return analyse_graph(build_embedding("adam").graph)


def job_for(text, analysis, gpus=0, **config):
    cluster = parse_resource_text(text, "res")
    settings = derive(Config(**config), True, cluster, gpus=gpus, cpu_count=8, environ={})
    return make_job_plan(cluster, settings, analysis)


@pytest.mark.parametrize("text, run_option, layout, roles", [
    ("localhost: cpu:0,cpu:1", "PS", "local", ("worker",)),
    ("localhost", "MPI", "local", ("worker",)),
    ("localhost: cpu:0,cpu:1", "MPI", "MPI", ("worker", "worker")),
    ("a: 0,1\nb: 0", "PS", "PS", ("worker", "ps", "worker", "ps")),
    ("localhost: cpu:0,cpu:1", None, "MPI", ("worker", "worker")),  # HYBRID without sparse gradients
    ("ps,a,2222,\nworker,a,2223,0\nworker,b,2224,cpu:0", "PS", "PS", ("worker", "ps", "worker")),  # by host
], ids=["one-local-worker-ps", "bare-local-host-mpi", "mpi-per-device", "ps-per-line", "hybrid-runs-as-mpi",
        "explicit-roles"])
def test_the_layout_and_roles_follow_the_resource_file_and_run_option(mlp, text, run_option, layout, roles):
    job = job_for(text, mlp, run_option=run_option)
    assert job.layout == layout
    assert tuple(p.role for p in job.processes) == roles
    assert [p.rank for p in job.processes] == list(range(len(roles)))


def test_hybrid_puts_sparse_variables_on_servers_and_launches_them(embedding):
    job = job_for("localhost: cpu:0,cpu:1", embedding)
    assert job.layout == "HYBRID" and job.servers
    assert [(p.role, p.index) for p in job.processes] == [("worker", 0), ("worker", 1), ("ps", 0)]
    syncs = {v.name: v.sync for v in job.plan.variables if v.gradient is not None}
    assert syncs["embedding"] == "ps" and syncs["proj/kernel"] == "allreduce"
    assert job.plan.server_devices == ("/job:ps/replica:0/task:0/device:CPU:0",)
    assert job.plan.workers[1].replica_devices == ("/job:worker/replica:0/task:1/device:CPU:1",)


def test_a_run_option_that_runs_as_another_layout_says_so(mlp):
    job = job_for("localhost: cpu:0,cpu:1", mlp, run_option="HYBRID")
    assert job.notes == ("run_option=HYBRID: no variable goes to parameter servers (no sparse gradient), so the "
                         "job runs as MPI",)
    assert "run_option=HYBRID runs as MPI" in job.plan.notes


def test_each_process_sees_its_own_gpus_numbered_from_zero(mlp):
    job = job_for("a: 2,3\nb", mlp, gpus=4, run_option="PS")
    worker_a, worker_b = job.workers
    assert (worker_a.visible_gpus, worker_a.devices) == ("2,3", (Device("gpu", 0), Device("gpu", 1)))
    assert (worker_b.visible_gpus, len(worker_b.devices)) == ("0,1,2,3", 4)  # a bare host: every GPU
    assert job.plan.workers[0].replica_devices == ("/job:worker/replica:0/task:0/device:GPU:0",
                                                   "/job:worker/replica:0/task:0/device:GPU:1")


def test_mpi_ranks_of_one_host_share_its_cores_and_keep_state_on_their_device(mlp):
    job = job_for("localhost: cpu:0,cpu:1", mlp, run_option="MPI")
    assert [p.sharing_host for p in job.processes] == [2, 2]
    assert not job.servers  # the mpi backend needs no TensorFlow server
    assert [(w.replica_devices, w.shared_device) for w in job.plan.workers] == [
        (("/device:CPU:0",), "/device:CPU:0"), (("/device:CPU:1",), "/device:CPU:1")]


def test_a_backend_that_needs_servers_gives_the_workers_task_devices(mlp):
    job = job_for("localhost: cpu:0,cpu:1", mlp, run_option="MPI",
                  communication_config=Comm(mpi_config=MPIConfig(backend="collective")))
    assert job.servers
    assert job.plan.workers[1].replica_devices == ("/job:worker/replica:0/task:1/device:CPU:1",)


def test_the_digest_is_the_same_for_the_same_inputs_and_changes_with_the_plan(mlp):
    one = job_for("localhost: cpu:0,cpu:1", mlp, run_option="MPI")
    again = job_for("localhost: cpu:0,cpu:1", analyse_graph(build_mlp("adam").graph), run_option="MPI")
    assert one.digest() == again.digest()
    assert one.digest() != job_for("localhost: cpu:0,cpu:1", analyse_graph(build_mlp("gd").graph),
                                   run_option="MPI").digest()
    assert one.digest() != job_for("localhost: cpu:0,cpu:1,cpu:2", mlp, run_option="MPI").digest()


def test_describe_lists_every_process_then_the_variable_plan(embedding):
    text = job_for("localhost: cpu:0,cpu:1", embedding).describe()
    lines = text.splitlines()
    assert lines[:4] == ["job: layout HYBRID, 3 process(es)",
                         "  rank 0: worker 0 on localhost: devices cpu:0",
                         "  rank 1: worker 1 on localhost: devices cpu:1",
                         "  rank 2: ps 0 on localhost: devices -"]
    assert lines[4].startswith("run_option=HYBRID sync=True workers=2 replicas=2")


def test_a_local_job_launches_nothing(mlp):
    job = job_for("localhost: cpu:0,cpu:1,cpu:2", mlp, run_option="PS")
    assert not job.launched and job.ranks == ()
    assert job.process(0).devices == (Device("cpu", 0), Device("cpu", 1), Device("cpu", 2))
    assert job.process(0).cpu_devices == 3
    assert job.describe().startswith("job: layout local, 1 process(es), this one (nothing is launched)")


@pytest.mark.parametrize("text, layout", [("a: cpu:0,cpu:1,cpu:2", "MPI"), ("a: cpu:0\nb: cpu:0\nc: cpu:0", "HYBRID")])
def test_auto_decides_the_layout_with_the_hosts_the_plan_has(embedding, text, layout):
    """3 workers: on one host all-gather and servers tie (all-gather then sends less); on three hosts
    a server on each gets a third of the rows from its own host, so servers send less between hosts.
    The layout and the plan's choices agree (the plan would need servers the layout lacks)."""
    job = job_for(text, embedding, run_option="AUTO")
    assert job.layout == layout
    assert job.plan.variable("embedding").sync == ("ps" if layout == "HYBRID" else "allgather")
    assert job.plan.server_hosts == (("a", "b", "c") if layout == "HYBRID" else ())


@pytest.mark.parametrize("text, run_option, environ, expected", [
    ("a: cpu:0,cpu:1\nb: cpu:0,cpu:1", None, {}, "default"),  # HYBRID across hosts: waits asleep
    ("localhost: cpu:0,cpu:1,cpu:2,cpu:3", None, {}, None),  # HYBRID on one host: polls
    ("a: cpu:0,cpu:1\nb: cpu:0,cpu:1", "MPI", {}, None),
    ("a: cpu:0,cpu:1\nb: cpu:0,cpu:1", "PS", {}, None),
    ("a: cpu:0,cpu:1\nb: cpu:0,cpu:1", None, {"PARALLAX_ARRIVAL_SPIN_US": "off"}, None),
    ("localhost: cpu:0,cpu:1", "MPI", {"PARALLAX_ARRIVAL_SPIN_US": "250"}, 250e-6),
], ids=["hybrid-hosts", "hybrid-one-host", "mpi", "ps", "env-off", "env-microseconds"])
def test_the_workers_mpi_calls_wait_asleep_where_polling_takes_the_servers_cores(embedding, text, run_option,
                                                                                   environ, expected):
    from parallax.comm.arrival import DEFAULT_SPIN_SECONDS
    from parallax.roles import arrival_spin

    cluster = parse_resource_text(text, "res")
    settings = derive(Config(run_option=run_option), True, cluster, gpus=0, cpu_count=2, environ=environ)
    job = make_job_plan(cluster, settings, embedding)
    assert arrival_spin(job, settings) == (DEFAULT_SPIN_SECONDS if expected == "default" else expected)


def test_one_worker_alone_names_each_setting_it_does_not_use_with_the_users_value(mlp):
    cluster = parse_resource_text("localhost: cpu:0,cpu:1", "res")
    config = Config(run_option="PS", plan_overrides={"dense*": "ps"}, communication_config=Comm(
        ps_config=PSConfig(replicate_variables=False, boundary_among_servers=False)))
    job = make_job_plan(cluster, derive(config, False, cluster, gpus=0, cpu_count=8, environ={}), mlp)
    assert job.layout == "local"
    assert job.notes == (
        "one worker trains alone here (the local layout): nothing crosses workers, so these settings are not used: "
        "sync=False (its replicas average their gradients in every step, in-graph), "
        "PSConfig.replicate_variables=False, PSConfig.boundary_among_servers=False, "
        "plan_overrides['dense*']['sync']='ps'",)
    assert "  note: one worker trains alone here" in job.describe()


@pytest.mark.parametrize("text, config", [
    ("localhost: cpu:0,cpu:1", {"run_option": "PS"}),
    ("localhost", {"run_option": "MPI"}),
    ("localhost", {"plan_overrides": {"dense*": {"density": 0.5}}}),
], ids=["defaults-ps", "defaults-mpi", "a-density-is-used-alone"])
def test_one_worker_alone_with_defaults_says_nothing(mlp, text, config):
    job = job_for(text, mlp, **config)
    assert job.layout == "local" and job.notes == ()


def test_zero_stage_alone_is_named_as_unused(mlp):
    job = job_for("localhost", mlp, run_option="MPI", zero_stage=1)
    assert job.layout == "local"
    assert job.notes[0].endswith("so these settings are not used: zero_stage=1")
