"""Elastic jobs: a launched job that loses a process or a host starts again from its last checkpoint.

Without it, a rank or host that fails ends the whole job within seconds, named (:mod:`parallax.launch.runner`).
With :class:`~parallax.config.ElasticConfig` (``max_restarts`` > 0, or ``parallax-run --max-restarts N``) the
launcher then:

1. ends what is left of the job, as before, and keeps the failure;
2. finds the hosts to use: the resource file's hosts that still answer (this machine always does; another is
   checked as ``parallax-run --check`` checks it), or those a host-discovery command lists
   (:func:`discover_hosts`), at most ``max_workers`` worker processes, at least ``min_workers``;
3. plans the job again for them and starts it; every rank restores the job's last checkpoint, which holds the
   single-device graph's names, so it fits any layout and worker count.

Each restart is logged with the failure, the new layout and the checkpoint it resumes from. A job the launcher
was told to stop (SIGINT, SIGTERM) is not restarted; one that fails more than ``max_restarts`` times ends,
naming every failure. A program that sets no ``CheckPointConfig.ckpt_dir`` gets one
(:func:`elastic_checkpoints`), which the launcher gives every rank.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from parallax.config import CheckPointConfig, ElasticConfig
from parallax.errors import LaunchError, ParallaxError, ResourceFileError, TaskFailedError
from parallax.launch.runner import JobResult
from parallax.resources.cluster import Cluster, Device, ServerTask, WorkerTask, is_local_host
from parallax.resources.files import parse_resource_text

__all__ = ["ELASTIC_DIR", "DEFAULT_SAVE_SECS", "elastic_from_text", "elastic_checkpoints", "checkpoint_from_text",
           "checkpoint_to_text", "discover_hosts", "surviving_cluster", "worker_count", "latest_checkpoint",
           "run_elastic"]

#: Where elastic mode saves when the program names no checkpoint directory: ``parallax_elastic/<script>``
#: under the directory the program runs in.
ELASTIC_DIR = "parallax_elastic"
#: How often elastic mode saves when the program names no checkpoint schedule.
DEFAULT_SAVE_SECS = 300.0

#: ``parallax-run``'s options, as the :class:`ElasticConfig` fields they replace.
_OPTION_FIELDS = {"max_restarts": "--max-restarts", "min_workers": "--min-np", "max_workers": "--max-np",
                  "host_discovery_script": "--host-discovery-script"}


def elastic_from_text(elastic: ElasticConfig, text: str | None) -> ElasticConfig:
    """``elastic`` with the fields ``parallax-run`` gave (:data:`~parallax.invocation.ELASTIC_ENV`'s JSON).

    >>> elastic_from_text(ElasticConfig(max_restarts=1), '{"max_restarts": 3, "min_workers": 2}').max_restarts
    3

    Raises:
        ValueError: the text is not such JSON, or a value is out of range (named by its option).
    """
    if not text:
        return elastic
    try:
        given = json.loads(text)
        unknown = set(given) - set(_OPTION_FIELDS)
    except (ValueError, TypeError) as e:
        raise ValueError(f"parallax-run's elastic options: expected JSON of {sorted(_OPTION_FIELDS)}, got "
                         f"{text[:200]!r}") from e
    if unknown:
        raise ValueError(f"parallax-run's elastic options: unknown {sorted(unknown)}")
    merged = {**elastic.to_dict(), **given}
    try:
        return ElasticConfig(**merged)
    except (TypeError, ValueError) as e:
        named = str(e)
        for name, option in _OPTION_FIELDS.items():
            named = named.replace(f"ElasticConfig.{name}", option).replace(f"({name})", f"({option})")
        raise ValueError(f"parallax-run: {named}") from e


def elastic_checkpoints(ckpt: CheckPointConfig, elastic: ElasticConfig, program: Sequence[str],
                        cwd: str | None = None) -> CheckPointConfig | None:
    """The checkpoints an elastic job saves with, where the program's own do not do: ``None`` when the program
    saves on a schedule itself; its directory with elastic mode's schedule when it names a directory only;
    else ``parallax_elastic/<script>`` under ``cwd`` with that schedule.

    >>> elastic_checkpoints(CheckPointConfig(), ElasticConfig(max_restarts=1, save_ckpt_steps=5),
    ...                     ["/x/train.py", "--lr", "1"], cwd="/runs").ckpt_dir
    '/runs/parallax_elastic/train'
    >>> elastic_checkpoints(CheckPointConfig("/c", save_ckpt_steps=2), ElasticConfig(max_restarts=1), []) is None
    True
    """
    if ckpt.ckpt_dir and (ckpt.save_ckpt_steps or ckpt.save_ckpt_secs):
        return None
    schedule = {"save_ckpt_steps": elastic.save_ckpt_steps} if elastic.save_ckpt_steps else \
        {"save_ckpt_secs": elastic.save_ckpt_secs or DEFAULT_SAVE_SECS}
    directory = ckpt.ckpt_dir
    if not directory:
        if program[:1] == ["-m"] and len(program) > 1:
            name = program[1]
        else:
            name = os.path.splitext(os.path.basename(program[0]))[0] if program else "program"
        directory = os.path.join(os.path.abspath(cwd or os.getcwd()), ELASTIC_DIR, name or "program")
    return CheckPointConfig(ckpt_dir=directory, **schedule)


def checkpoint_to_text(ckpt: CheckPointConfig) -> str:
    """The checkpoints of an elastic job, as the launcher gives them to every rank."""
    return json.dumps({"ckpt_dir": ckpt.ckpt_dir, "save_ckpt_steps": ckpt.save_ckpt_steps,
                       "save_ckpt_secs": ckpt.save_ckpt_secs}, sort_keys=True)


def checkpoint_from_text(text: str) -> CheckPointConfig:
    """:func:`checkpoint_to_text` backwards.

    Raises:
        ValueError: not the launcher's JSON.
    """
    try:
        return CheckPointConfig(**json.loads(text))
    except (ValueError, TypeError) as e:
        raise ValueError(f"the elastic launcher's checkpoints: expected its JSON, got {text[:200]!r}") from e


def discover_hosts(command: str, timeout: float = 60.0) -> list[tuple[str, int | None]]:
    """The hosts a host-discovery command lists (horovodrun's convention): one ``host`` or ``host:slots`` a
    line; blank lines and ``#`` comments are skipped.

    Raises:
        LaunchError: the command fails, times out, or prints a line of another shape (named with its number).
    """
    try:
        done = subprocess.run(shlex.split(command), capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise LaunchError(f"host discovery: {command!r} could not be run: {e}") from e
    if done.returncode != 0:
        raise LaunchError(f"host discovery: {command!r} exited with code {done.returncode}: "
                          f"{done.stderr.strip()[-500:]}")
    hosts = []
    for number, raw in enumerate(done.stdout.splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        m = re.fullmatch(r"([A-Za-z0-9_.\-]+)(?::(\d+))?", line)
        if m is None or (m.group(2) is not None and int(m.group(2)) < 1):
            raise LaunchError(f"host discovery: {command!r}, line {number}: {raw!r}; expected 'host' or "
                              "'host:slots' (slots a whole number >= 1)")
        hosts.append((m.group(1), int(m.group(2)) if m.group(2) else None))
    if not hosts:
        raise LaunchError(f"host discovery: {command!r} listed no host")
    return hosts


def _device_token(device: Device) -> str:
    return str(device.index) if device.kind == "gpu" else str(device)


def _replicas(task: WorkerTask) -> int:
    """The workers a resource-file line stands for, as ``min_workers``/``max_workers`` count them: one per
    device (a bare host line: one)."""
    return len(task.devices) if task.devices else 1


def _line(cluster: Cluster, task: WorkerTask | ServerTask, host: str, devices: tuple[Device, ...] | None) -> str:
    """``task``'s resource-file line, on ``host`` and (a worker of the host-per-line format) with ``devices``."""
    if cluster.explicit_roles:
        fields = cluster.text.splitlines()[task.line - 1].split(",")
        fields[1] = host
        return ",".join(fields)
    return host if not devices else f"{host}: {','.join(_device_token(d) for d in devices)}"


def surviving_cluster(cluster: Cluster, alive: set[str], discovered: list[tuple[str, int | None]] | None = None,
                      max_workers: int | None = None) -> Cluster:
    r"""The resources of the next attempt: the lines of ``cluster`` whose host is in ``alive`` (or, when a
    discovery command ran, of its ``discovered`` hosts, each with at most ``slots`` workers; a host the file
    does not name gets the lines of the file's first host), with at most ``max_workers`` workers (one per
    device, :func:`worker_count`).

    >>> from parallax.resources.files import parse_resource_text
    >>> c = parse_resource_text("a: cpu:0,cpu:1\nb: cpu:0\nc: 0,1\n")
    >>> surviving_cluster(c, {"a", "c"}).text
    'a: cpu:0,cpu:1\nc: 0,1\n'
    >>> surviving_cluster(c, set(), [("c", None), ("d", 1)], max_workers=2).text
    'c: 0,1\n'
    >>> surviving_cluster(c, set(), [("b", None), ("d", 1)]).text
    'b: cpu:0\nd: cpu:0\n'
    """
    tasks = sorted((*cluster.workers, *cluster.servers), key=lambda t: t.line)
    chosen: list[tuple[WorkerTask | ServerTask, str, int | None]] = []  # (task, its host now, its slots)
    if discovered is None:
        chosen = [(t, t.host, None) for t in tasks if t.host in alive]
    else:
        template = cluster.hosts[0]
        for host, slots in discovered:
            own = [t for t in tasks if t.host == host] or [t for t in tasks if t.host == template]
            chosen += [(t, host, slots) for t in own]
    lines, total, per_host = [], 0, Counter()
    for task, host, slots in chosen:
        if not isinstance(task, WorkerTask):
            lines.append(_line(cluster, task, host, None))
            continue
        room = min(n for n in (slots - per_host[host] if slots is not None else None,
                               max_workers - total if max_workers is not None else None, _replicas(task))
                   if n is not None)
        if room <= 0:
            continue
        devices = task.devices[:room] if task.devices else task.devices
        total += room
        per_host[host] += room
        lines.append(_line(cluster, task, host, devices))
    if not total:
        raise ResourceFileError(f"{cluster.source}: no worker is left on the hosts that answer")
    return replace(parse_resource_text("\n".join(lines) + "\n", source=cluster.source), from_environment=True)


def worker_count(cluster: Cluster) -> int:
    """The workers of ``cluster`` as ``ElasticConfig.min_workers`` and ``max_workers`` count them: one per
    device (a bare host line: one), as horovodrun's ``-np`` counts one process per GPU."""
    return sum(_replicas(w) for w in cluster.workers)


def latest_checkpoint(ckpt_dir: str | None) -> str | None:
    """The name of the latest checkpoint in ``ckpt_dir`` (``model.ckpt-6``), from its ``checkpoint`` file."""
    if not ckpt_dir:
        return None
    try:
        with open(os.path.join(ckpt_dir, "checkpoint"), encoding="utf-8") as f:
            m = re.search(r'^model_checkpoint_path:\s*"([^"]+)"', f.read(), re.MULTILINE)
    except OSError:
        return None
    return os.path.basename(m.group(1)) if m else None


def _resumes(ckpt_dir: str | None) -> str:
    name = latest_checkpoint(ckpt_dir)
    if name is None:
        return "from the start (no checkpoint saved yet)"
    step = re.search(r"-(\d+)$", name)
    return (f"from global step {step.group(1)} ({os.path.join(ckpt_dir, name)})" if step
            else f"from {os.path.join(ckpt_dir, name)}")


def _layout(cluster: Cluster) -> str:
    """``2 workers (a x1, b x1)``."""
    per_host: Counter[str] = Counter()
    for w in cluster.workers:
        per_host[w.host] += _replicas(w)
    return f"{worker_count(cluster)} worker(s) ({', '.join(f'{h} x{n}' for h, n in per_host.items())})"


@dataclass
class _Attempts:
    """The failures so far, for the final report."""

    failures: list[str]

    def add(self, result: JobResult) -> None:
        self.failures.append(str(result.failure) if result.failure is not None
                             else f"the job exited with code {result.returncode}")

    def report(self, why: str) -> JobResult:
        """The end of a job that gave up restarting: exit code 1 whatever the last attempt's (a rank killed by
        SIGKILL exits 137, which a TFJob's ``restartPolicy: ExitCode`` takes for a retryable failure; this job
        has used its restarts, and 1, a permanent failure there, says so to Kubernetes and to Slurm alike)."""
        listed = "\n".join(f"  attempt {i + 1}: {f}" for i, f in enumerate(self.failures))
        return JobResult(1, TaskFailedError(f"Parallax elastic job failed: {why}. Every failure:\n{listed}"))


def run_elastic(cluster: Cluster, elastic: ElasticConfig, ckpt_dir: str | None,
                start: Callable[[Cluster], JobResult], program: Sequence[str],
                log: Callable[[str], None] | None = None,
                answers: Callable[[Sequence[str], Sequence[str]], set[str]] | None = None) -> JobResult:
    """Run a job and restart it on failure, as :mod:`this module <parallax.launch.elastic>` says.

    Args:
        cluster: the resources of the first attempt.
        elastic: the elastic settings.
        ckpt_dir: the checkpoint directory every attempt restores from (for the log).
        start: plans and launches the job on the given resources (a restart's are marked
            ``from_environment``: the ranks learn them from the launcher), returning how it ended.
        program: the program (for the hosts' check).
        log: where restarts are reported (default: stderr).
        answers: which of the given hosts answer (injected by tests; default: this machine's, and the other
            hosts that pass ``parallax-run --check``'s check).

    Returns:
        The last attempt's result; after the last allowed failure, one that names every failure.
    """
    say = log or (lambda text: print(text, file=sys.stderr, flush=True))
    check = answers or _answering
    attempts = _Attempts([])
    current = cluster
    for restart in range(elastic.max_restarts + 1):
        try:
            result = start(current)
        except ParallaxError as e:  # the job cannot be planned on what is left
            attempts.failures.append(f"could not start on {_layout(current)}: {e}")
            return attempts.report("the job cannot run on the hosts that are left")
        if result.returncode == 0 or result.signal is not None:
            return result
        attempts.add(result)
        if restart == elastic.max_restarts:
            return attempts.report(f"it failed {restart + 1} times and ElasticConfig.max_restarts is "
                                   f"{elastic.max_restarts}")
        say(f"Parallax elastic: attempt {restart + 1} failed: {attempts.failures[-1]}")
        try:
            if elastic.host_discovery_script:
                found = discover_hosts(elastic.host_discovery_script)
                alive = check([h for h, _ in found], program)
                following = surviving_cluster(cluster, alive, [(h, s) for h, s in found if h in alive],
                                              elastic.max_workers)
            else:
                alive = check(cluster.hosts, program)
                following = surviving_cluster(cluster, alive, None, elastic.max_workers)
        except ParallaxError as e:
            attempts.failures.append(f"no restart: {e}")
            return attempts.report("no host to restart on")
        gone = [h for h in current.hosts if h not in alive]
        if worker_count(following) < elastic.min_workers:
            return attempts.report(f"{worker_count(following)} worker(s) left "
                                   f"({', '.join(gone) or 'no host'} gone), fewer than ElasticConfig.min_workers="
                                   f"{elastic.min_workers}")
        say(f"Parallax elastic: restart {restart + 1} of {elastic.max_restarts}: "
            f"{'hosts gone: ' + ', '.join(gone) + '; ' if gone else ''}"
            f"{_layout(following)} instead of {_layout(current)}; resuming {_resumes(ckpt_dir)}")
        current = following
    raise AssertionError("unreachable")


def _answering(hosts: Sequence[str], program: Sequence[str]) -> set[str]:
    """The hosts of ``hosts`` that answer: this machine's, and the others that pass the hosts' check."""
    from parallax.launch.preflight import check_hosts

    local = {h for h in hosts if is_local_host(h)}
    remote = [h for h in dict.fromkeys(hosts) if h not in local]
    if not remote:
        return local
    return local | {c.host for c in check_hosts(remote, {}, program, is_local_host) if c.ok}
