"""``derive(config, sync, cluster) -> Settings``: every open decision made once, the user's config untouched."""

from __future__ import annotations

import dataclasses
import os
import re

import pytest
import tensorflow as tf

import parallax
from parallax.invocation import (
    ARRIVAL_SPIN_ENV,
    CACHE_ENV,
    FINISH_TIMEOUT_ENV,
    HUGE_PAGES_ENV,
    NATIVE_OPS_ENV,
    CommTuning,
    Invocation,
    LaunchIdentity,
)
from parallax.job.settings import Timeouts, derive
from parallax.launch.launcher import MPIRUN_OPTIONS_ENV
from parallax.resources.files import parse_resource_text

CPU = parse_resource_text("localhost: cpu:0,cpu:1", "res")
GPU = parse_resource_text("a: 0,1", "res")
BARE = parse_resource_text("a\nb", "res")


def settings(config=None, sync=True, cluster=CPU, gpus=0, environ=None):
    """The settings of ``config`` with what ``environ`` asks (read as ``parallel_run`` reads the environment)."""
    return derive(config or parallax.Config(), sync, cluster, gpus=gpus, cpu_count=4,
                  invocation=Invocation.from_env(environ or {}))


@pytest.mark.parametrize("run_option, sync, expected", [
    (None, True, "HYBRID"), (None, False, "PS"), ("MPI", True, "MPI"), ("ps", False, "PS"), ("AUTO", True, "AUTO"),
], ids=["default", "default-async-is-ps", "mpi", "lower-case", "auto"])
def test_the_run_option_in_force(run_option, sync, expected):
    assert settings(parallax.Config(run_option=run_option), sync).run_option == expected


def test_async_with_an_all_reduce_run_option_is_refused_naming_the_rule():
    with pytest.raises(ValueError, match=r"^sync=False needs run_option='PS' \(got run_option='MPI'\)"):
        settings(parallax.Config(run_option="MPI"), sync=False)


@pytest.mark.parametrize("backend, cluster, gpus, allreduce, server", [
    ("auto", CPU, 0, "mpi", "mpi"),
    ("auto", GPU, 2, "collective", "mpi"),
    ("auto", BARE, 1, "collective", "mpi"),  # a bare host stands for this machine's GPUs
    ("auto", BARE, 0, "mpi", "mpi"),
    ("collective", CPU, 0, "collective", "mpi"),  # never TF collectives beside parameter servers
    ("horovod", CPU, 0, "horovod", "horovod"),
], ids=["auto-cpu", "auto-gpu", "auto-bare-host-with-gpus", "auto-bare-host-without", "collective", "horovod"])
def test_backends_for_each_purpose(backend, cluster, gpus, allreduce, server):
    cfg = parallax.Config(communication_config=parallax.CommunicationConfig(
        mpi_config=parallax.MPIConfig(backend=backend)))
    s = settings(cfg, cluster=cluster, gpus=gpus)
    assert (s.allreduce_comm.backend, s.server_comm.backend) == (allreduce, server)
    assert s.comm_for("MPI") is s.allreduce_comm and s.comm_for("HYBRID") is s.server_comm
    assert s.allreduce_comm.host_backend == "mpi"


def test_use_allgatherv_sends_sparse_gradients_through_mpi_whatever_the_backend():
    cfg = parallax.Config(communication_config=parallax.CommunicationConfig(
        mpi_config=parallax.MPIConfig(backend="collective", use_allgatherv=True)))
    s = settings(cfg)
    assert (s.allreduce_comm.backend, s.allreduce_comm.gather_backend) == ("collective", "mpi")
    assert settings().allreduce_comm.gather_backend == "mpi"


def test_collective_asked_for_beside_servers_is_noted():
    cfg = parallax.Config(communication_config=parallax.CommunicationConfig(
        mpi_config=parallax.MPIConfig(backend="collective")))
    assert "over MPI" in settings(cfg).notes[0]
    assert settings(parallax.Config(run_option="MPI")).notes == ()


def test_threads_share_the_cores_among_the_processes_of_a_host():
    s = settings()
    assert [s.threads_per_process(n) for n in (1, 2, 3, 8)] == [0, 2, 1, 1]


