"""Parse resource files into a frozen :class:`Cluster`.

Two formats are accepted, told apart by their first meaningful line.

The seed format: one host a line, optionally followed by its devices::

    # comments and blank lines are ignored
    10.0.0.1: 0,1,2,3        four GPUs: one replica on each
    10.0.0.2                 every GPU of the host, or one CPU replica if it has none
    localhost: cpu:0,cpu:1   two replicas on virtual CPU devices (laptops, CI)

The same host on several lines means several worker processes on that host.

The explicit-role cluster file (``role,host,port,device``), as in seed 000::

    ps,ps1.example.com,1024,
    worker,worker1.example.com,1024,0
    worker,worker1.example.com,1025,cpu:1

A role spec (YAML, the shape of Polyaxon's ``environment`` section: a master,
``n_workers``, ``n_ps`` and resources per role) is a third format, read by
:mod:`parallax.rolespec`.

``parse_resource_text("h: 0,1")`` returns
``Cluster(workers=(WorkerTask(host='h', devices=(Device('gpu', 0), Device('gpu', 1)), ...),), ...)``.
"""

from __future__ import annotations

import os
import re
import socket
from dataclasses import dataclass, replace

from parallax import slurm
from parallax.errors import ResourceFileError
from parallax.managers import mpijob

__all__ = ["Device", "WorkerTask", "ServerTask", "Cluster", "parse_resource_file", "from_environment",
           "parse_resource_text", "LOCAL_HOSTS", "is_local_host", "local_host_names"]

LOCAL_HOSTS = frozenset({"localhost", "127.0.0.1", "::1", "[::1]"})

_HOST_RE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])$")
_SEED_EXPECTED = ('"<host>" or "<host>: <id>[,<id>...]" where an id is a GPU number '
                  'or cpu:<n>')
_ROLE_EXPECTED = '"ps,<host>,<port>," or "worker,<host>,<port>,<gpu id | cpu:<n> | empty>"'


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

        >>> c = parse_resource_text("a\\nb: 1").with_bare_hosts(2)
        >>> [(w.host, [str(d) for d in w.devices]) for w in c.workers]
        [('a', ['gpu:0', 'gpu:1']), ('b', ['gpu:1'])]
        """
        if gpus <= 0:
            return self
        every = tuple(Device("gpu", i) for i in range(gpus))
        return replace(self, workers=tuple(w if w.devices is not None else replace(w, devices=every)
                                           for w in self.workers))


def from_environment(environ) -> str | None:
    """The resources this process's environment describes: ``"slurm"`` inside a Slurm allocation,
    ``"mpijob"`` in a Kubeflow MPIJob's launcher (its MPI host file), else ``None``."""
    if slurm.in_allocation(environ):
        return slurm.SLURM
    if mpijob.in_launcher(environ):
        return mpijob.MPIJOB
    return None


def parse_resource_file(path: str | os.PathLike | None) -> Cluster:
    """Read and parse a resource file; ``"slurm"`` reads the Slurm allocation this process runs in
    (:mod:`parallax.slurm`), ``"mpijob"`` the host file of a Kubeflow MPIJob's launcher
    (:mod:`parallax.managers.mpijob`); ``None`` reads whichever of them the environment has.

    Raises:
        ResourceFileError: the file is missing, unreadable or malformed; the
            message names the file and the line.
    """
    path = from_environment(os.environ) if path is None else path
    if path is None:
        raise ResourceFileError("no resource file given: pass the path of one (e.g. a file with the line "
                                "\"localhost: cpu:0,cpu:1\"), or run inside a Slurm allocation or an MPIJob's "
                                "launcher")
    path = os.fspath(path)
    if path == slurm.SLURM:
        cluster = parse_resource_text(slurm.allocation_text(os.environ), source=slurm.allocation_name(os.environ))
        return replace(cluster, from_environment=True)
    if path == mpijob.MPIJOB:
        cluster = parse_resource_text(mpijob.resource_text(os.environ), source=mpijob.source_name(os.environ))
        return replace(cluster, from_environment=True)
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except FileNotFoundError as e:
        raise ResourceFileError(f"{path}: resource file not found. Expected a file with one line a "
                                f"host, e.g. \"localhost: cpu:0,cpu:1\"") from e
    except (OSError, UnicodeDecodeError) as e:
        raise ResourceFileError(f"{path}: cannot read the resource file: {e}") from e
    return parse_resource_text(text, source=path)


def parse_resource_text(text: str, source: str = "<resource_info>") -> Cluster:
    """Parse the text of a resource file (see the module docstring for the formats).

    Raises:
        ResourceFileError: naming ``source``, the line number and what was expected.
    """
    from parallax import rolespec  # a role spec (YAML) is told by its first line

    if rolespec.looks_like_role_spec(text):
        return rolespec.parse_role_spec(text, source).cluster()
    lines = []
    for number, raw in enumerate(text.splitlines(), start=1):
        content = raw.split("#", 1)[0].strip()
        if content:
            lines.append((number, content))
    if not lines:
        raise ResourceFileError(f"{source}: no hosts found (the file is empty or only comments). "
                                f"Expected lines like {_SEED_EXPECTED}")
    first_number, first = lines[0]
    explicit = _looks_like_role_line(first)
    cluster = _parse_roles(lines, source) if explicit else _parse_seed(lines, source)
    return replace(cluster, text=text)


