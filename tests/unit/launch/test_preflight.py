"""The hosts' check before a multi-host job (parallax/launch/preflight.py), without hosts or ssh."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from parallax.launch.preflight import PROBE, Expected, GpuUse, check_host, gpu_names, judge

EXPECTED = Expected("/venv/bin/python", "3.11.7", "/src/parallax", "0.1.0", "/src/train.py", several_hosts=True)


def report(**changes):
    base = {"hostname": "node2", "own_name": ["10.0.0.2"], "addresses": {"127.0.0.1": "lo", "10.0.0.2": "eth0"},
            "source": "10.0.0.2", "python": "/venv/bin/python", "python_version": "3.11.7",
            "parallax": "/src/parallax", "parallax_version": "0.1.0", "script": True, "taken": [], "gpus": []}
    base.update(changes)
    return base


def test_a_ready_host_gets_one_line_of_facts():
    check = judge("node2", ["10.0.0.2"], report(), EXPECTED)
    assert check.ok
    assert check.line() == ("node2: ok: hostname node2 -> 10.0.0.2; Python 3.11.7 and Parallax 0.1.0 at the same "
                            "paths; reaches this machine from 10.0.0.2 (eth0); no GPU")


@pytest.mark.parametrize("changes, resolved, needle", [
    ({"own_name": ["127.0.1.1"]}, ["10.0.0.2"],
     "its own name 'node2' resolves to 127.0.1.1 there, a loopback address, so the other hosts cannot reach what it "
     "announces. Fix: in /etc/hosts on node2, map node2 to its network address (10.0.0.2) instead of 127.0.1.1"),
    ({"own_name": ["error: [Errno -2] Name or service not known"]}, ["10.0.0.2"],
     "its own name 'node2' does not resolve there"),
    ({}, ["10.0.0.9"], "the name 'node2' resolves here to 10.0.0.9, which is no address of that host"),
    ({"python": "/usr/bin/python3"}, ["10.0.0.2"], "it runs Python 3.11.7 at /usr/bin/python3, this machine 3.11.7 "
                                                   "at /venv/bin/python"),
    ({"parallax": None, "parallax_version": None}, ["10.0.0.2"], "no Parallax for that Python"),
    ({"parallax_version": "0.0.9"}, ["10.0.0.2"], "Parallax 0.0.9 at /src/parallax for that Python, this machine "
                                                  "Parallax 0.1.0"),
    ({"script": False}, ["10.0.0.2"], "the program /src/train.py is not there"),
    ({"taken": [2222]}, ["10.0.0.2"], "port(s) 2222 are taken there"),
], ids=["loopback-name", "unresolved-own-name", "name-elsewhere", "other-python", "no-parallax", "other-parallax",
        "no-script", "port-taken"])
def test_each_problem_is_named_with_its_fix(changes, resolved, needle):
    check = judge("node2", resolved, report(**changes), EXPECTED)
    assert not check.ok
    assert check.line().startswith("node2: FAILED: ")
    assert needle in check.line()


def test_one_machine_jobs_do_not_care_about_names():
    alone = Expected(**{**EXPECTED.__dict__, "several_hosts": False})
    assert judge("localhost", ["127.0.0.1"], report(own_name=["127.0.1.1"]), alone).ok


def runner(code, stdout="", stderr=""):
    calls = []

    def run(argv, timeout):
        calls.append(argv)
        return subprocess.CompletedProcess(argv, code, stdout, stderr)
    return run, calls


def test_a_name_that_does_not_resolve_fails_before_ssh():
    run, calls = runner(0)
    check = check_host("no-such-host.invalid", [], EXPECTED, False, "127.0.0.1", run=run)
    assert "the name 'no-such-host.invalid' does not resolve on this machine" in check.line() and not calls


@pytest.mark.parametrize("code, stderr, needle", [
    (255, "ssh: connect to host localhost port 22: Connection refused",
     "cannot be reached by ssh (ssh: connect to host localhost port 22: Connection refused). Fix: 'ssh localhost "
     "true' must work"),
    (127, "bash: line 1: /venv/bin/python: No such file or directory", "no Python at /venv/bin/python there"),
])
def test_ssh_failures_are_told_apart(code, stderr, needle):
    run, calls = runner(code, stderr=stderr)
    check = check_host("localhost", [], EXPECTED, False, "127.0.0.1", ssh=("ssh", "-F", "cfg"), run=run)
    assert needle in check.line()
    assert calls[0][:6] == ["ssh", "-F", "cfg", "-o", "BatchMode=yes", "-o"] and calls[0][7] == "localhost"


def test_the_probe_reports_on_this_machine():
    done = subprocess.run([sys.executable, "-c", PROBE, "127.0.0.1", __file__, "0"], capture_output=True, text=True,
                          timeout=30)
    facts = json.loads(done.stdout)
    assert facts["python"] == sys.executable and facts["script"] is True and facts["taken"] == []
    assert facts["parallax"].endswith("parallax") and facts["parallax_version"]
    assert facts["source"] == "127.0.0.1"


def test_inside_a_slurm_allocation_the_probe_goes_through_srun():
    run, calls = runner(1, stderr="srun: error: Unable to create step for job 7: Invalid node name specified")
    check = check_host("localhost", [], EXPECTED, False, "127.0.0.1", via="srun", run=run)
    assert calls[0][:6] == ["srun", "--nodes=1", "--ntasks=1", "--nodelist=localhost", "--overlap", "--quiet"]
    assert "srun could not run the check there (srun: error: Unable to create step" in check.line()


def test_inside_a_slurm_allocation_a_host_outside_it_is_refused(monkeypatch):
    from parallax.launch.preflight import check_hosts

    monkeypatch.setenv("SLURM_JOB_ID", "7")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "node[1-2]")
    run, calls = runner(0, stdout=json.dumps(report()))
    checks = check_hosts(["localhost", "node9"], {}, [], lambda h: h == "localhost", run=run)
    assert checks[1].line().startswith("node9: FAILED: it is not a node of the Slurm allocation of job 7 "
                                       "(node1, node2)")
    assert len(calls) == 1 and calls[0][1] == "-c"  # the local host is probed here, node9 not at all


A100 = "NVIDIA A100-SXM4-40GB"


@pytest.mark.parametrize("names, text", [
    ([A100] * 8, "8 GPUs (NVIDIA A100-SXM4-40GB)"), (["Tesla T4"], "1 GPU (Tesla T4)"), (["", ""], "2 GPUs"),
], ids=["eight", "one", "names-unknown"])
def test_a_ready_host_shows_its_gpus(names, text):
    check = judge("node2", ["10.0.0.2"], report(gpus=names), EXPECTED, GpuUse(needed=len(names)))
    assert check.ok and check.line().endswith(f"; {text}")


def test_a_host_with_fewer_gpus_than_the_job_gives_it_is_refused_naming_them():
    check = judge("node2", ["10.0.0.2"], report(gpus=[A100] * 4), EXPECTED, GpuUse(needed=8))
    assert check.line() == (
        "node2: FAILED: the job gives a process there GPU 7, but it has 4 GPUs (NVIDIA A100-SXM4-40GB). A bare host "
        "line stands for the GPUs of the machine that starts the job (every host is taken to be alike): list the GPU "
        'ids node2 has ("node2: 0,1,2,3").')


def test_a_bare_line_that_would_leave_a_hosts_gpus_idle_is_refused():
    check = judge("node2", ["10.0.0.2"], report(gpus=[A100] * 2), EXPECTED, GpuUse(bare=True))
    assert "would train on one CPU replica there and leave its 2 GPUs (NVIDIA A100-SXM4-40GB) idle. Fix: list " \
           'them ("node2: 0,1")' in check.line()
    assert judge("node2", ["10.0.0.2"], report(gpus=[]), EXPECTED, GpuUse(bare=True)).ok  # a CPU host: as meant


@pytest.fixture
def fake_gpus(tmp_path, monkeypatch):
    """An ``nvidia-smi`` on PATH that lists ``count`` GPUs (this machine has none)."""
    def install(count: int) -> None:
        lines = "\n".join(f"GPU {i}: Fake GPU 16GB (UUID: GPU-{i:08d})" for i in range(count))
        tool = tmp_path / "bin" / "nvidia-smi"
        tool.parent.mkdir(exist_ok=True)
        tool.write_text(f"#!/bin/sh\ncat <<'EOF'\n{lines}\nEOF\n")
        tool.chmod(0o755)
        monkeypatch.setenv("PATH", f"{tool.parent}:{os.environ['PATH']}")
    return install


def test_the_gpus_are_read_from_nvidia_smi_on_this_machine_and_by_the_probe(fake_gpus):
    fake_gpus(2)
    assert gpu_names() == ["Fake GPU 16GB", "Fake GPU 16GB"]
    done = subprocess.run([sys.executable, "-c", PROBE, "127.0.0.1", "", "0"], capture_output=True, text=True,
                          timeout=30)
    assert json.loads(done.stdout)["gpus"] == ["Fake GPU 16GB", "Fake GPU 16GB"]


@pytest.mark.parametrize("resources, expected, code", [
    ("localhost\n", "localhost: ok: hostname", 0),
    ("localhost: 0,1,2\n", "localhost: FAILED: the job gives a process there GPU 2, but it has 2 GPUs (Fake GPU 16GB)",
     1),
], ids=["bare-host-is-every-gpu", "a-gpu-too-many"])
def test_check_prints_each_hosts_gpus(tmp_path, capsys, fake_gpus, monkeypatch, resources, expected, code):
    from parallax.cli import main

    fake_gpus(2)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    path = tmp_path / "resource_info"
    path.write_text(resources)
    assert main(["--check", str(path)]) == code
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(expected)
    if code == 0:
        assert out[0].endswith("; 2 GPUs (Fake GPU 16GB)")