def test_the_cores_shared_are_those_the_process_may_run_on_and_a_bound_rank_takes_its_own(monkeypatch):
    """Ranks share the cores this process may run on (its CPU affinity, which a container's cpuset narrows), not
    every core of the machine; a rank the launcher bound to cores of its own (a job on its machine alone, which
    the launcher tells the ranks: LaunchIdentity.bound_cores) sizes its pools to those, its affinity then."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2}, raising=False)  # 3 of the machine's cores
    shared = derive(parallax.Config(), True, CPU, gpus=0)
    assert (shared.cpu_count, shared.bound_cores, shared.threads_per_process(3)) == (3, None, 1)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {4, 5}, raising=False)  # bound to 2 of 4 by mpirun
    launched = Invocation.from_env(Invocation(launch=LaunchIdentity("[]", "MPI", bound_cores=2)).to_env())
    bound = derive(parallax.Config(), True, CPU, gpus=0, invocation=launched)
    assert (bound.cpu_count, bound.bound_cores, bound.threads_per_process(2)) == (2, 2, 2)


def test_timeouts_and_mpirun_options_come_from_the_config_and_the_environment():
    cfg = parallax.Config(stall_timeout=None, communication_config=parallax.CommunicationConfig(
        mpi_config=parallax.MPIConfig(mpirun_options="--mca a b")))
    s = settings(cfg, environ={FINISH_TIMEOUT_ENV: "7", MPIRUN_OPTIONS_ENV: "--mca c d"})
    assert s.timeouts == dataclasses.replace(Timeouts(), stall=None, finish=7.0)
    assert s.mpirun_options == "--mca a b --mca c d"
    assert settings().timeouts == Timeouts()
    assert settings(environ={FINISH_TIMEOUT_ENV: "0"}).timeouts.finish == 0.0  # a number, not a default


def test_the_settings_are_frozen_and_the_users_config_is_neither_changed_nor_shared():
    cfg = parallax.Config(sess_config=tf.compat.v1.ConfigProto(intra_op_parallelism_threads=3),
                          ckpt_config=parallax.CheckPointConfig(ckpt_dir="/tmp/c"))
    before = repr(cfg)
    s = settings(cfg)
    assert repr(cfg) == before
    with pytest.raises(dataclasses.FrozenInstanceError):
        s.run_option = "PS"
    cfg.ckpt_config.ckpt_dir = "/elsewhere"
    cfg.sess_config.intra_op_parallelism_threads = 1
    assert s.ckpt.ckpt_dir == "/tmp/c" and s.sess_config.intra_op_parallelism_threads == 3


def test_every_config_default_is_written_once_in_its_field():
    for cls in (parallax.Config, parallax.PSConfig, parallax.MPIConfig, parallax.CheckPointConfig,
                parallax.ProfileConfig, parallax.CommunicationConfig):
        assert dataclasses.is_dataclass(cls), cls  # its __init__ comes from the fields' defaults
        assert all("check" in f.metadata for f in dataclasses.fields(cls)), cls


# -- tasks a cluster manager started (TF_CONFIG) --------------------------------------------------------------
MANAGED_PS = parse_resource_text("worker,a,1,\nworker,b,1,\nps,c,1,\n", "TF_CONFIG")
MANAGED_WORKERS = parse_resource_text("worker,a,1,\nworker,b,1,\n", "TF_CONFIG")


def managed(config=None, cluster=MANAGED_PS, sync=True, gpus=0):
    return derive(config or parallax.Config(), sync, cluster, gpus=gpus, cpu_count=4, manager="TF_CONFIG")


@pytest.mark.parametrize("cluster, sync, expected", [(MANAGED_PS, True, "PS"), (MANAGED_WORKERS, True, "MPI"),
                                                     (MANAGED_PS, False, "PS")])
def test_a_managed_job_defaults_to_the_layout_its_tasks_make(cluster, sync, expected):
    s = managed(cluster=cluster, sync=sync)
    assert s.run_option == expected and s.allreduce_comm.backend == "collective"


@pytest.mark.parametrize("option, cluster, backend, gpus, message", [
    ("HYBRID", MANAGED_PS, "auto", 0, "run_option='HYBRID' cannot run in tasks started from TF_CONFIG"),
    ("AUTO", MANAGED_WORKERS, "auto", 0, "run_option='AUTO' cannot run in tasks started from TF_CONFIG"),
    ("PS", MANAGED_WORKERS, "auto", 0, "run_option='PS' needs parameter servers, but TF_CONFIG has no ps task"),
    ("MPI", MANAGED_PS, "auto", 0, "but TF_CONFIG has 1 ps task\\(s\\) that would idle"),
    ("MPI", MANAGED_WORKERS, "mpi", 0, "MPIConfig.backend='mpi' needs processes started by mpirun"),
    ("MPI", MANAGED_WORKERS, "auto", 2, "this task sees 2 GPUs"),
])
def test_what_cannot_run_in_a_managed_job_is_refused_saying_what_to_use(option, cluster, backend, gpus, message):
    config = parallax.Config(run_option=option, communication_config=parallax.CommunicationConfig(
        mpi_config=parallax.MPIConfig(backend=backend)))
    with pytest.raises(parallax.LaunchError, match=message):
        managed(config, cluster=cluster, gpus=gpus)


def test_the_chief_releases_inside_its_step_unless_the_user_gave_hooks_which_run_first():
    assert settings().ps.release_in_step
    hooked = parallax.Config(hooks=[tf.compat.v1.train.StepCounterHook(every_n_steps=10)])
    assert not settings(hooked).ps.release_in_step


@pytest.mark.parametrize("text, expected", [("", None), (" off ", "off"), ("OFF", "off"), ("0", 0.0),
                                            ("1500", 1500e-6)])
def test_the_arrival_spin_comes_from_the_environment_in_microseconds(text, expected):
    assert settings(environ={ARRIVAL_SPIN_ENV: text}).arrival_spin == expected


@pytest.mark.parametrize("text", ["-1", "soon", "nan"])
def test_a_bad_arrival_spin_names_the_variable_and_what_it_takes(text):
    """Refused where the environment is read (parallel_run's invocation), before any setting is derived."""
    expected = rf"^PARALLAX_ARRIVAL_SPIN_US='{text}': expected 'off' or microseconds"
    with pytest.raises(ValueError, match=expected):
        settings(environ={ARRIVAL_SPIN_ENV: text})


def test_the_communications_tuning_and_cache_come_with_the_invocation_not_from_the_environment(monkeypatch):
    monkeypatch.setenv(NATIVE_OPS_ENV, "0")  # this process's environment is not read: the invocation says
    s = settings(environ={HUGE_PAGES_ENV: "0", CACHE_ENV: "/cache"})
    assert s.comm_tuning == CommTuning(huge_pages=False) and s.cache_root == "/cache"
    assert settings().comm_tuning == CommTuning() and settings().timeouts == Timeouts()


@pytest.mark.parametrize("protocol", ["grpc+verbs", "grpc+gdr", "grpc+mpi"])
def test_a_protocol_stock_tensorflow_cannot_start_is_refused_before_anything_is_launched(protocol):
    cfg = parallax.Config(communication_config=parallax.CommunicationConfig(
        ps_config=parallax.PSConfig(protocol=protocol)))
    with pytest.raises(ValueError, match=rf"^PSConfig.protocol='{re.escape(protocol)}': TensorFlow's servers start "
                                         r"only with 'grpc' \(.*\); use protocol='grpc'$"):
        settings(cfg)


def test_the_settings_that_act_between_workers_are_those_the_user_changed():
    assert settings().cross_worker_settings == ()
    cfg = parallax.Config(run_option="PS", plan_overrides={"emb*": "ps", "w": {"density": 0.5}, "b": {"sync": "ps"}},
                          communication_config=parallax.CommunicationConfig(
                              ps_config=parallax.PSConfig(local_aggregation=False),
                              mpi_config=parallax.MPIConfig(fusion_bytes=0)))
    assert settings(cfg, sync=False).cross_worker_settings == (
        "sync=False", "PSConfig.local_aggregation=False", "MPIConfig.fusion_bytes=0",
        "plan_overrides['b']['sync']='ps'", "plan_overrides['emb*']['sync']='ps'")
    assert settings(parallax.Config(zero_stage=2)).cross_worker_settings == ("zero_stage=2",)
