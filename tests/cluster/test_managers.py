"""Jobs a cluster manager starts, across the hosts of the virtual cluster: each task a process on its own
host, told its task in TF_CONFIG (as Kubernetes starts a TFJob's pods), none started by Parallax."""

from __future__ import annotations

import os
import re
import subprocess
import threading
import time

import pytest

from tests.cluster.test_multihost import PARALLAX_RUN, assert_nothing_left, finish
from tests.multiprocess.harness import ROOT, SCRIPT
from tests.multiprocess.test_mpi_mode import BATCH, STEPS, check_ranks_match, expected_values
from tests.multiprocess.test_tf_config_jobs import check_ids, run_managed

pytestmark = [pytest.mark.cluster, pytest.mark.multiprocess, pytest.mark.slow]


def prefixes(cluster, tmp_path) -> dict[str, list[str]]:
    """host -> the command that runs a task on it (its namespaces), as a manager runs a pod on a node."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    return {h: cluster.command(h, [], cwd=str(tmp_path)) for h in cluster.hosts}


def test_a_tfjob_across_hosts_equals_single_device(cluster, tmp_path):
    """A chief, a worker and two ps on three hosts (PS by default)."""
    shape = {"chief": ["vhost1:2222"], "worker": ["vhost2:2222"], "ps": ["vhost3:2222", "vhost1:2223"]}
    run = run_managed(tmp_path, shape, "--run_option", "default", "--model", "embedding", "--average_sparse",
                      prefix=prefixes(cluster, tmp_path), namespace=False)
    check_ranks_match(run, expected_values("embedding"), 2)
    check_ids(run, 2)
    assert_nothing_left(cluster)


def test_workers_across_hosts_all_reduce_with_collectives(cluster, tmp_path):
    shape = {"worker": ["vhost1:2222", "vhost2:2222", "vhost3:2222"]}
    run = run_managed(tmp_path, shape, "--run_option", "default", "--model", "mlp",
                      prefix=prefixes(cluster, tmp_path), namespace=False)
    check_ranks_match(run, expected_values("mlp"), 3)
    check_ids(run, 3)
    assert_nothing_left(cluster)


def test_a_host_that_vanishes_ends_the_other_tasks_naming_it(cluster, tmp_path):
    """vhost3's link goes down mid-training: the tasks on the other hosts end within the stall time, naming
    the task there."""
    shape = {"chief": ["vhost1:2222"], "worker": ["vhost2:2222", "vhost3:2222"], "ps": ["vhost1:2223"]}
    out = tmp_path / "out"

    def cut() -> None:
        deadline = time.monotonic() + 120
        while not (out / "started_2").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(1.0)
        cut_at.append(time.time())
        cluster.link("vhost3", up=False)

    cut_at: list[float] = []
    thread = threading.Thread(target=cut, daemon=True)
    thread.start()
    try:
        run = run_managed(tmp_path, shape, "--run_option", "PS", "--model", "mlp", "--steps", "400",
                          "--stall_timeout", "10", prefix=prefixes(cluster, tmp_path), namespace=False, timeout=120)
    finally:
        thread.join(timeout=5)
        cluster.link("vhost3", up=True)
    assert cut_at, run.output[-3000:]
    for name in ("chief_0", "worker_0", "ps_0"):
        task = run.tasks[name]
        assert task["rc"] not in (0, "timeout"), (name, run.output[-4000:])
        assert task["ended"] - cut_at[0] < 15, (name, task["ended"] - cut_at[0])
        assert re.search(r"task ([^;]* and )?worker 1 \(vhost3:2222\)( and [^;]*)? ha(s|ve) ended or cannot be "
                         "reached", run.log(name)), \
            run.log(name)[-3000:]
    assert_nothing_left(cluster, within=30)


def test_an_mpijob_launcher_trains_on_the_hosts_of_its_host_file(cluster, tmp_path):
    """As Kubeflow's MPI Operator runs a job: the launcher (vhost1) is not a worker; its MPI is pointed at a
    host file of the worker pods (vhost2 with 2 slots, vhost3 with 1); the script is given no resource file."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("vhost2 slots=2\nvhost3 slots=1\n")
    out = str(tmp_path / "out")
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", OMPI_MCA_orte_default_hostfile=str(hostfile))
    proc = cluster.popen("vhost1", [PARALLAX_RUN, SCRIPT, "--resource_info", "mpijob", "--out", out, "--run_option",
                                    "MPI", "--model", "mlp", "--steps", str(STEPS), "--batch", str(BATCH)],
                         cwd=str(tmp_path), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         errors="replace", start_new_session=True)
    run = finish(proc, out, cluster=cluster)
    check_ranks_match(run, expected_values("mlp"), 3)
    hosts = re.findall(r"rank \d+: worker \d+ on (\S+):", run.output)
    assert hosts == ["vhost2", "vhost2", "vhost3"], run.output[-3000:]
    assert_nothing_left(cluster)
