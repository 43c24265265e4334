"""Kubeflow's TFJob and MPIJob (pure): the YAML a user applies with ``kubectl apply -f``.

TFJob (``kubeflow.org/v1``): one pod per process of the job plan, ``Chief`` for worker 0,
``Worker`` for the others, ``PS`` for the parameter servers. The training operator gives
each pod a ``TF_CONFIG`` naming every pod's service (``<job>-worker-1.<namespace>.svc:2222``)
and its own task, so each runs the command as it is and joins the job
(:mod:`parallax.member.joined`): PS over gRPC, MPI over TF collectives, one GPU per worker.

MPIJob (``kubeflow.org/v2beta1``, the MPI Operator): one worker pod per host of the job
plan with a slot per device, and a launcher pod that runs the command with
``PARALLAX_RESOURCE_INFO=mpijob``: Parallax reads the operator's host file and launches
every process of the plan through ``mpirun`` over the operator's ssh
(:mod:`parallax.managers.mpijob`). Any run option works there.
"""

from __future__ import annotations

import json

from parallax.errors import ManifestError
from parallax.invocation import RESOURCE_ENV, SLOT_DEVICE_ENV, TF_CONFIG_ENV
from parallax.job.plan import JobPlan
from parallax.managers.mpijob import MPIJOB, hostfile_text
from parallax.managers.tf_config import read_tf_config
from parallax.manifests.common import Files, ManifestRequest, View, hosts_alike, resources_of, workers_alike
from parallax.plan.model import Layout
from parallax.resources.cluster import Cluster, Role
from parallax.resources.rolespec import Resources, RoleSpec

__all__ = ["tfjob", "tfjob_replicas", "mpijob", "container", "k8s_resources", "tf_config_view"]

GPU_RESOURCE = "nvidia.com/gpu"


def k8s_resources(resources: Resources | None, gpus: int) -> dict:
    """A container's ``resources``: the spec's cpu (cores) and memory (MB, as ``Mi``) requests and limits,
    and its GPUs as a limit of ``nvidia.com/gpu`` (Kubernetes takes GPUs as limits)."""
    requests: dict = {}
    limits: dict = {}
    if resources is not None:
        for key, (request, limit), unit in (("cpu", resources.cpu, ""), ("memory", resources.memory, "Mi")):
            for target, value in ((requests, request), (limits, limit)):
                if value is not None:
                    target[key] = f"{value:g}{unit}"
    if gpus:
        limits[GPU_RESOURCE] = gpus
    return {k: v for k, v in (("requests", requests), ("limits", limits)) if v}


def container(name: str, request: ManifestRequest, command: list[str], env: list[tuple[str, str]],
              resources: dict, ports: list[dict] | None = None, workdir: bool = True) -> dict:
    """One container of a pod template (in ``request.workdir`` when ``workdir``)."""
    out: dict = {"name": name, "image": _image(request), "command": list(command)}
    if workdir and request.workdir:
        out["workingDir"] = request.workdir
    if env:
        out["env"] = [{"name": k, "value": v} for k, v in env]
    if ports:
        out["ports"] = [dict(p) for p in ports]
    if resources:
        out["resources"] = resources
    return out


def _image(request: ManifestRequest) -> str:
    if not request.image:
        raise ManifestError(f"--kind {request.kind} needs --image: the container image with Python, TensorFlow, "
                            "Parallax and the training script")
    return request.image


#: The TFJob's restart policy of every replica (docs/launching.md, "Elastic and preemptible jobs").
RESTART_POLICY = "ExitCode"


def _replica(replicas: int, pod_container: dict, restart: str = "Never") -> dict:
    return {"replicas": replicas, "restartPolicy": restart, "template": {"spec": {"containers": [pod_container]}}}


def _role_resources(spec: RoleSpec | None, role: Role, count: int, what: str) -> Resources | None:
    """The one set of resources the spec gives the ``count`` tasks of ``role`` (one pod template)."""
    found = [resources_of(spec, role, i) for i in range(count)]
    if spec is not None and any(r != found[0] for r in found):
        lines = ", ".join(str(t.line) for t in spec.of(role))
        raise ManifestError(f"{spec.source}: the {role} tasks have different resources (lines {lines}); {what} "
                            "gives them one pod template")
    return found[0] if found else None


def tf_config_view(what: str, cluster: dict[str, list[str]], gpus: int) -> View:
    """The resources the tasks of ``cluster`` (TF_CONFIG's) read: its explicit-role text."""
    first = next(iter(cluster))
    managed = read_tf_config({TF_CONFIG_ENV: json.dumps({"cluster": cluster, "task": {"type": first, "index": 0}})})
    return View(what, managed.cluster_text, gpus, TF_CONFIG_ENV)


