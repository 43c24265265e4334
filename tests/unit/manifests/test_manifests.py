"""``parallax manifest``'s files (pure): made from the job plan, refused when the manager's processes would
plan another job, and checked by each manager's own validator (the CRD schemas with openapi-schema-validator,
polyaxon's reader, htcondor's submit parser, sbatch --test-only, bash -n).

A validator that is not installed is a failure under CI and a skip elsewhere (tests/requirements.py). The pip
ones come with the dev extra (make test's venv); Slurm's sbatch with ``make cluster-packages``, so the tests
that need it are marked ``slurm`` and run in ``make test-cluster``, after it installed Slurm."""

from __future__ import annotations

import pytest
import yaml

from parallax.analysis import analyse_graph
from parallax.config import Config
from parallax.errors import ManifestError
from parallax.job.plan import make_job_plan
from parallax.job.settings import derive
from parallax.manifests import ManifestRequest, make_manifest
from parallax.manifests.common import planner
from parallax.manifests.validate import validate
from parallax.resources.files import parse_resource_text
from parallax.resources.rolespec import parse_role_spec
from tests.models import build_embedding, build_mlp
from tests.requirements import unavailable

COMMAND = ("python", "train.py", "--steps", "100")


@pytest.fixture(scope="module")
def analyses():
    return {"mlp": analyse_graph(build_mlp("adam").graph), "embedding": analyse_graph(build_embedding("adam").graph)}


def manifest(analyses, kind, text, model="mlp", gpus=0, manager=None, **request):
    """The files of ``kind`` for the resource ``text``, as ``parallax manifest`` makes them."""
    cluster = parse_resource_text(text, "res")
    run_option = request.pop("run_option", None)  # as --run_option: the job's, and every process's variable
    config = Config(run_option=run_option)
    settings = derive(config, True, cluster, gpus=gpus, cpu_count=8, manager=manager)
    job = make_job_plan(cluster, settings, analyses[model])
    req = ManifestRequest(kind, COMMAND, name="demo", image="me/train:1", run_option=run_option, **request)
    return make_manifest(job, cluster, req, planner(config, True, analyses[model]))


def checked(kind, files):
    """``validate(kind, files)`` with every validator it uses installed (else the test fails under CI, skips
    elsewhere)."""
    checks = validate(kind, files)
    for check in checks:
        if check.missing:
            unavailable(f"a validator is not installed: {check.by}",
                        "`make cluster-packages` installs Slurm (root), and `make test-cluster` runs the tests "
                        "marked slurm" if "sbatch" in check.by else "setup.py's dev extra has it (make test's venv)")
    return checks


def valid(kind, files):
    """Every file of the manifest passes every validator of its kind."""
    checks = checked(kind, files)
    assert checks, files
    for check in checks:
        assert check.ok, (check.by, check.problems)
    return checks


TF_ROLES = "ps,a,2222,\nps,b,2222,\nworker,a,2223,0\nworker,b,2223,0\nworker,c,2223,0\n"


def test_a_tfjob_has_a_pod_per_process_with_its_gpu(analyses):
    files = manifest(analyses, "tfjob", TF_ROLES, gpus=1, manager="TF_CONFIG", run_option="PS")
    valid("tfjob", files.files)
    doc = yaml.safe_load(files.files["demo.tfjob.yaml"])
    assert doc["apiVersion"] == "kubeflow.org/v1" and doc["kind"] == "TFJob"
    specs = doc["spec"]["tfReplicaSpecs"]
    assert {k: v["replicas"] for k, v in specs.items()} == {"Chief": 1, "Worker": 2, "PS": 2}
    chief = specs["Chief"]["template"]["spec"]["containers"][0]
    assert chief["command"] == list(COMMAND) and chief["resources"] == {"limits": {"nvidia.com/gpu": 1}}
    assert {"name": "PARALLAX_RUN_OPTION", "value": "PS"} in chief["env"]
    assert chief["ports"] == [{"name": "tfjob-port", "containerPort": 2222},
                              {"name": "parallax-stall", "containerPort": 2222, "protocol": "UDP"}]
    assert "resources" not in specs["PS"]["template"]["spec"]["containers"][0]
    # a task killed (137) or left without a peer (143) is restarted and resumes; an exception (1) fails the job
    assert {v["restartPolicy"] for v in specs.values()} == {"ExitCode"}


