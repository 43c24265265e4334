"""The files ``parallax manifest`` writes for the host-based managers, run on the virtual cluster as each
manager runs them: the sbatch script submitted to a real Slurm (after ``sbatch --test-only`` against its
controller), the HTCondor node script started on every host at once with the variables the parallel universe
sets, and the MPIJob's launcher started with the host file the MPI Operator writes. Each trains the job,
equal to single-device training."""

from __future__ import annotations

import os
import subprocess

import pytest
import yaml

from tests.cluster.test_multihost import assert_nothing_left, finish
from tests.cluster.test_slurm import VENV_BIN, submit
from tests.multiprocess.harness import ROOT, Run
from tests.multiprocess.test_manifests import write_manifest
from tests.multiprocess.test_mpi_mode import check_ranks_match, expected_values

pytestmark = [pytest.mark.cluster, pytest.mark.multiprocess, pytest.mark.slow]

ENV = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2", PATH=f"{VENV_BIN}:{os.environ['PATH']}")


def test_a_generated_sbatch_script_passes_the_controller_and_trains(slurm, tmp_path):
    path = write_manifest(tmp_path, "slurm", "a: cpu:0,cpu:1\nb: cpu:0,cpu:1\n", "--run_option", "MPI")
    checked = slurm.run(["sbatch", "--test-only", path], env=ENV)
    assert checked.returncode == 0 and "to start at" in checked.stderr + checked.stdout, checked
    run = submit(slurm, tmp_path, [], [path])
    check_ranks_match(run, expected_values("mlp"), 4)
    assert "starting 4 processes (vhost1 x2, vhost2 x2)" in run.output, run.output[-3000:]
    assert_nothing_left(slurm.cluster)


def test_the_htcondor_node_script_trains_across_the_machines(cluster, tmp_path):
    """HTCondor's parallel universe: the executable (create_environment.sh) runs on every machine at once in
    the shared submit directory, with _CONDOR_PROCNO and _CONDOR_NPROCS; node 0 trains over ssh."""
    path = write_manifest(tmp_path, "condor", "a: cpu:0\nb: cpu:0\nc: cpu:0\n", "--run_option", "MPI",
                          "--setup", f"export PATH={VENV_BIN}:$PATH")
    submit_dir = os.path.dirname(path)
    with open(path) as f:
        submit_file = dict(line.split(" = ", 1) for line in f.read().splitlines() if " = " in line)
    arguments = [a.strip("'") for a in submit_file["arguments"].strip('"').split("' '")]
    argv = [f"./{submit_file['executable']}", *[a.replace("$(Cluster)", "42") for a in arguments]]
    nodes = [cluster.popen(host, argv, cwd=submit_dir, env=dict(ENV, _CONDOR_PROCNO=str(i), _CONDOR_NPROCS="3"),
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                           start_new_session=True)
             for i, host in enumerate(["vhost1", "vhost2", "vhost3"])]
    run = finish(nodes[0], str(tmp_path / "out"), cluster=cluster)
    others = [n.communicate(timeout=60)[0] for n in nodes[1:]]
    assert [n.returncode for n in nodes[1:]] == [0, 0], others
    check_ranks_match(run, expected_values("mlp"), 3)
    written = open(os.path.join(submit_dir, "parallax-condor.42", "resource_info")).read()
    assert [line.split(":")[0].split(".")[0] for line in written.splitlines()] == ["vhost1", "vhost2", "vhost3"]
    assert_nothing_left(cluster)


def test_a_generated_mpijob_launcher_trains_on_its_worker_pods(cluster, tmp_path):
    """The MPI Operator's part: worker pods (vhost2, vhost3) with the manifest's slots, a host file of them,
    and the launcher container (on vhost1) started with its command, working directory and environment."""
    path = write_manifest(tmp_path, "mpijob", "a: cpu:0,cpu:1\nb: cpu:0,cpu:1\n", model="embedding")
    with open(path) as f:
        spec = yaml.safe_load(f)["spec"]
    workers = spec["mpiReplicaSpecs"]["Worker"]["replicas"]
    hostfile = tmp_path / "hostfile"
    hostfile.write_text("".join(f"vhost{2 + i} slots={spec['slotsPerWorker']}\n" for i in range(workers)))
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    env = dict(ENV, OMPI_MCA_orte_default_hostfile=str(hostfile), **{e["name"]: e["value"] for e in launcher["env"]})
    proc = cluster.popen("vhost1", launcher["command"], cwd=launcher["workingDir"], env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    run: Run = finish(proc, str(tmp_path / "out"), cluster=cluster)
    check_ranks_match(run, expected_values("embedding"), 4)
    assert "vhost2" in run.output and "vhost3" in run.output, run.output[-3000:]
    assert_nothing_left(cluster)