def tfjob_replicas(job: JobPlan, cluster: Cluster, spec: RoleSpec | None, request: ManifestRequest
                   ) -> tuple[dict[str, dict], View]:
    """The TFJob's replica specs (``Chief``, ``Worker``, ``PS``) of every process of ``job``, and what their
    pods read (their TF_CONFIG cluster): shared by the TFJob and the polyaxonfile."""
    if job.layout is Layout.LOCAL:
        raise ManifestError(f"{cluster.source}: one worker trains in one process, without TF_CONFIG; a TFJob "
                            "needs two tasks or more (run the command in a plain Kubernetes Job)")
    gpus = workers_alike(job, cluster.source, "a TFJob")
    workers, servers = len(job.workers), len(job.processes) - len(job.workers)
    env = list(request.environment)
    # the same number over UDP: each task's heartbeats to worker 0's stall check (parallax/member/joined.py)
    port = [{"name": "tfjob-port", "containerPort": request.port},
            {"name": "parallax-stall", "containerPort": request.port, "protocol": "UDP"}]
    command = list(request.command)
    # ExitCode: the operator restarts a task that exits with 128-255 (killed: 137; ended because another task
    # went, or preempted: 143), which resumes from the job's checkpoint; 1-127 (an exception) fails the job
    specs = {"Chief": _replica(1, container("tensorflow", request, command, env,
                                            k8s_resources(resources_of(spec, Role.MASTER, 0), gpus), port),
                               RESTART_POLICY)}
    if workers > 1:
        res = _role_resources(spec, Role.WORKER, workers - 1, "a TFJob")
        specs["Worker"] = _replica(workers - 1, container("tensorflow", request, command, env,
                                                          k8s_resources(res, gpus), port), RESTART_POLICY)
    if servers:
        res = _role_resources(spec, Role.PS, servers, "a TFJob")
        specs["PS"] = _replica(servers, container("tensorflow", request, command, env, k8s_resources(res, 0), port),
                               RESTART_POLICY)
    names = {kind.lower(): [f"{request.name}-{kind.lower()}-{i}.default.svc:{request.port}"
                            for i in range(specs[kind]["replicas"])] for kind in specs}
    return specs, tf_config_view("the TFJob's pods", names, gpus)


def tfjob(job: JobPlan, cluster: Cluster, spec: RoleSpec | None, request: ManifestRequest) -> Files:
    """A TFJob of every process of ``job`` (see the module docstring)."""
    specs, view = tfjob_replicas(job, cluster, spec, request)
    doc = {"apiVersion": "kubeflow.org/v1", "kind": "TFJob", "metadata": {"name": request.name},
           "spec": {"runPolicy": {"cleanPodPolicy": "Running"}, "tfReplicaSpecs": specs}}
    workers = len(job.workers)
    return Files({f"{request.name}.tfjob.yaml": _yaml(doc)}, (view,), notes=(
        f"kubectl apply -f {request.name}.tfjob.yaml: {len(job.processes)} pods ({workers} worker(s), "
        f"{len(job.processes) - workers} ps), each running: {request.shell_command}",))


def mpijob(job: JobPlan, cluster: Cluster, request: ManifestRequest) -> Files:
    """An MPIJob: a worker pod per host of ``job``, a slot per device, and the launcher (see the module docstring)."""
    shape = hosts_alike(job, cluster.source, "an MPIJob")
    gpu, slots = shape.gpu, shape.slots
    env = [(RESOURCE_ENV, MPIJOB), *([(SLOT_DEVICE_ENV, "gpu")] if gpu else []), *request.environment]
    launcher = container("launcher", request, list(request.command), env, {})
    worker = container("worker", request, ["/usr/sbin/sshd", "-De"], [], k8s_resources(None, slots if gpu else 0),
                       workdir=False)
    doc = {"apiVersion": "kubeflow.org/v2beta1", "kind": "MPIJob", "metadata": {"name": request.name},
           "spec": {"slotsPerWorker": slots, "runPolicy": {"cleanPodPolicy": "Running"},
                    "mpiImplementation": "OpenMPI",
                    "mpiReplicaSpecs": {"Launcher": _replica(1, launcher, "OnFailure"),
                                        "Worker": _replica(len(shape.hosts), worker, "OnFailure")}}}
    hostfile = "".join(f"{request.name}-worker-{i}.{request.name}-worker.default.svc slots={slots}\n"
                       for i in range(len(shape.hosts)))
    view = View("the MPIJob's launcher", hostfile_text(hostfile, "the MPIJob's host file", gpus=gpu), 0)
    return Files({f"{request.name}.mpijob.yaml": _yaml(doc)}, (view,), notes=(
        f"kubectl apply -f {request.name}.mpijob.yaml: {len(shape.hosts)} worker pod(s) with {slots} slot(s) "
        f"each (they run sshd: the image needs openssh-server), the launcher runs: {request.shell_command}",))


def _yaml(doc: dict) -> str:
    import yaml

    return "# written by parallax manifest\n" + yaml.safe_dump(doc, sort_keys=False, default_flow_style=False)
