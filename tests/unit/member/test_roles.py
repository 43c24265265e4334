"""What each kind of process brings to the start-up tail (parallax/member/roles.py), by its role in the job plan:
an MPI rank, a parameter server, a PS or HYBRID worker, a pipeline's stage server and its worker, and the one
process of a local job. Over a hand-written member (no processes, no servers, no MPI)."""

from __future__ import annotations

import pytest

from parallax.analysis import analyse_graph
from parallax.comm.arrival import DEFAULT_SPIN_SECONDS
from parallax.comm.group import Alone
from parallax.config import CommunicationConfig, Config, MPIConfig
from parallax.job.settings import derive
from parallax.member.protocol import NoHeartbeat
from parallax.member.roles import ProcessSetup, local_replicas, role_setup
from parallax.member.servers import GROUP_LEADER
from parallax.resources.cluster import Role
from parallax.resources.files import parse_resource_text
from tests.models import build_deep_mlp, build_embedding, build_mlp
from tests.unit.job.test_plan import job_for


class Member:
    """A member of the job as the roles see it (:class:`parallax.member.protocol.JobMember`), by its rank: it
    records what the role asks of it and hands back labelled stand-ins for servers, communicators and groups."""

    def __init__(self, rank: int):
        self.rank = rank
        self.asked: list[tuple] = []

    def process_in(self, job):
        return job.process(self.rank)

    def server(self, start, chief=False):
        self.asked.append(("server", chief))
        return start()

    def start_server(self, job, settings, process, group_leader=None):
        self.asked.append(("start_server", group_leader))
        return f"server of rank {process.rank}"

    def split_comms(self):
        self.asked.append(("split_comms",))
        return "workers' communicator", "host's communicator"

    def heartbeat(self, state, where=""):
        return state, where

    def exit_together(self, how, finish_timeout):
        self.asked.append(("exit_together", how))

    def broadcast(self, job, process, settings):
        return f"broadcast to worker {process.index}"

    def workers_group(self):
        return "the workers' group"


@pytest.fixture(scope="module")
def mlp():
    return analyse_graph(build_mlp("gd").graph)


@pytest.fixture(scope="module")
def embedding():
    return analyse_graph(build_embedding("gd").graph)


def settings_for(text, **config):
    cluster = parse_resource_text(text, "res")
    return derive(Config(**config), True, cluster, gpus=0, cpu_count=8)


TWO_RANKS = "localhost: cpu:0,cpu:1"


@pytest.mark.parametrize("rank", [0, 1])
def test_every_mpi_rank_initialises_then_takes_rank_0s_values_without_a_server_of_the_mpi_backend(mlp, rank):
    job = job_for(TWO_RANKS, mlp, run_option="MPI")
    member = Member(rank)
    setup = role_setup(job, settings_for(TWO_RANKS, run_option="MPI"), member)
    assert setup.process is job.process(rank) and setup.num_workers == 2
    assert setup.is_chief and setup.saves == (rank == 0)  # every rank initialises; rank 0 alone saves
    assert setup.server is None and setup.comms.group_leader is None and not setup.serve_only
    assert setup.broadcast == f"broadcast to worker {rank}" and setup.group == "the workers' group"
    assert setup.device_filters == ()
    assert setup.heartbeat == ("start", "initialising the variables and taking rank 0's values")
    assert member.asked == [("exit_together", "finish")]  # no server, no communicators split


def test_an_mpi_rank_of_a_backend_that_needs_servers_starts_one_that_leads_the_collective_groups(mlp):
    collective = CommunicationConfig(mpi_config=MPIConfig(backend="collective"))
    job = job_for(TWO_RANKS, mlp, run_option="MPI", communication_config=collective)
    member = Member(1)
    setup = role_setup(job, settings_for(TWO_RANKS, run_option="MPI", communication_config=collective), member)
    assert setup.server == "server of rank 1" and setup.comms.group_leader == GROUP_LEADER
    assert ("server", False) in member.asked and ("start_server", GROUP_LEADER) in member.asked  # rank 1: no chief


PS_TWO_HOSTS = "a: cpu:0\nb: cpu:0"  # ranks: worker 0 (a), ps 0 (a), worker 1 (b), ps 1 (b)


def test_a_parameter_server_serves_until_the_workers_have_finished(mlp):
    job = job_for(PS_TWO_HOSTS, mlp, run_option="PS")
    member = Member(1)
    setup = role_setup(job, settings_for(PS_TWO_HOSTS, run_option="PS"), member)
    assert setup.process.role == Role.PS and setup.process.index == 0
    assert setup.serve_only and setup.server == "server of rank 1" and setup.num_workers == 2
    assert setup.broadcast is None and setup.device_filters == ()
    assert member.asked == [("split_comms",), ("server", True), ("start_server", None), ("exit_together", "barrier")]