def _looks_like_role_line(content: str) -> bool:
    fields = content.split(",")
    return len(fields) >= 3 and ":" not in fields[0]


def _fail(source: str, number: int, content: str, problem: str, expected: str) -> ResourceFileError:
    return ResourceFileError(f'{source}, line {number}: "{content}" {problem}. Expected {expected}.')


def _check_host(source: str, number: int, content: str, host: str, expected: str) -> str:
    if not host:
        raise _fail(source, number, content, "has no host name", expected)
    if not _HOST_RE.match(host):
        raise _fail(source, number, content, f'has an invalid host name "{host}"', expected)
    return host


def _parse_device(token: str) -> Device | None:
    token = token.strip().lower()
    match = re.fullmatch(r"(?:(cpu|gpu):)?(\d+)", token)
    if not match:
        return None
    return Device(match.group(1) or "gpu", int(match.group(2)))


def _split_host(content: str) -> tuple[str, str | None]:
    if content.startswith("["):  # [ipv6]: ids
        end = content.find("]")
        if end < 0:
            return content, None
        host, rest = content[:end + 1], content[end + 1:].strip()
        if not rest:
            return host, None
        return host, rest[1:] if rest.startswith(":") else rest
    if ":" not in content:
        return content.strip(), None
    host, rest = content.split(":", 1)
    return host.strip(), rest


def _parse_seed(lines: list[tuple[int, str]], source: str) -> Cluster:
    workers = []
    used: dict[tuple[str, Device], int] = {}
    for number, content in lines:
        if _looks_like_role_line(content):
            raise _fail(source, number, content, "is an explicit-role line, but the file started in "
                        "the host-per-line format", _SEED_EXPECTED)
        host, rest = _split_host(content)
        _check_host(source, number, content, host, _SEED_EXPECTED)
        if rest is None:
            workers.append(WorkerTask(host, None, None, number))
            continue
        tokens = [t.strip() for t in rest.split(",")]
        if not rest.strip() or any(t == "" for t in tokens):
            raise _fail(source, number, content, "has an empty device id", _SEED_EXPECTED)
        devices = []
        for token in tokens:
            device = _parse_device(token)
            if device is None:
                raise _fail(source, number, content,
                            f'has device id "{token}"; GPU ids must be integers', _SEED_EXPECTED)
            if device in devices:
                raise _fail(source, number, content, f"lists {device} twice", _SEED_EXPECTED)
            if (host, device) in used:
                raise _fail(source, number, content,
                            f"uses {device} of {host}, already used on line {used[(host, device)]}",
                            "each device of a host on one line only")
            used[(host, device)] = number
            devices.append(device)
        workers.append(WorkerTask(host, tuple(devices), None, number))
    return Cluster(tuple(workers), (), source, explicit_roles=False)


def _parse_roles(lines: list[tuple[int, str]], source: str) -> Cluster:
    workers: list[WorkerTask] = []
    servers: list[ServerTask] = []
    addresses: dict[tuple[str, int], int] = {}
    for number, content in lines:
        fields = [f.strip() for f in content.split(",")]
        if len(fields) == 3:
            fields.append("")
        if len(fields) != 4:
            raise _fail(source, number, content, f"has {len(fields)} comma-separated fields, not 4",
                        _ROLE_EXPECTED)
        role, host, port_text, device_text = fields
        role = role.lower()
        if role not in ("ps", "worker"):
            raise _fail(source, number, content, f'has role "{role}"; roles are ps and worker',
                        _ROLE_EXPECTED)
        _check_host(source, number, content, host, _ROLE_EXPECTED)
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise _fail(source, number, content, f'has port "{port_text}"; a port is 1-65535',
                        _ROLE_EXPECTED)
        port = int(port_text)
        if (host, port) in addresses:
            raise _fail(source, number, content, f"reuses {host}:{port}, already on line "
                        f"{addresses[(host, port)]}", "one task per host:port")
        addresses[(host, port)] = number
        if role == "ps":
            if device_text:
                raise _fail(source, number, content, f'gives a parameter server the device "{device_text}"',
                            "an empty last field for ps lines (servers run on the CPU)")
            servers.append(ServerTask(host, port, number))
            continue
        devices: tuple[Device, ...] | None = None
        if device_text:
            device = _parse_device(device_text)
            if device is None:
                raise _fail(source, number, content, f'has device "{device_text}"; GPU ids must be '
                            "integers", _ROLE_EXPECTED)
            devices = (device,)
        workers.append(WorkerTask(host, devices, port, number))
    if not workers:
        raise ResourceFileError(f"{source}: the cluster file has no worker line. Expected at least one "
                                f"line like \"worker,<host>,<port>,<gpu>\"")
    return Cluster(tuple(workers), tuple(servers), source, explicit_roles=True)


def local_host_names() -> frozenset[str]:
    """The names that certainly mean this machine (loopback names and its own names)."""
    return frozenset(LOCAL_HOSTS | {socket.gethostname(), socket.getfqdn()})


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
