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
:mod:`parallax.resources.rolespec`.

``parse_resource_text("h: 0,1")`` returns
``Cluster(workers=(WorkerTask(host='h', devices=(Device('gpu', 0), Device('gpu', 1)), ...),), ...)``.
"""

from __future__ import annotations

import os
import re
from dataclasses import replace

from parallax.errors import ResourceFileError
from parallax.managers import mpijob
from parallax.resources import rolespec, slurm
from parallax.resources.cluster import (
    LOCAL_HOSTS,
    Cluster,
    Device,
    Role,
    ServerTask,
    WorkerTask,
    is_local_host,
    local_host_names,
)

__all__ = ["Device", "WorkerTask", "ServerTask", "Cluster", "parse_resource_file", "from_environment",
           "parse_resource_text", "LOCAL_HOSTS", "is_local_host", "local_host_names"]

_HOST_RE = re.compile(r"^(?:[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?|\[[0-9A-Fa-f:.]+\])$")
_SEED_EXPECTED = ('"<host>" or "<host>: <id>[,<id>...]" where an id is a GPU number '
                  'or cpu:<n>')
_ROLE_EXPECTED = '"ps,<host>,<port>," or "worker,<host>,<port>,<gpu id | cpu:<n> | empty>"'


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
    (:mod:`parallax.resources.slurm`), ``"mpijob"`` the host file of a Kubeflow MPIJob's launcher
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
    if rolespec.looks_like_role_spec(text):  # a role spec (YAML) is told by its first line
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
        role_text, host, port_text, device_text = fields
        role_text = role_text.lower()
        if role_text not in (Role.PS, Role.WORKER):
            raise _fail(source, number, content, f'has role "{role_text}"; roles are ps and worker',
                        _ROLE_EXPECTED)
        role = Role(role_text)
        _check_host(source, number, content, host, _ROLE_EXPECTED)
        if not port_text.isdigit() or not 0 < int(port_text) < 65536:
            raise _fail(source, number, content, f'has port "{port_text}"; a port is 1-65535',
                        _ROLE_EXPECTED)
        port = int(port_text)
        if (host, port) in addresses:
            raise _fail(source, number, content, f"reuses {host}:{port}, already on line "
                        f"{addresses[(host, port)]}", "one task per host:port")
        addresses[(host, port)] = number
        if role is Role.PS:
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
