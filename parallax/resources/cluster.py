"""What a resource description says: the cluster's worker and server tasks and their devices (frozen data).

:mod:`parallax.resources.files` parses resource files and :mod:`parallax.resources.rolespec` role specs into a
:class:`Cluster`; both import it from here, as every part of Parallax that names a process's :class:`Role` does.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass, replace
from enum import Enum

__all__ = ["Role", "Device", "WorkerTask", "ServerTask", "Cluster", "LOCAL_HOSTS", "is_local_host",
           "local_host_names", "usable_cores"]

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})


class Role(str, Enum):
    """A task's role in a job. ``WORKER``: it trains (worker 0 is the chief); ``PS``: a parameter server;
    ``STAGE``: a server holding one pipeline stage of a worker's replica
    (:func:`parallax.launch.layout.ranks_per_device`); ``MASTER``: a role spec's first task (Polyaxon's master,
    a TFJob's chief), which a job runs as worker 0 (:mod:`parallax.resources.rolespec`; no process of a job plan
    has it).

    A member compares equal to its value and prints as it (``Role.PS == "ps"``): roles cross processes, files
    and the environment as those strings, which their readers turn back into members.
    """

    WORKER = "worker"
    PS = "ps"
    STAGE = "stage"
    MASTER = "master"

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True, order=True)
class Device:
    """One device of a host: ``kind`` is ``"gpu"`` or ``"cpu"``."""

    kind: str
    index: int

    @property
    def tf_name(self) -> str:
        """The TensorFlow device name within a task, e.g. ``/device:GPU:1``."""
        return f"/device:{self.kind.upper()}:{self.index}"

    def __str__(self) -> str:
        return f"{self.kind}:{self.index}"


@dataclass(frozen=True)
class WorkerTask:
    """A worker process: where it runs and the devices its replicas use.

    ``devices`` is ``None`` when the file leaves them to the host (a bare host
    line): every GPU of the host, or one CPU replica when it has none.
    ``port`` is set only by explicit-role files.
    """

    host: str
    devices: tuple[Device, ...] | None
    port: int | None
    line: int


@dataclass(frozen=True)
class ServerTask:
    """A parameter-server process named by an explicit-role file."""

    host: str
    port: int | None
    line: int


@dataclass(frozen=True)
class Cluster:
    """Every process the resource file asks for.

    Attributes:
        workers: the worker processes, in file order.
        servers: parameter servers named in the file (explicit-role files
            only; otherwise the plan places them).
        source: the file the cluster came from (for messages).
        explicit_roles: whether the file used the ``role,host,port,device`` format.
        text: the text it was parsed from.
        from_environment: it was read from the environment (a Slurm allocation, an MPIJob's host
            file), which the launched processes do not have: the launcher sends them its text.
    """

    workers: tuple[WorkerTask, ...]
    servers: tuple[ServerTask, ...]
    source: str
    explicit_roles: bool
    text: str = ""
    from_environment: bool = False

    @property
    def hosts(self) -> tuple[str, ...]:
        """Every host, in order of first appearance."""
        seen: dict[str, None] = {}
        for task in (*self.workers, *self.servers):
            seen.setdefault(task.host, None)
        return tuple(seen)

    def device_keys(self) -> tuple[str, ...]:
        """``host/device`` of every worker device (``host/default`` for a bare host line): what a
        trial on these resources holds (:mod:`parallax.trials.runner`)."""
        return tuple(f"{w.host}/{d}" for w in self.workers for d in (w.devices or ("default",)))

    def workers_on(self, host: str) -> tuple[WorkerTask, ...]:
        """The worker processes on ``host``."""
        return tuple(w for w in self.workers if w.host == host)

    def with_bare_hosts(self, gpus: int) -> Cluster:
        """The cluster with every bare worker line given what it stands for on hosts with ``gpus``
        GPUs each: every GPU (``None`` stays, one CPU replica, when ``gpus`` is 0).

        >>> from parallax.resources.files import parse_resource_text
        >>> c = parse_resource_text("a\\nb: 1").with_bare_hosts(2)
        >>> [(w.host, [str(d) for d in w.devices]) for w in c.workers]
        [('a', ['gpu:0', 'gpu:1']), ('b', ['gpu:1'])]
        """
        if gpus <= 0:
            return self
        every = tuple(Device("gpu", i) for i in range(gpus))
        return replace(self, workers=tuple(w if w.devices is not None else replace(w, devices=every)
                                           for w in self.workers))


def local_host_names() -> frozenset[str]:
    """The names that certainly mean this machine (loopback names and its own names)."""
    return frozenset(LOCAL_HOSTS | {socket.gethostname(), socket.getfqdn()})


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, which a container's or a batch system's cpuset
    narrows), else the machine's."""
    try:
        return len(os.sched_getaffinity(0)) or 1
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def is_local_host(host: str) -> bool:
    """Whether ``host`` (a name or address from a resource file) is this machine."""
    if host in local_host_names() or host.startswith("127."):
        return True
    try:
        address = socket.gethostbyname(host.strip("[]"))
    except OSError:
        return False
    if address.startswith("127."):
        return True
    try:
        local = {info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None)}
    except OSError:
        local = set()
    return address in local