def test_a_role_spec_gives_each_role_its_requests_and_limits(analyses):
    spec = ("environment:\n  resources:\n    cpu: {requests: 2, limits: 4}\n    gpu: {requests: 1, limits: 1}\n"
            "  tensorflow:\n    n_workers: 2\n    n_ps: 1\n    default_worker:\n      resources:\n"
            "        gpu: {requests: 1, limits: 1}\n        memory: {requests: 1024}\n"
            "    default_ps:\n      resources:\n        memory: {requests: 256, limits: 512}\n")
    for kind in ("tfjob", "polyaxon"):
        files = manifest(analyses, kind, spec, gpus=1, manager="TF_CONFIG")
        valid(kind, files.files)
    run = yaml.safe_load(files.files["polyaxonfile.yaml"])["run"]
    assert run["kind"] == "tfjob" and {k: run[k]["replicas"] for k in ("chief", "worker", "ps")} == \
        {"chief": 1, "worker": 2, "ps": 1}
    assert run["chief"]["container"]["resources"] == {"requests": {"cpu": "2"},
                                                      "limits": {"cpu": "4", "nvidia.com/gpu": 1}}
    assert run["worker"]["container"]["resources"] == {"requests": {"memory": "1024Mi"},
                                                       "limits": {"nvidia.com/gpu": 1}}
    assert run["ps"]["container"]["resources"] == {"requests": {"memory": "256Mi"}, "limits": {"memory": "512Mi"}}


def test_the_polyaxonfile_parallax_writes_reads_back_as_the_job_it_describes(analyses):
    """parallax manifest --kind polyaxon writes a v1.1 polyaxonfile; given back as the resources (to parallax plan,
    parallel_run or parallax manifest), it is the same job, not one task."""
    spec = ("environment:\n  resources:\n    cpu: {requests: 2, limits: 4}\n    gpu: {limits: 1}\n"
            "  tensorflow:\n    n_workers: 2\n    n_ps: 1\n    default_worker:\n      resources:\n"
            "        gpu: {limits: 1}\n        memory: {requests: 1024}\n"
            "    default_ps:\n      resources:\n        memory: {requests: 256, limits: 512}\n")
    written = manifest(analyses, "polyaxon", spec, gpus=1, manager="TF_CONFIG").files["polyaxonfile.yaml"]
    original, read = parse_resource_text(spec, "res"), parse_resource_text(written, "res")
    assert [w.devices for w in read.workers] == [w.devices for w in original.workers]  # 3 workers, a GPU each
    assert len(read.servers) == len(original.servers) == 1
    assert [t.resources for t in parse_role_spec(written, "res").tasks] == \
        [t.resources for t in parse_role_spec(spec, "res").tasks]
    assert manifest(analyses, "polyaxon", written, gpus=1, manager="TF_CONFIG").files["polyaxonfile.yaml"] == written


def test_per_index_overrides_do_not_fit_one_worker_template(analyses):
    spec = ("environment:\n  tensorflow:\n    n_workers: 2\n    worker:\n      - index: 1\n        resources:\n"
            "          cpu: {requests: 3}\n")
    with pytest.raises(ManifestError, match="the worker tasks have different resources .*one pod template"):
        manifest(analyses, "tfjob", spec, manager="TF_CONFIG")