@pytest.mark.parametrize("rank, index, chief, where", [
    (0, 0, True, "initialising the variables"),
    (2, 1, False, "waiting for the chief (worker 0) to initialise the variables"),
])
def test_a_ps_worker_sees_the_servers_and_itself_and_waits_for_the_chief_unless_it_is_one(mlp, rank, index, chief,
                                                                                          where):
    job = job_for(PS_TWO_HOSTS, mlp, run_option="PS")
    member = Member(rank)
    setup = role_setup(job, settings_for(PS_TWO_HOSTS, run_option="PS"), member)
    assert setup.process.role == Role.WORKER and setup.process.index == index
    assert setup.is_chief == chief and setup.saves == chief and not setup.serve_only
    assert setup.device_filters == ("/job:ps", f"/job:worker/task:{index}")
    assert setup.heartbeat == ("start", where)
    assert setup.broadcast is None  # the workers hold no variables of their own to agree on
    assert setup.comms.workers == "workers' communicator" and setup.comms.groups == {}
    assert setup.comms.arrival_spin is None and setup.group == "the workers' group"
    assert ("server", chief) in member.asked


def test_a_hybrid_worker_on_several_hosts_also_has_its_hosts_communicator_a_broadcast_and_waits_asleep(embedding):
    text = "a: cpu:0,cpu:1\nb: cpu:0,cpu:1"  # ranks: workers 0, 1 and ps 0 on a; workers 2, 3 and ps 1 on b
    job = job_for(text, embedding, run_option="HYBRID")
    assert job.layout == "HYBRID"
    setup = role_setup(job, settings_for(text, run_option="HYBRID"), Member(3))
    assert (setup.process.role, setup.process.index, setup.num_workers) == (Role.WORKER, 2, 4)
    assert setup.broadcast == "broadcast to worker 2"
    assert setup.comms.workers == "workers' communicator"
    assert setup.comms.groups == {"host": "host's communicator"}
    assert setup.comms.arrival_spin == DEFAULT_SPIN_SECONDS


PIPELINE = "a: cpu:0\nb: cpu:0\na: cpu:1\nb: cpu:1"  # ranks: workers 0, 1 on a; their stage servers 0, 1 on b


@pytest.fixture(scope="module")
def pipeline_job():
    job = job_for(PIPELINE, analyse_graph(build_deep_mlp("adam").graph), run_option="MPI", pipeline_stages=2)
    return job, settings_for(PIPELINE, run_option="MPI", pipeline_stages=2)


def test_a_pipelines_worker_sees_its_own_stage_servers_and_all_reduces_among_the_workers_alone(pipeline_job):
    job, settings = pipeline_job
    member = Member(1)
    setup = role_setup(job, settings, member)
    assert (setup.process.role, setup.process.index) == (Role.WORKER, 1)
    assert setup.device_filters == ("/job:worker/task:1", "/job:stage/task:1")
    assert setup.server == "server of rank 1" and not setup.serve_only and setup.is_chief
    assert setup.comms.workers == "workers' communicator" and setup.comms.groups == {}
    assert setup.broadcast == "broadcast to worker 1"
    assert setup.heartbeat == ("start", "initialising the variables and taking worker 0's values")
    assert member.asked[0] == ("split_comms",) and member.asked[-1] == ("exit_together", "barrier")


def test_a_stage_server_serves_its_workers_stage_until_the_job_ends(pipeline_job):
    job, settings = pipeline_job
    setup = role_setup(job, settings, Member(2))
    assert (setup.process.role, setup.process.index) == (Role.STAGE, 0)
    assert setup.serve_only and setup.server == "server of rank 2" and setup.num_workers == 2


def test_the_one_process_of_a_local_job_shares_nothing(mlp):
    job = job_for("localhost: cpu:0,cpu:1", mlp, run_option="PS")
    assert job.layout == "local"
    setup = local_replicas(job, settings_for("localhost: cpu:0,cpu:1", run_option="PS"))
    assert setup.process is job.process(0) and setup.num_workers == 1
    assert setup.server is None and setup.broadcast is None and setup.on_close == ()
    assert setup.is_chief and setup.saves and not setup.serve_only
    assert isinstance(setup.group, Alone) and isinstance(setup.heartbeat, NoHeartbeat)


def test_only_worker_0_of_the_initialising_processes_saves(mlp):
    job = job_for(PS_TWO_HOSTS, mlp, run_option="PS")
    assert ProcessSetup(job.process(0), 2).saves
    assert not ProcessSetup(job.process(0), 2, is_chief=False).saves
    assert not ProcessSetup(job.process(2), 2).saves  # worker 1, though it initialises
