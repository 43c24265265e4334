"""Reading a Slurm allocation (parallax/resources/slurm.py) and what uses it, without Slurm."""

from __future__ import annotations

import pytest

from parallax.errors import ResourceFileError
from parallax.launch.command import build_mpirun_command
from parallax.launch.layout import ranks_per_device
from parallax.resources import slurm
from parallax.resources.files import Device, parse_resource_file, parse_resource_text

JOB = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "node[01-02]", "SLURM_TASKS_PER_NODE": "2(x2)"}


@pytest.mark.parametrize("text, hosts", [
    ("vhost1", ["vhost1"]),
    ("vhost[1-3]", ["vhost1", "vhost2", "vhost3"]),
    ("node[01-03,10],login", ["node01", "node02", "node03", "node10", "login"]),
    ("gpu[8-10]", ["gpu8", "gpu9", "gpu10"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("a,b[1,3],c-2", ["a", "b1", "b3", "c-2"]),
])
def test_host_lists_expand_as_slurm_writes_them(text, hosts):
    assert slurm.expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["n[1-", "n]", "n[a-b]", "n[3-1]", "n[[1]]", ""])
def test_a_bad_host_list_is_a_value_error(text):
    with pytest.raises(ValueError):
        slurm.expand_hostlist(text)


def test_counts_expand():
    assert slurm.expand_counts("2(x3),1") == [2, 2, 2, 1]
    assert slurm.expand_counts("4") == [4]
    with pytest.raises(ValueError):
        slurm.expand_counts("2(x)")


def test_a_cpu_allocation_gives_a_replica_per_task():
    env = {**JOB, "SLURM_JOB_NODELIST": "node[01-03]", "SLURM_TASKS_PER_NODE": "2(x2),1"}
    cluster = parse_resource_text(slurm.allocation_text(env))
    assert [(w.host, w.devices) for w in cluster.workers] == [
        ("node01", (Device("cpu", 0), Device("cpu", 1))), ("node02", (Device("cpu", 0), Device("cpu", 1))),
        ("node03", (Device("cpu", 0),))]


@pytest.mark.parametrize("gpus", [{"SLURM_GPUS_PER_NODE": "a100:4"}, {"SLURM_GPUS_PER_NODE": "4"},
                                  {"SLURM_GPUS_ON_NODE": "4"}, {"SLURM_JOB_GPUS": "0,1,2,3"}])
def test_a_gpu_allocation_gives_a_replica_per_gpu(gpus):
    cluster = parse_resource_text(slurm.allocation_text({**JOB, **gpus}))
    assert [w.devices for w in cluster.workers] == [tuple(Device("gpu", i) for i in range(4))] * 2
    assert "4 GPUs per node" in slurm.allocation_text({**JOB, **gpus}).splitlines()[0]


def test_the_value_slurm_reads_the_allocation(monkeypatch):
    for name, value in JOB.items():
        monkeypatch.setenv(name, value)
    for given in ("slurm", None):
        cluster = parse_resource_file(given)
        assert cluster.hosts == ("node01", "node02") and cluster.source == "the Slurm allocation of job 42"
        assert cluster.text.startswith("# the Slurm allocation of job 42: SLURM_JOB_NODELIST=node[01-02]")


@pytest.mark.parametrize("env, needle", [
    ({}, "resource_info 'slurm': this process is not inside a Slurm allocation (SLURM_JOB_ID and "
         "SLURM_JOB_NODELIST are not set)"),
    ({**JOB, "SLURM_JOB_NODELIST": "node[01-"}, "SLURM_JOB_NODELIST='node[01-' is not a Slurm host list"),
    ({**JOB, "SLURM_TASKS_PER_NODE": "2(x3)"}, "cannot read SLURM_TASKS_PER_NODE='2(x3)' (it gives 3 nodes, "
                                               "SLURM_JOB_NODELIST 2)"),
    ({**JOB, "SLURM_GPUS_PER_NODE": "a100:many"}, "cannot read the GPUs per node from SLURM_GPUS_PER_NODE"),
])
def test_a_bad_or_missing_allocation_is_a_clear_error(monkeypatch, env, needle):
    for name in [*JOB, "SLURM_GPUS_PER_NODE"]:
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ResourceFileError) as err:
        parse_resource_file("slurm")
    assert needle in str(err.value)


def test_no_resource_file_outside_an_allocation_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("SLURM_JOB_ID", raising=False)
    with pytest.raises(ResourceFileError, match="no resource file given"):
        parse_resource_file(None)


def test_a_node_given_more_ranks_than_slurm_tasks_is_oversubscribed():
    layout = ranks_per_device(parse_resource_text("node01: cpu:0,cpu:1\nnode02: cpu:0,cpu:1\n"))

    def argv(allocated):
        return build_mpirun_command("mpirun", "python", ["t.py"], layout, local_hosts=frozenset(), cpu_count=8,
                                    is_root=False, allocated=allocated).argv

    assert "--oversubscribe" not in argv(slurm.tasks_per_node(JOB))
    assert "--oversubscribe" in argv(slurm.tasks_per_node({**JOB, "SLURM_TASKS_PER_NODE": "1(x2)"}))
    assert slurm.tasks_per_node({}) is None