@pytest.mark.parametrize("text, run_option, message", [
    ("localhost: cpu:0", None, "one worker trains in one process"),
    ("a: cpu:0,cpu:1\nb: cpu:0,cpu:1", "PS", r"res, line 1: worker 0 has 2 CPU replicas; a TFJob gives each task "
                                            "its GPUs or one CPU replica"),
    ("a: 0,1\nb: 0", "PS", r"res, line 2: worker 1 has device\(s\) gpu:0 and worker 0 gpu:0, gpu:1"),
], ids=["one-worker", "cpu-replicas", "uneven-gpus"])
def test_what_a_tfjob_cannot_describe_is_refused_naming_the_line(analyses, text, run_option, message):
    with pytest.raises(ManifestError, match=message):
        manifest(analyses, "tfjob", text, gpus=2, run_option=run_option)


def test_a_run_option_the_pods_cannot_run_is_refused_with_what_to_use(analyses):
    """HYBRID planned from the file (the launcher's job) cannot run in pods started from TF_CONFIG: the
    pods' own planning says so, and the manifest is not written."""
    with pytest.raises(ManifestError, match=r"the TFJob's pods could not run this job: run_option='HYBRID' "
                                            r"cannot run in tasks started from TF_CONFIG.*--kind mpijob"):
        manifest(analyses, "tfjob", "a: cpu:0\nb: cpu:0", model="embedding", run_option="HYBRID")


