"""Jobs across the hosts of a virtual cluster (tests/cluster/virtual_cluster.py).

Each job is started on vhost1, as a user logged in there would start it
(``python train.py`` or ``parallax-run``); ``mpirun`` reaches the other hosts
over ssh; TensorFlow's servers listen on the hosts' own addresses. Results
are compared with single-device training, and after every job no process of
it may be left on any host.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time

import pytest

from tests.multiprocess.harness import ROOT, SCRIPT, Run
from tests.multiprocess.test_launch_leftovers import SCRIPT as BARRIER_SCRIPT
from tests.multiprocess.test_launch_leftovers import plant_leftovers
from tests.multiprocess.test_mpi_mode import BATCH, STEPS, check_ranks_match
from tests.multiprocess.test_tf1_programs import expected, idiom_options

pytestmark = [pytest.mark.cluster, pytest.mark.multiprocess, pytest.mark.slow]

PARALLAX_RUN = os.path.join(os.path.dirname(sys.executable), "parallax-run")
ONE_EACH = "vhost1: cpu:0\nvhost2: cpu:0\nvhost3: cpu:0\n"


def start(cluster, tmp_path, resources: str, *args: str, launcher: tuple[str, ...] = (sys.executable,),
          script_resources: str | None = None, script: str = SCRIPT) -> tuple[subprocess.Popen, str]:
    """Start a training job on vhost1; returns the process and the output directory."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "resource_info").write_text(resources)
    out = str(tmp_path / "out")
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    argv = [*launcher, script, "--resource_info", script_resources or str(tmp_path / "resource_info"),
            "--out", out, *args]
    proc = cluster.popen("vhost1", argv, cwd=str(tmp_path), env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    return proc, out


def finish(proc: subprocess.Popen, out: str, timeout: float = 240, cluster=None) -> Run:
    began = time.monotonic()
    try:
        output, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        for host in (cluster.hosts if cluster is not None else ()):  # mpirun runs in a session of its own
            for pid in cluster.job_pids(host):
                os.kill(pid, 9)
        output, _ = proc.communicate(timeout=30)
        raise AssertionError(f"job did not finish in {timeout}s:\n{output[-6000:]}") from None
    return Run(proc.returncode, output, time.monotonic() - began, out, time.time())


def train(cluster, tmp_path, resources: str, *args: str, **kwargs) -> Run:
    return finish(*start(cluster, tmp_path, resources, *args, **kwargs), cluster=cluster)


def assert_nothing_left(cluster, within: float = 15.0) -> None:
    """No process of a job on any host (its sshd aside), waiting ``within`` seconds for stragglers."""
    deadline = time.monotonic() + within
    while True:
        left = {h: cluster.job_pids(h) for h in cluster.hosts}
        if not any(left.values()):
            return
        if time.monotonic() > deadline:
            described = {h: [_cmdline(p) for p in pids] for h, pids in left.items() if pids}
            for pids in left.values():  # the test's own leftovers: end them before failing
                for pid in pids:
                    try:
                        os.kill(pid, 9)
                    except ProcessLookupError:
                        pass
            raise AssertionError(f"processes left on the hosts: {described}")
        time.sleep(0.5)


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "?"


def idiom_args(mode: str, idiom: str = "everything") -> list[str]:
    return [*idiom_options(idiom), "--run_option", mode, "--average_sparse", "--steps", str(STEPS),
            "--batch", str(BATCH)]


# --------------------------------------------------------------------------- equal to one device
# (AUTO is left out: for this small model the servers would save less than their chain costs a step, so it
# runs as MPI, the case above it; tests/unit/job/test_plan.py checks AUTO's choice on three hosts)
# PS on every host's server (PSConfig.num_servers=3); HYBRID on the one server Parallax keeps for this small
# model, the other two running idle
@pytest.mark.parametrize("mode, servers", [("PS", "3 of 3"), ("MPI", None), ("HYBRID", "1 of 3")])
def test_a_job_on_three_hosts_equals_single_device(cluster, tmp_path, mode, servers):
    run = train(cluster, tmp_path, ONE_EACH, *idiom_args(mode), *(["--num_servers", "3"] if mode == "PS" else []))
    check_ranks_match(run, expected("everything"), 3)
    assert "vhost1 x" in run.output and "vhost3 x" in run.output  # one launch over the three hosts
    assert servers is None or f"servers: {servers} hold variables" in run.output, run.output[-3000:]
    assert_nothing_left(cluster)


def test_a_replicas_pipeline_stages_on_two_hosts_equal_single_device(cluster, tmp_path):
    """Two replicas of two stages: each replica's stage 0 (a worker) on vhost1, its stage 1 (a stage server)
    on vhost2, the activations and their gradients between the hosts over TensorFlow's gRPC runtime."""
    from tests.multiprocess.test_pipeline import CASES, COMMON
    from tests.multiprocess.test_pipeline import expected as pipeline_expected

    run = train(cluster, tmp_path, "vhost1: cpu:0\nvhost2: cpu:0\nvhost1: cpu:1\nvhost2: cpu:1\n", *COMMON,
                "--run_option", "MPI", *CASES["dp+pp-adam"])
    check_ranks_match(run, pipeline_expected("dp+pp-adam"), 2)
    assert "stage server 0 serving on vhost2" in run.output and "stage server 1 serving on vhost2" in run.output
    assert_nothing_left(cluster)


@pytest.mark.parametrize("mode", ["PS", "MPI"])
def test_parallax_run_on_two_hosts_with_two_devices_each_equals_single_device(cluster, tmp_path, mode):
    (tmp_path / "ignored").write_text("localhost: cpu:0\n")  # parallax-run's file replaces the script's
    run = train(cluster, tmp_path, "vhost2: cpu:0,cpu:1\nvhost3: cpu:0,cpu:1\n", *idiom_args(mode, "scoped"),
                launcher=(sys.executable, PARALLAX_RUN, "-r", str(tmp_path / "resource_info")),
                script_resources=str(tmp_path / "ignored"))
    check_ranks_match(run, expected("scoped"), 2)
    assert_nothing_left(cluster)


def test_explicit_roles_with_a_server_on_its_own_host(cluster, tmp_path):
    roles = "ps,vhost3,23456,\nworker,vhost1,23457,cpu:0\nworker,vhost2,23458,cpu:0\n"
    run = train(cluster, tmp_path, roles, *idiom_args("PS", "scoped"))
    check_ranks_match(run, expected("scoped"), 2)
    assert "ps 0 on vhost3" in run.output
    assert_nothing_left(cluster)


# --------------------------------------------------------------------------- refused before training
def refused(run: Run, *needles: str) -> None:
    assert run.returncode != 0, run.output[-3000:]
    assert "starting" not in run.output and "starts at global step" not in run.output, run.output[-3000:]
    for needle in needles:
        assert needle in run.output, f"{needle!r} not in:\n{run.output[-3000:]}"


def test_a_name_that_does_not_resolve_is_refused_before_training(cluster, tmp_path):
    run = train(cluster, tmp_path, "vhost1: cpu:0\nvhost9: cpu:0\n", *idiom_args("MPI", "group"))
    refused(run, "vhost9: FAILED: the name 'vhost9' does not resolve on this machine (vhost1)")
    assert_nothing_left(cluster)


@contextlib.contextmanager
def hosts_file_of(cluster, host: str, change):
    """``host``'s /etc/hosts rewritten by ``change`` (old text -> new text) for the block, then restored."""
    path = cluster.hosts_file(host)
    with open(path) as f:
        saved = f.read()
    try:
        with open(path, "w") as f:
            f.write(change(saved))
        yield
    finally:
        with open(path, "w") as f:
            f.write(saved)


def test_a_host_ssh_cannot_reach_is_refused_before_training(cluster, tmp_path):
    with hosts_file_of(cluster, "vhost1", lambda text: text + "198.18.0.99 vhost9\n"):  # an address nobody has
        run = train(cluster, tmp_path, "vhost1: cpu:0\nvhost9: cpu:0\n", *idiom_args("MPI", "group"))
    refused(run, "vhost9: FAILED: cannot be reached by ssh", "'ssh vhost9 true' must work from vhost1")
    assert_nothing_left(cluster)


def test_a_host_whose_own_name_is_loopback_is_refused_before_training(cluster, tmp_path):
    with hosts_file_of(cluster, "vhost2", lambda text: text.replace("198.18.0.2 vhost2", "127.0.1.1 vhost2")):
        run = train(cluster, tmp_path, "vhost1: cpu:0\nvhost2: cpu:0\n", *idiom_args("PS", "group"))  # Debian's line
    refused(run, "vhost2: FAILED: its own name 'vhost2' resolves to 127.0.1.1 there",
            "map vhost2 to its network address (198.18.0.2)")
    assert_nothing_left(cluster)


def test_check_prints_one_line_per_host(cluster, tmp_path):
    (tmp_path / "resource_info").write_text("vhost1: cpu:0\nvhost2: cpu:0\nvhost3: cpu:0,cpu:1\nvhost9: cpu:0\n")
    done = cluster.run("vhost1", [sys.executable, PARALLAX_RUN, "--check", str(tmp_path / "resource_info"), SCRIPT],
                       cwd=str(tmp_path), timeout=120)
    lines = done.stdout.splitlines()
    assert done.returncode == 1, done.stdout + done.stderr
    for host, address in (("vhost1", "198.18.0.1"), ("vhost2", "198.18.0.2"), ("vhost3", "198.18.0.3")):
        line = next(x for x in lines if x.startswith(f"{host}:"))
        assert re.match(rf"{host}: ok: hostname {host} -> {address}; Python \S+ and Parallax \S+ at the same "
                        rf"paths; reaches this machine from {address} \(eth0\); no GPU$", line), line
    assert any(x.startswith("vhost9: FAILED: the name 'vhost9' does not resolve") for x in lines)
    assert lines[-1] == "3 of 4 hosts ready"


# --------------------------------------------------------------------------- failures
STALL = 10.0


@pytest.mark.parametrize("mode", ["MPI", "PS"])
def test_a_killed_remote_rank_ends_the_job_naming_it(cluster, tmp_path, mode):
    run = train(cluster, tmp_path, ONE_EACH, *idiom_args(mode, "group"), "--steps", "40", "--kill_rank", "1",
                "--kill_step", "3", "--stall_timeout", str(STALL))
    assert run.returncode != 0, run.output[-3000:]
    killed_at = float(open(os.path.join(run.out_dir, "killed_at")).read())
    assert run.ended_at - killed_at < STALL, run.output[-3000:]
    failure = run.output.strip().splitlines()[-1]
    # the rank killed, not a peer that failed because of it (mpirun may name either first)
    assert re.match(r"Parallax job failed: rank \d+ on host vhost2 \(pid \d+\) (was killed by signal 9|ended first, "
                    r"without an error of its own)", failure), run.output[-3000:]
    assert_nothing_left(cluster)


@pytest.mark.parametrize("mode", ["MPI", "PS"])
def test_a_host_that_vanishes_ends_the_job_naming_it(cluster, tmp_path, mode):
    proc, out = start(cluster, tmp_path, ONE_EACH, *idiom_args(mode, "group"), "--steps", "100000",
                      "--stall_timeout", str(STALL))
    try:
        deadline = time.monotonic() + 120
        while not all(os.path.exists(os.path.join(out, f"started_{w}")) for w in range(3)):
            assert time.monotonic() < deadline and proc.poll() is None, "the job did not start"
            time.sleep(0.5)
        time.sleep(3)  # training
        cluster.link("vhost3", False)
        gone_at = time.time()
        run = finish(proc, out, timeout=90, cluster=cluster)
    finally:
        cluster.link("vhost3", True)
    assert run.returncode != 0, run.output[-3000:]
    assert run.ended_at - gone_at < 2 * STALL + 5, run.output[-3000:]
    assert re.search(r"Parallax job failed: rank \d+ on host vhost3 .*(lost|silent|not heard)", run.output), \
        run.output[-3000:]
    assert_nothing_left(cluster, within=2 * STALL)



def test_a_job_starts_where_killed_jobs_left_their_session_files(cluster, tmp_path):
    """The jobs killed above leave ``mpirun``'s and its daemons' session directories on the hosts; one of
    a later job given the same pid made it fail to start (CI, exit code 213). Each job has its own now."""
    planted = plant_leftovers(3000, tuple(cluster.hosts))  # the checks over ssh before the start take hundreds
    try:
        run = finish(*start(cluster, tmp_path, ONE_EACH, script=BARRIER_SCRIPT), timeout=120, cluster=cluster)
    finally:
        for path in planted:
            shutil.rmtree(path, ignore_errors=True)
    assert run.returncode == 0, run.output[-3000:]
    assert sorted(os.listdir(run.out_dir)) == ["rank_0.json", "rank_1.json", "rank_2.json"]
    assert_nothing_left(cluster)


def test_probe_measures_the_link_between_two_hosts(cluster, tmp_path):
    """``parallax probe`` starts its two processes as a job's ranks (mpirun over ssh) on two hosts."""
    (tmp_path / "resource_info").write_text(ONE_EACH)
    probe = os.path.join(os.path.dirname(sys.executable), "parallax")
    done = cluster.run("vhost1", [probe, "probe", str(tmp_path / "resource_info"), "--hosts", "vhost1,vhost3"],
                       cwd=str(tmp_path), timeout=180, env=dict(os.environ, PYTHONPATH=ROOT))
    assert done.returncode == 0, done.stdout + done.stderr
    m = re.search(r"between vhost1 and vhost3: ([0-9.e+]+) Gbit/s per direction, ([0-9.e+]+) us latency "
                  r"\(--bandwidth \S+ --latency \S+\)", done.stdout)
    assert m, done.stdout
    assert float(m.group(1)) > 0.1 and float(m.group(2)) > 0
    assert_nothing_left(cluster)
