"""The job plan: which processes, which roles and devices, which variables where (pure, no processes)."""

from __future__ import annotations

import pytest

from parallax.analysis import analyse_graph
from parallax.config import CommunicationConfig as Comm
from parallax.config import Config, MPIConfig, PSConfig
from parallax.invocation import Invocation
from parallax.job.plan import make_job_plan
from parallax.job.settings import derive
from parallax.resources.files import Device, parse_resource_text
from tests.models import build_embedding, build_mlp
from tests.unit.plan.test_policies import lm1b_like


@pytest.fixture(scope="module")
def mlp():
    return analyse_graph(build_mlp("adam").graph)


@pytest.fixture(scope="module")
def embedding():
    return analyse_graph(build_embedding("adam").graph)


def job_for(text, analysis, gpus=0, **config):
    cluster = parse_resource_text(text, "res")
    settings = derive(Config(**config), True, cluster, gpus=gpus, cpu_count=8)
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


def test_autos_choice_of_layout_is_a_choice_not_a_warning(mlp):
    job = job_for("localhost: cpu:0,cpu:1", mlp, run_option="AUTO")
    assert job.layout == "MPI" and job.notes == ()
    assert job.choices == ("run_option=AUTO: no variable goes to parameter servers (the cost model chose all-reduce "
                           "or all-gather for every variable), so the job runs as MPI",)
    assert f"  note: {job.choices[0]}" in job.describe()


def test_a_sparse_gradient_tied_to_the_all_reduced_updates_is_the_reason_hybrid_runs_as_mpi():
    clipped = analyse_graph(build_embedding("adam", clip=0.5).graph)  # clip_by_global_norm over every gradient
    job = job_for("localhost: cpu:0,cpu:1", clipped, run_option="HYBRID")
    assert job.layout == "MPI"
    assert job.notes == ("run_option=HYBRID: no variable goes to parameter servers (embedding: allgather instead of "
                         "ps, because its gradient feeds the update of all-reduced variables (e.g. "
                         "clip_by_global_norm, or a loss scale optimizer's check that all gradients are finite)), so "
                         "the job runs as MPI",)


def test_each_process_sees_its_own_gpus_numbered_from_zero(mlp):
    job = job_for("a: 2,3\nb", mlp, gpus=4, run_option="PS")
    worker_a, worker_b = job.workers
    assert (worker_a.visible_gpus, worker_a.devices) == ("2,3", (Device("gpu", 0), Device("gpu", 1)))
    assert (worker_b.visible_gpus, len(worker_b.devices)) == ("0,1,2,3", 4)  # a bare host: every GPU
    assert job.plan.workers[0].replica_devices == ("/job:worker/replica:0/task:0/device:GPU:0",
                                                   "/job:worker/replica:0/task:0/device:GPU:1")


# AUTO: the small embedding's servers would save less than their chain costs a step (parallax.plan.cost), so MPI
@pytest.mark.parametrize("run_option, layout", [("MPI", "MPI"), (None, "HYBRID"), ("HYBRID", "HYBRID"),
                                                 ("AUTO", "MPI")], ids=["mpi", "default", "hybrid", "auto"])
def test_a_bare_host_runs_a_process_on_each_of_its_gpus_in_mpi_and_hybrid(embedding, run_option, layout):
    job = job_for("hostA\nhostB", embedding, gpus=4, run_option=run_option)
    assert job.layout == layout
    for host in ("hostA", "hostB"):
        workers = [p for p in job.workers if p.host == host]
        assert [p.visible_gpus for p in workers] == ["0", "1", "2", "3"]  # each its own GPU of the host
        assert {p.devices for p in workers} == {(Device("gpu", 0),)}  # which it sees as GPU 0
        assert [p.visible_device_list for p in workers] == ["0"] * 4
        assert [p.sharing_host for p in workers] == [4] * 4
    assert len(job.plan.workers) == 8
    servers = [p for p in job.processes if p.role == "ps"]
    assert all(p.visible_gpus is None and p.visible_device_list is None for p in servers)


def test_a_bare_host_gives_its_one_ps_worker_every_gpu(mlp):
    job = job_for("hostA\nhostB", mlp, gpus=4, run_option="PS")
    assert job.layout == "PS"
    assert [(p.host, p.visible_gpus, p.visible_device_list, len(p.devices)) for p in job.workers] == [
        ("hostA", "0,1,2,3", "0,1,2,3", 4), ("hostB", "0,1,2,3", "0,1,2,3", 4)]


