"""What every manifest kind shares: the request, the job's processes, and the check that the
processes a manager starts from the manifest plan the same job (pure).

A manifest is written from the job plan the launcher would use (:mod:`parallax.job.plan`). Each kind
also says what its processes will read as their resources once the manager has started them (a
``TF_CONFIG`` per task, an MPIJob's host file, a Slurm allocation, the resource file an HTCondor
node writes): a :class:`View`. :func:`check_views` plans the job again from each view, as those
processes will, and refuses a manifest whose processes would train another job than the plan
(fewer devices per worker, a run option they cannot run, ...), naming the difference.
"""

from __future__ import annotations

import shlex
from collections.abc import Callable
from dataclasses import dataclass, field

from parallax.analysis import GraphAnalysis
from parallax.config import Config
from parallax.errors import LaunchError, ManifestError, ResourceFileError
from parallax.invocation import RUN_OPTION_ENV, Invocation
from parallax.job.plan import JobPlan, ProcessSpec, plan_job
from parallax.resources.cluster import Cluster, Role
from parallax.resources.files import parse_resource_text
from parallax.resources.rolespec import Resources, RoleSpec, looks_like_role_spec, parse_role_spec

__all__ = ["ManifestRequest", "View", "Files", "PlanFor", "planner", "check_views", "role_spec_of", "workers_alike",
           "hosts_alike", "HostShape", "resources_of"]



@dataclass(frozen=True)
class ManifestRequest:
    """What ``parallax manifest`` was asked for.

    Attributes:
        kind: one of :data:`parallax.manifests.KINDS`.
        command: what every process runs, e.g. ``("python", "train.py", "--steps", "100")``.
        name: the job's name (a Kubernetes object name: lower case, digits, ``-``).
        image: the container image (Kubernetes and Polyaxon kinds).
        workdir: the directory the command runs in (``None``: the image's or the job's own).
        env: extra environment variables of every process.
        run_option: a run option replacing the script's, passed to every process in
            ``PARALLAX_RUN_OPTION``, or ``None``.
        port: the TensorFlow server port of each task (``TF_CONFIG`` kinds).
        time: a wall-clock limit (``sbatch --time``), or ``None``.
        python_env: shell lines that prepare a batch node's environment (activate a venv, load
            modules); HTCondor's ``create_environment.sh`` and the sbatch script run them.
    """

    kind: str
    command: tuple[str, ...]
    name: str = "parallax-job"
    image: str | None = None
    workdir: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    run_option: str | None = None
    port: int = 2222
    time: str | None = None
    python_env: tuple[str, ...] = ()

    @property
    def environment(self) -> tuple[tuple[str, str], ...]:
        """Every variable the processes get: the run option's, then the user's."""
        option = ((RUN_OPTION_ENV, self.run_option),) if self.run_option else ()
        return option + self.env

    @property
    def shell_command(self) -> str:
        return shlex.join(self.command)


@dataclass(frozen=True)
class View:
    """What the processes of a manifest read as their resources, once started.

    Attributes:
        what: how messages name them (``the TFJob's pods``).
        text: the resource text they read (a ``TF_CONFIG``'s cluster, a host file, ...).
        gpus: how many GPUs each of them sees.
        manager: ``"TF_CONFIG"`` when a manager starts every task (join mode), else ``None``.
    """

    what: str
    text: str
    gpus: int
    manager: str | None = None


@dataclass(frozen=True)
class Files:
    """A manifest: file name -> text, the views to check, and what the user should know."""

    files: dict[str, str]
    views: tuple[View, ...]
    notes: tuple[str, ...] = field(default=())
    executables: frozenset[str] = frozenset()


#: Plans the job from a view, as its processes will: ``(view) -> JobPlan`` (raises what planning raises).
PlanFor = Callable[[View], JobPlan]


def planner(config: Config, sync: bool, analysis: GraphAnalysis, invocation: Invocation | None = None) -> PlanFor:
    """How a manifest's processes plan the job from what they read: the same config and graph as the job (and
    what ``invocation``, the environment of ``parallax manifest``'s run of the script, asked)."""
    def plan_for(view: View) -> JobPlan:
        cluster = parse_resource_text(view.text, source=view.what)
        return plan_job(config, sync, cluster, analysis, gpus=view.gpus, manager=view.manager,
                        invocation=invocation)[1]
    return plan_for


def check_views(job: JobPlan, manifest: Files, plan_for: PlanFor, source: str) -> None:
    """Refuse a manifest whose processes would plan another job than ``job``.

    Raises:
        ManifestError: naming the view, the process and what differs (or why they cannot plan).
    """
    for view in manifest.views:
        try:
            theirs = plan_for(view)
        except (LaunchError, ResourceFileError) as e:
            raise ManifestError(f"{view.what} could not run this job: {e}") from e
        if theirs.layout != job.layout:
            raise ManifestError(f"{view.what} would run the job as {theirs.layout}, where {source} gives "
                                f"{job.layout}{_option_hint(job)}")
        mine, other = _parts(job.processes), _parts(theirs.processes)
        if mine != other:
            raise ManifestError(f"{view.what} would run another job than {source}: {_difference(mine, other)}")


