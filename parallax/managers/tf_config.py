"""``TF_CONFIG``: the cluster and this process's task, as cluster managers give them (pure).

Kubeflow's TFJob, Polyaxon, SageMaker and Vertex AI start every task of a job
themselves and tell each which one it is in the environment variable
``TF_CONFIG``::

    {"cluster": {"chief": ["job-chief-0:2222"],
                 "worker": ["job-worker-0:2222", "job-worker-1:2222"],
                 "ps": ["job-ps-0:2222", "job-ps-1:2222"]},
     "task": {"type": "worker", "index": 1}}

Parallax maps it onto its own roles: the ``chief`` (or ``master``, as
SageMaker and older Polyaxon call it) is worker 0, then the ``worker`` tasks in
order; ``ps`` tasks are parameter servers. An ``evaluator`` is not part of
training: it is left out of the cluster, and ``parallel_run`` refuses to run in
one. The cluster becomes the text of an explicit-role resource file, so the job
plan is made from it exactly as from a file:

>>> job = read_tf_config({"TF_CONFIG": '{"cluster": {"chief": ["a:1"], "worker": ["b:2"], "ps": ["c:3"]},'
...                       ' "task": {"type": "worker", "index": 0}}'})
>>> print(job.cluster_text, end="")
worker,a,1,
worker,b,2,
ps,c,3,
>>> job.task, job.name_of("c", 3)
(Task(role=<Role.WORKER: 'worker'>, host='b', port=2, name='worker 0'), 'ps 0')
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass

from parallax.errors import LaunchError, ResourceFileError
from parallax.invocation import TF_CONFIG_ENV, setting
from parallax.resources.cluster import Role

__all__ = ["Task", "ManagedJob", "read_tf_config", "parse_tf_config", "WORKER_TYPES", "IGNORED_TYPES"]

#: Task types that train, in the order their tasks become Parallax workers.
WORKER_TYPES = ("chief", "master", "worker")
#: Task types outside training (documented; their processes do not call ``parallel_run``).
IGNORED_TYPES = ("evaluator",)
_ADDRESS = re.compile(r"^(?P<host>\[[0-9A-Fa-f:.]+\]|[^:\s\[\]]+):(?P<port>\d+)$")


@dataclass(frozen=True)
class Task:
    """One task of the cluster as Parallax runs it.

    Attributes:
        role: ``Role.WORKER`` or ``Role.PS``.
        host: its host, from ``TF_CONFIG``.
        port: its server's port, from ``TF_CONFIG``.
        name: its name in ``TF_CONFIG``'s terms (``"chief 0"``, ``"worker 1"``, ``"ps 0"``).
    """

    role: Role
    host: str
    port: int
    name: str


@dataclass(frozen=True)
class ManagedJob:
    """A job a cluster manager started, and this process's task in it.

    Attributes:
        manager: where it was read from (``"TF_CONFIG"``), for messages.
        tasks: every task that takes part in training, workers first.
        task: this process's task.
    """

    manager: str
    tasks: tuple[Task, ...]
    task: Task

    @property
    def cluster_text(self) -> str:
        """The cluster as an explicit-role resource file (``role,host,port,``), workers first."""
        return "".join(f"{t.role},{t.host},{t.port},\n" for t in self.tasks)

    @property
    def source(self) -> str:
        """How messages name the cluster, e.g. ``TF_CONFIG (task worker 1)``."""
        return f"{self.manager} (task {self.task.name})"

    def name_of(self, host: str, port: int | None) -> str:
        """The manager's name of the task at ``host:port``."""
        for t in self.tasks:
            if (t.host, t.port) == (host, port):
                return t.name
        return f"{host}:{port}"


def read_tf_config(environ: Mapping[str, str]) -> ManagedJob | None:
    """The job the ``TF_CONFIG`` of ``environ`` describes (:func:`parse_tf_config`)."""
    return parse_tf_config(setting("tf_config", environ))