def test_listed_gpus_are_each_processs_own_renumbered_from_zero(mlp):
    job = job_for("a: 1,3\nb: 2", mlp, gpus=4, run_option="MPI")
    assert [(p.host, p.visible_gpus, p.visible_device_list) for p in job.workers] == [
        ("a", "1", "0"), ("a", "3", "0"), ("b", "2", "0")]
    assert job.plan.workers[1].replica_devices == ("/job:worker/replica:0/task:1/device:GPU:0",)  # collective


def test_describe_shows_the_gpus_of_the_host_each_process_gets(mlp):
    lines = job_for("hostA", mlp, gpus=2, run_option="MPI").describe().splitlines()
    assert lines[:3] == ["job: layout MPI, 2 process(es)",
                         "  rank 0: worker 0 on hostA: devices gpu:0 (the host's GPU 0)",
                         "  rank 1: worker 1 on hostA: devices gpu:0 (the host's GPU 1)"]
    lines = job_for("hostA: 2,3", mlp, gpus=4, run_option="PS").describe().splitlines()
    assert lines[1] == "  rank 0: worker 0 on hostA: devices gpu:0, gpu:1 (the host's GPUs 2,3)"


def test_a_bare_local_host_alone_keeps_every_gpu_in_one_process_only_in_ps(mlp):
    alone = job_for("localhost", mlp, gpus=4, run_option="PS")
    assert alone.layout == "local" and alone.process(0).devices == tuple(Device("gpu", i) for i in range(4))
    assert alone.process(0).visible_device_list is None  # the calling process: the host's ids, as listed
    assert len(job_for("localhost", mlp, gpus=4, run_option="MPI").processes) == 4


def test_without_gpus_a_bare_host_is_one_cpu_replica_in_every_layout(mlp):
    for run_option in ("MPI", "PS"):
        job = job_for("hostA\nhostB", mlp, gpus=0, run_option=run_option)
        assert [(p.devices, p.visible_gpus) for p in job.workers] == [((Device("cpu", 0),), None)] * 2
        assert [r.devices for r in job.ranks if r.role == "worker"] == [None, None]


def test_a_role_line_whose_port_would_serve_a_process_per_gpu_is_refused(mlp):
    from parallax.errors import PlanError

    with pytest.raises(PlanError, match=r"^res, line 1: the worker line of a with port 2222 leaves its device to the "
                                        r"host, whose 4 GPUs make 4 processes in MPI \(one per GPU\)"):
        job_for("worker,a,2222,\nworker,b,2222,0", mlp, gpus=4, run_option="MPI")
    assert job_for("worker,a,2222,\nworker,b,2222,0", mlp, gpus=4, run_option="PS").workers[0].port == 2222


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
def test_auto_decides_the_layout_with_the_hosts_the_plan_has(text, layout):
    """3 workers and an embedding of LM1B's size: on one host all-gather and servers tie (all-gather then
    sends less); on three hosts a server on each gets a third of the rows from its own host, so servers
    send 10 MB less between hosts per step, more than their chain costs at 10 Gbit/s. The layout and the
    plan's choices agree (the plan would need servers the layout lacks)."""
    job = job_for(text, lm1b_like(), run_option="AUTO")
    assert job.layout == layout
    assert job.plan.variable("emb").sync == ("ps" if layout == "HYBRID" else "allgather")
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
    from parallax.member.roles import arrival_spin

    cluster = parse_resource_text(text, "res")
    settings = derive(Config(run_option=run_option), True, cluster, gpus=0, cpu_count=2,
                      invocation=Invocation.from_env(environ))
    job = make_job_plan(cluster, settings, embedding)
    assert arrival_spin(job, settings) == (DEFAULT_SPIN_SECONDS if expected == "default" else expected)


def test_one_worker_alone_names_each_setting_it_does_not_use_with_the_users_value(mlp):
    cluster = parse_resource_text("localhost: cpu:0,cpu:1", "res")
    config = Config(run_option="PS", plan_overrides={"dense*": "ps"}, communication_config=Comm(
        ps_config=PSConfig(replicate_variables=False, boundary_among_servers=False)))
    job = make_job_plan(cluster, derive(config, False, cluster, gpus=0, cpu_count=8), mlp)
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