def _option_hint(job: JobPlan) -> str:
    return "; give --run_option to choose the run option every process uses" if job.notes or job.choices else ""


def _parts(processes: tuple[ProcessSpec, ...]) -> list[tuple[Role, int, int, int]]:
    """Each process's role, index, GPUs and CPU replicas (which CPU device numbers a process uses is its own
    business: one process per device uses one, whatever its number)."""
    return sorted((p.role, p.index, sum(d.kind == "gpu" for d in p.devices), sum(d.kind == "cpu" for d in p.devices))
                  for p in processes)


def _devices(part: tuple[Role, int, int, int]) -> str:
    gpus, cpus = part[2], part[3]
    return " and ".join([*([f"{gpus} GPU(s)"] if gpus else []), *([f"{cpus} CPU replica(s)"] if cpus else [])]) \
        or "no devices"


def _difference(mine: list, other: list) -> str:
    for a, b in zip(mine, other):
        if a != b:
            return (f"its {b[0]} {b[1]} would have {_devices(b)} where the plan gives {a[0]} {a[1]} "
                    f"{_devices(a)}")
    count = lambda parts, role: sum(p[0] == role for p in parts)  # noqa: E731
    return (f"{count(other, Role.WORKER)} worker(s) and {count(other, Role.PS)} ps task(s) where the plan has "
            f"{count(mine, Role.WORKER)} and {count(mine, Role.PS)}")


def role_spec_of(cluster: Cluster) -> RoleSpec | None:
    """The role spec the cluster was read from (its resources per task), if it was one."""
    return parse_role_spec(cluster.text, cluster.source) if looks_like_role_spec(cluster.text) else None


def workers_alike(job: JobPlan, source: str, what: str) -> int:
    """The GPUs of each worker process, when all have the same devices (one pod template, one TF_CONFIG
    reading of a bare host); raises :class:`ManifestError` naming the line of one that differs."""
    workers = job.workers
    first = workers[0]
    for p in workers[1:]:
        if p.devices != first.devices:
            raise ManifestError(f"{source}, line {p.line}: worker {p.index} has device(s) "
                                f"{', '.join(map(str, p.devices))} and worker 0 {', '.join(map(str, first.devices))}; "
                                f"{what} gives every worker the same devices")
    kinds = {d.kind for d in first.devices}
    if "cpu" in kinds and len(first.devices) > 1:
        raise ManifestError(f"{source}, line {first.line}: worker 0 has {len(first.devices)} CPU replicas; "
                            f"{what} gives each task its GPUs or one CPU replica")
    return sum(d.kind == "gpu" for d in first.devices)


@dataclass(frozen=True)
class HostShape:
    """The hosts of a job's workers, each with ``slots`` devices (GPUs when ``gpu``, else CPU replicas)."""

    hosts: tuple[str, ...]
    slots: int
    gpu: bool

    @property
    def devices(self) -> str:
        """Each host's devices as a resource file lists them: ``0,1`` or ``cpu:0,cpu:1``."""
        return ",".join(str(i) if self.gpu else f"cpu:{i}" for i in range(self.slots))


def hosts_alike(job: JobPlan, source: str, what: str) -> HostShape:
    """The hosts of the job's workers and their devices, when every host has as many of the same kind;
    raises :class:`ManifestError` naming the line of a host that differs."""
    devices: dict[str, list[str]] = {}
    lines: dict[str, int] = {}
    for p in job.workers:
        ids = p.visible_gpus.split(",") if p.visible_gpus else [str(d) for d in p.devices]
        devices.setdefault(p.host, []).extend(ids)
        lines.setdefault(p.host, p.line)
    hosts = list(devices)
    first = devices[hosts[0]]
    for host in hosts[1:]:
        if len(devices[host]) != len(first) or _is_gpu(devices[host]) != _is_gpu(first):
            raise ManifestError(f"{source}, line {lines[host]}: {host} has device(s) {','.join(devices[host])} and "
                                f"{hosts[0]} {','.join(first)}; {what} gives every host the same number")
    return HostShape(tuple(hosts), len(first), _is_gpu(first))


def _is_gpu(devices: list[str]) -> bool:
    return not devices[0].startswith("cpu")


def resources_of(spec: RoleSpec | None, role: Role, index: int) -> Resources | None:
    """The resources the spec gives task ``index`` of ``role`` (``master`` for worker 0)."""
    if spec is None:
        return None
    tasks = spec.of(role)
    return tasks[index].resources if index < len(tasks) else None
