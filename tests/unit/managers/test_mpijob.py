"""An MPIJob launcher's host file as the job's resources (pure, plus parse_resource_file on a real file)."""

from __future__ import annotations

import pytest

from parallax.errors import ResourceFileError
from parallax.invocation import Invocation, LaunchIdentity
from parallax.managers.mpijob import hostfile_text, in_launcher, resource_text
from parallax.resources.files import Device, from_environment, parse_resource_file


def test_open_mpi_and_hydra_host_files_become_one_replica_per_slot():
    text = ("# written by the MPI Operator\njob-worker-0.job-worker.ns.svc slots=2\n"
            "job-worker-1.job-worker.ns.svc:1\nh3\n")
    assert hostfile_text(text, "f", gpus=True) == ("job-worker-0.job-worker.ns.svc: 0,1\n"
                                                    "job-worker-1.job-worker.ns.svc: 0\nh3: 0\n")
    assert hostfile_text("a slots=3 max_slots=3\n", "f", gpus=False) == "a: cpu:0,cpu:1,cpu:2\n"


@pytest.mark.parametrize("text,message", [("a slots=x\n", 'line 1: "a slots=x"; expected "<host> slots=<n>"'),
                                          ("a:0\n", "line 1"), ("# only a comment\n", "no hosts in the host file")])
def test_a_bad_host_file_names_the_line(text, message):
    with pytest.raises(ResourceFileError, match=message):
        hostfile_text(text, "f", gpus=False)


def test_the_launcher_environment_is_read_when_no_resource_file_is_given(tmp_path, monkeypatch):
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("w0 slots=2\nw1 slots=2\n")
    env = {"OMPI_MCA_orte_default_hostfile": str(hostfile), "PARALLAX_SLOT_DEVICE": "gpu"}
    assert in_launcher(env) and from_environment(env) == "mpijob"
    assert resource_text(env) == "w0: 0,1\nw1: 0,1\n"
    assert not in_launcher({"OMPI_MCA_orte_default_hostfile": str(tmp_path / "missing")})
    launched = Invocation(launch=LaunchIdentity("[]")).to_env()
    assert not in_launcher({**env, **launched})  # a process Parallax launched reads what it is sent
    for key in ("SLURM_JOB_ID", "SLURM_JOB_NODELIST"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("OMPI_MCA_orte_default_hostfile", str(hostfile))
    monkeypatch.delenv("PARALLAX_SLOT_DEVICE", raising=False)
    cluster = parse_resource_file(None)
    assert cluster.from_environment and cluster.workers[1].devices == (Device("cpu", 0), Device("cpu", 1))
    assert cluster.source == f"the MPIJob host file {hostfile} (OMPI_MCA_orte_default_hostfile)"


def test_mpijob_outside_a_launcher_is_a_clear_error(monkeypatch):
    for key in ("OMPI_MCA_orte_default_hostfile", "PRTE_MCA_prte_default_hostfile", "I_MPI_HYDRA_HOST_FILE",
                "HYDRA_HOST_FILE"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(ResourceFileError, match="no MPI host file is set"):
        parse_resource_file("mpijob")
    monkeypatch.setenv("PARALLAX_SLOT_DEVICE", "tpu")
    monkeypatch.setenv("HYDRA_HOST_FILE", "/nonexistent")
    with pytest.raises(ResourceFileError, match="cannot read it"):
        parse_resource_file("mpijob")