def parse_tf_config(text: str | None) -> ManagedJob | None:
    """The job ``TF_CONFIG``'s ``text`` describes, or ``None`` when there is none (unset, empty, or no cluster).

    Raises:
        ResourceFileError: ``TF_CONFIG`` is malformed; the message names the key and what was expected.
        LaunchError: this task is one that does not train (an evaluator).
    """
    text = (text or "").strip()
    if not text:
        return None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ResourceFileError(f"{TF_CONFIG_ENV} is not JSON ({e}); expected "
                                '{"cluster": {"worker": ["host:port", ...], ...}, "task": {"type": ..., "index": ...}}'
                                ) from e
    if not isinstance(data, dict):
        raise ResourceFileError(f"{TF_CONFIG_ENV} is {type(data).__name__}, not a JSON object")
    cluster = data.get("cluster") or {}
    if not cluster:  # TensorFlow reads such a TF_CONFIG as "no cluster" too: one task, training alone
        _check_alone(data)
        return None
    if not isinstance(cluster, dict):
        raise ResourceFileError(f"{TF_CONFIG_ENV}: \"cluster\" is {type(cluster).__name__}; expected an object "
                                "of task type -> list of \"host:port\"")
    known = (*WORKER_TYPES, "ps", *IGNORED_TYPES)
    for kind in cluster:
        if kind not in known:
            raise ResourceFileError(f"{TF_CONFIG_ENV}: cluster has task type \"{kind}\"; Parallax knows "
                                    f"{', '.join(known)}")
    chiefs = [k for k in ("chief", "master") if cluster.get(k)]
    if len(chiefs) > 1 or any(len(_addresses(cluster, k)) > 1 for k in chiefs):
        raise ResourceFileError(f"{TF_CONFIG_ENV}: the cluster has more than one chief ({', '.join(chiefs)}); "
                                "expected at most one chief or master task")
    tasks: list[Task] = []
    by_type: dict[tuple[str, int], Task] = {}
    for kind in (*WORKER_TYPES, "ps"):
        for index, (host, port) in enumerate(_addresses(cluster, kind)):
            task = Task(Role.PS if kind == "ps" else Role.WORKER, host, port, f"{kind} {index}")
            tasks.append(task)
            by_type[(kind, index)] = task
    seen: dict[tuple[str, int], str] = {}
    for t in tasks:
        if (t.host, t.port) in seen:
            raise ResourceFileError(f"{TF_CONFIG_ENV}: {t.name} and {seen[(t.host, t.port)]} share the address "
                                    f"{t.host}:{t.port}; expected one task per host:port")
        seen[(t.host, t.port)] = t.name
    if not any(t.role == Role.WORKER for t in tasks):
        raise ResourceFileError(f"{TF_CONFIG_ENV}: the cluster has no chief, master or worker task; expected at "
                                "least one task that trains")
    kind, index = _task(data)
    if kind in IGNORED_TYPES:
        raise LaunchError(f"this process is {TF_CONFIG_ENV}'s {kind} task: Parallax trains on the chief/master, "
                          "worker and ps tasks, and an evaluator takes no part in training. Evaluate the chief's "
                          "checkpoints (CheckPointConfig.ckpt_dir) with a plain session instead of calling "
                          "parallel_run there")
    if (kind, index) not in by_type:
        count = len(_addresses(cluster, kind))
        raise ResourceFileError(f"{TF_CONFIG_ENV}: task {kind} {index} is not in the cluster (it has {count} "
                                f"{kind} task(s))")
    return ManagedJob(TF_CONFIG_ENV, tuple(tasks), by_type[(kind, index)])


def _check_alone(data: dict) -> None:
    """A TF_CONFIG without a cluster: this process trains alone, as worker 0, which its task (if it
    names one) must be; a task that is not worker 0 is a job whose cluster is missing.

    Raises:
        ResourceFileError: the task names another task (``worker 1``, a ``ps``, an evaluator).
    """
    if not data.get("task"):
        return
    kind, index = _task(data, "the cluster is empty, and ")
    if index != 0 or kind not in WORKER_TYPES:
        raise ResourceFileError(
            f"{TF_CONFIG_ENV}: the cluster is empty, but the task is {kind} {index}: with no cluster this process "
            f"would train alone as worker 0, not as {kind} {index} of a job. Expected \"cluster\" to list every "
            'task of the job ({"chief": ["host:port"], "worker": ["host:port", ...], "ps": [...]}), or, for one '
            'process training alone, "task": {"type": "worker", "index": 0} (or no TF_CONFIG)')


def _addresses(cluster: dict, kind: str) -> list[tuple[str, int]]:
    entries = cluster.get(kind) or []
    if isinstance(entries, dict):  # TensorFlow also accepts {index: address} for sparse clusters
        try:
            entries = [entries[k] for k in sorted(entries, key=int)]
        except ValueError as e:
            raise ResourceFileError(f"{TF_CONFIG_ENV}: cluster.{kind} has keys that are not task indexes") from e
    if not isinstance(entries, list):
        raise ResourceFileError(f"{TF_CONFIG_ENV}: cluster.{kind} is {type(entries).__name__}; expected a list "
                                "of \"host:port\"")
    out = []
    for i, entry in enumerate(entries):
        match = _ADDRESS.match(entry) if isinstance(entry, str) else None
        if not match or not 0 < int(match.group("port")) < 65536:
            raise ResourceFileError(f"{TF_CONFIG_ENV}: cluster.{kind}[{i}] is {json.dumps(entry)}; expected "
                                    "\"host:port\" with a port 1-65535")
        out.append((match.group("host"), int(match.group("port"))))
    return out


def _task(data: dict, empty: str = "") -> tuple[str, int]:
    task = data.get("task")
    if not isinstance(task, dict) or "type" not in task:
        if empty:
            raise ResourceFileError(f"{TF_CONFIG_ENV}: {empty}the task is {json.dumps(task)}; expected "
                                    '"task": {"type": "worker", "index": 0} naming this process')
        raise ResourceFileError(f"{TF_CONFIG_ENV} has a cluster but no task; expected "
                                '"task": {"type": "worker", "index": 0} naming this process')
    kind, index = task.get("type"), task.get("index", 0)
    if not isinstance(kind, str) or kind not in (*WORKER_TYPES, "ps", *IGNORED_TYPES):
        raise ResourceFileError(f"{TF_CONFIG_ENV}: task.type is {json.dumps(kind)}; expected one of "
                                f"{', '.join((*WORKER_TYPES, 'ps', *IGNORED_TYPES))}")
    try:
        index = int(index)
    except (TypeError, ValueError):
        raise ResourceFileError(f"{TF_CONFIG_ENV}: task.index is {json.dumps(index)}; expected a number") from None
    return kind, index
