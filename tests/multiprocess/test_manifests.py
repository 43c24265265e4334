"""``parallax manifest`` end to end: the TFJob (or polyaxonfile) it writes, its pods started as the training
operator starts them (each with its container's command, environment and a TF_CONFIG: task_manager.py
--manifest), trains the job its resource file describes, equal to single-device training."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from tests.multiprocess.harness import ROOT
from tests.multiprocess.test_mpi_mode import BATCH, STEPS, check_ranks_match, expected_values
from tests.multiprocess.test_tf_config_jobs import check_ids, run_managed

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]


def write_manifest(tmp_path, kind: str, resources: str, *flags: str, model: str = "mlp") -> str:
    """Run ``parallax manifest`` on the test's training script; the path of the (first) file it wrote."""
    res = tmp_path / ("spec.yaml" if resources.startswith("environment") else "resources")
    res.write_text(resources)
    out = tmp_path / "out"
    command = ["python", "tests/multiprocess/train_script.py", "--resource_info", "unused", "--out", str(out),
               "--steps", str(STEPS), "--batch", str(BATCH), "--model", model, "--average_sparse",
               "--run_option", "default"]
    argv = [sys.executable, "-c", "import sys; from parallax.cli import parallax_main; sys.exit(parallax_main())",
            "manifest", "--kind", kind, "--image", "parallax-test:1", "--workdir", ROOT, "-o", str(tmp_path / "m"),
            "--name", "test-job", *flags, str(res), "--", *command]
    env = dict(os.environ, PYTHONPATH=ROOT, TF_CPP_MIN_LOG_LEVEL="2")
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-4000:]
    assert "INVALID" not in proc.stdout and "not validated" not in proc.stdout, proc.stdout
    written = [line.split("wrote ", 1)[1] for line in proc.stdout.splitlines() if "wrote " in line]
    assert written, proc.stdout
    return written[0]


def test_a_generated_tfjob_trains_when_its_pods_start_as_their_env_says(tmp_path):
    """Two ps and three workers in an explicit-role file, run option PS chosen at the command line: the TFJob
    has Chief 1, Worker 2, PS 2 with PARALLAX_RUN_OPTION=PS, and its pods train the job."""
    roles = "".join(f"ps,localhost,{5000 + i}," + "\n" for i in range(2)) + \
        "".join(f"worker,localhost,{5100 + i},cpu:0\n" for i in range(3))
    path = write_manifest(tmp_path, "tfjob", roles, "--run_option", "PS")
    with open(path) as f:
        specs = yaml.safe_load(f)["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Chief": 1, "Worker": 2, "PS": 2}
    assert {"name": "PARALLAX_RUN_OPTION", "value": "PS"} in specs["Worker"]["template"]["spec"]["containers"][0]["env"]
    run = run_managed(tmp_path, None, manifest=path)
    check_ranks_match(run, expected_values("mlp"), 3)
    check_ids(run, 3)
    assert "job: layout PS, 5 process(es)" in run.log("chief_0")


def test_a_polyaxonfile_from_a_role_spec_trains_with_collectives(tmp_path):
    """A Polyaxon role spec (a master and two workers, no ps): the polyaxonfile's tfjob run, its tasks
    started as Polyaxon's operator starts them, all-reduce over TF collectives (MPI by default), equal."""
    spec = ("environment:\n  resources:\n    cpu: {requests: 1, limits: 2}\n    memory: {requests: 512, limits: 2048}\n"
            "  tensorflow:\n    n_workers: 2\n    default_worker:\n      resources:\n        cpu: {requests: 1}\n")
    path = write_manifest(tmp_path, "polyaxon", spec, model="embedding")
    with open(path) as f:
        run_section = yaml.safe_load(f)["run"]
    assert run_section["chief"]["container"]["resources"] == {"requests": {"cpu": "1", "memory": "512Mi"},
                                                              "limits": {"cpu": "2", "memory": "2048Mi"}}
    assert run_section["worker"]["replicas"] == 2 and "ps" not in run_section
    run = run_managed(tmp_path, None, manifest=path)
    check_ranks_match(run, expected_values("embedding"), 3)
    assert "job: layout MPI, 3 process(es)" in run.log("chief_0")