def test_an_mpijob_has_a_worker_pod_per_host_and_a_slot_per_device(analyses):
    files = manifest(analyses, "mpijob", "a: 0,1\nb: 0,1", gpus=2, run_option="MPI")
    valid("mpijob", files.files)
    spec = yaml.safe_load(files.files["demo.mpijob.yaml"])["spec"]
    assert spec["slotsPerWorker"] == 2 and spec["mpiReplicaSpecs"]["Worker"]["replicas"] == 2
    launcher = spec["mpiReplicaSpecs"]["Launcher"]["template"]["spec"]["containers"][0]
    assert launcher["command"] == list(COMMAND)
    assert {"name": "PARALLAX_RESOURCE_INFO", "value": "mpijob"} in launcher["env"]
    assert {"name": "PARALLAX_SLOT_DEVICE", "value": "gpu"} in launcher["env"]
    worker = spec["mpiReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0]
    assert worker["resources"] == {"limits": {"nvidia.com/gpu": 2}} and worker["command"][0] == "/usr/sbin/sshd"


def test_an_mpijob_runs_any_run_option_the_launcher_plans(analyses):
    files = manifest(analyses, "mpijob", "a: cpu:0,cpu:1\nb: cpu:0,cpu:1", model="embedding", run_option="HYBRID")
    valid("mpijob", files.files)


@pytest.mark.parametrize("kind", ["mpijob", "slurm", "condor"])
def test_hosts_of_different_sizes_are_refused_by_the_host_kinds(analyses, kind):
    with pytest.raises(ManifestError, match=r"res, line 2: b has device\(s\) cpu:0 and a cpu:0,cpu:1; .* the same"):
        manifest(analyses, kind, "a: cpu:0,cpu:1\nb: cpu:0", run_option="MPI")


@pytest.mark.slurm
def test_an_sbatch_script_asks_for_the_hosts_and_reads_the_allocation(analyses):
    files = manifest(analyses, "slurm", "a: 0,1,2,3\nb: 0,1,2,3\nc: 0,1,2,3", gpus=4, run_option="MPI",
                     time="2:00:00", python_env=("source /shared/venv/bin/activate",))
    text = files.files["demo.sbatch"]
    for line in ("#SBATCH --nodes=3", "#SBATCH --ntasks-per-node=4", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --time=2:00:00", "source /shared/venv/bin/activate", "export PARALLAX_RESOURCE_INFO=slurm",
                 "#SBATCH --signal=B:TERM@120", "#SBATCH --requeue", "python train.py --steps 100 &",
                 'if [ "$code" -eq 143 ]; then scontrol requeue "$SLURM_JOB_ID"; fi'):
        assert line in text.splitlines(), (line, text)
    valid("slurm", files.files)


def test_the_example_sbatch_recipe_runs_its_command_as_the_manifest_does():
    """examples/slurm/parallax.sbatch passes Slurm's SIGTERM on and requeues with the very lines
    ``parallax manifest --kind slurm`` writes (parallax/manifests/batch.py: preemptible)."""
    import pathlib

    from parallax.manifests.batch import SLURM_SIGNAL_LEAD, preemptible

    recipe = (pathlib.Path(__file__).parents[3] / "examples" / "slurm" / "parallax.sbatch").read_text().splitlines()
    run = [line for line in preemptible('parallax-run "$@"') if not line.startswith("#")]
    start = recipe.index(run[0])
    assert recipe[start:start + len(run)] == run
    assert f"#SBATCH --signal=B:TERM@{SLURM_SIGNAL_LEAD}" in recipe and "#SBATCH --requeue" in recipe


def test_an_htcondor_job_asks_for_the_machines_and_writes_their_resource_file(analyses):
    files = manifest(analyses, "condor", "a: 0,1\nb: 0,1", gpus=2, run_option="PS", env=(("LOG", "x y"),))
    assert set(files.files) == {"parallax.sub", "parallax_condor.sh", "create_environment.sh"}
    assert files.executables == {"parallax_condor.sh", "create_environment.sh"}
    submit = files.files["parallax.sub"].splitlines()
    for line in ("universe = parallel", "machine_count = 2", "request_gpus = 2", "executable = create_environment.sh",
                 "arguments = \"'./parallax_condor.sh' '$(Cluster)' 'python' 'train.py' '--steps' '100'\"", "queue"):
        assert line in submit
    assert 'echo "$(cat "$dir/node.$i"): 0,1"' in files.files["parallax_condor.sh"]
    assert "export LOG='x y'" in files.files["create_environment.sh"]
    checks = valid("condor", files.files)
    assert any("htcondor.Submit" in c.by for c in checks)


# --- the validators catch what is wrong ---------------------------------------------------------------------

def _edited(files, name, edit):
    doc = yaml.safe_load(files[name])
    edit(doc)
    return {name: yaml.safe_dump(doc)}


@pytest.mark.parametrize("edit, problem", [
    (lambda d: d["spec"]["tfReplicaSpecs"]["Worker"].update(replicas="two"), "'two' is not of type 'integer'"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["Worker"]["template"]["spec"]["containers"][0].update(imagee="x"),
     "'imagee' was unexpected"),
    (lambda d: d["spec"]["tfReplicaSpecs"].update(Wroker=d["spec"]["tfReplicaSpecs"].pop("Worker")),
     "'Wroker' was unexpected"),
    (lambda d: d["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"].pop("containers"),
     "'containers' is a required property"),
    (lambda d: d.update(apiVersion="kubeflow.org/v2"), "is not one of ['kubeflow.org/v1']"),
], ids=["replicas", "unknown-field", "replica-type", "no-containers", "api-version"])
def test_the_tfjob_schema_rejects_a_broken_manifest(analyses, edit, problem):
    files = manifest(analyses, "tfjob", TF_ROLES, gpus=1, manager="TF_CONFIG", run_option="PS").files
    [check] = checked("tfjob", _edited(files, "demo.tfjob.yaml", edit))
    assert any(problem in p for p in check.problems), check.problems


def test_the_mpijob_schema_rejects_a_broken_manifest(analyses):
    files = manifest(analyses, "mpijob", "a: cpu:0\nb: cpu:0", run_option="MPI").files
    [check] = checked("mpijob", _edited(files, "demo.mpijob.yaml",
                                         lambda d: d["spec"].update(mpiImplementation="MVAPICH")))
    assert any("'MVAPICH' is not one of" in p for p in check.problems), check.problems


def test_polyaxon_rejects_a_broken_polyaxonfile(analyses):
    files = manifest(analyses, "polyaxon", "a: cpu:0\nb: cpu:0", manager="TF_CONFIG").files
    [check] = checked("polyaxon", _edited(files, "polyaxonfile.yaml", lambda d: d["run"]["worker"].update(
        replicas="x")))
    assert check.problems and "replicas" in check.problems[0], check.problems


@pytest.mark.parametrize("edit, problem", [
    (lambda t: t.replace("request_cpus = 1", "request_cpus = eight"), "RequestCpus = eight does not evaluate"),
    (lambda t: t.replace("machine_count = 2\n", ""), "machine_count"),
    (lambda t: t.replace("universe = parallel", "universe = nonsense"), "nonsense"),
    (lambda t: t.replace("queue\n", ""), "no queue statement"),
], ids=["cpus", "no-machine-count", "universe", "no-queue"])
def test_htcondor_rejects_a_broken_submit_file(analyses, edit, problem):
    files = manifest(analyses, "condor", "a: cpu:0\nb: cpu:0", run_option="MPI").files
    [check] = checked("condor", {"parallax.sub": edit(files["parallax.sub"])})
    assert any(problem in p for p in check.problems), check.problems


def test_a_shell_syntax_error_is_caught():
    [check] = checked("condor", {"create_environment.sh": "#!/bin/bash\nif then\n"})
    assert check.problems


@pytest.mark.slurm
def test_sbatch_rejects_a_broken_script(analyses):
    files = manifest(analyses, "slurm", "a: cpu:0\nb: cpu:0", run_option="MPI").files
    broken = files["demo.sbatch"].replace("#SBATCH --nodes=2", "#SBATCH --nodes=two")
    checks = checked("slurm", {"demo.sbatch": broken})
    assert any("not a valid node count" in p for c in checks for p in c.problems), checks


# --- docs/launching.md shows what the command writes --------------------------------------------------------

DOC_SPEC = ("environment:\n  resources:\n    gpu: {requests: 1, limits: 1}\n  tensorflow:\n    n_workers: 2\n"
            "    n_ps: 2\n    default_worker:\n      resources:\n        gpu: {requests: 1, limits: 1}\n"
            "        memory: {requests: 8192, limits: 16384}\n    default_ps:\n      resources:\n"
            "        cpu: {requests: 2, limits: 4}\n")
DOC_HOSTS = "node1: 0,1,2,3\nnode2: 0,1,2,3\n"
DOC_COMMAND = ("python", "train.py", "--steps", "10000")
DOC_CASES = {  # kind: (resources, its file name, GPUs of this machine, manager, request fields)
    "tfjob": (DOC_SPEC, "spec.yaml", 1, "TF_CONFIG", {"image": "registry.example.com/team/train:1"}),
    "polyaxon": (DOC_SPEC, "spec.yaml", 1, "TF_CONFIG", {"image": "registry.example.com/team/train:1"}),
    "mpijob": (DOC_HOSTS, "resource_info", 4, None, {"image": "registry.example.com/team/train:1"}),
    "slurm": (DOC_HOSTS, "resource_info", 4, None, {"python_env": ("source /shared/project/.venv/bin/activate",),
                                                   "workdir": "/shared/project", "time": "12:00:00"}),
    "condor": (DOC_HOSTS, "resource_info", 4, None, {"python_env": ("source /shared/project/.venv/bin/activate",)}),
}


def doc_manifest(analyses, kind):
    text, source, gpus, manager, fields = DOC_CASES[kind]
    cluster = parse_resource_text(text, source)
    config = Config()
    job = make_job_plan(cluster, derive(config, True, cluster, gpus=gpus, cpu_count=8, manager=manager),
                        analyses["mlp"])
    request = ManifestRequest(kind, DOC_COMMAND, name="train", **fields)
    return make_manifest(job, cluster, request, planner(config, True, analyses["mlp"]))


@pytest.mark.parametrize("kind", [pytest.param(k, marks=pytest.mark.slurm) if k == "slurm" else k
                                  for k in sorted(DOC_CASES)])
def test_the_docs_show_what_the_command_writes(analyses, kind):
    import pathlib

    docs = (pathlib.Path(__file__).parents[3] / "docs" / "launching.md").read_text()
    files = doc_manifest(analyses, kind)
    valid(kind, files.files)
    for name, text in files.files.items():
        assert text in docs, f"docs/launching.md does not show {name} as parallax manifest writes it:\n{text}"
