"""Check every host of a job before anything starts (``parallax-run --check``, and every launch on several hosts).

A job on several machines fails in ways one machine never shows: a name that
does not resolve, ssh that asks for a password, another Python at another
path, a host whose own name means 127.0.1.1 there (Debian's default
``/etc/hosts``), a port already taken. Found by ``mpirun`` or by TensorFlow,
each is a hang or an error far from its cause; found here, it is one line
naming the host and the fix.

Per host, over ``ssh -o BatchMode=yes`` (inside a Slurm allocation: ``srun`` on
that node, as ``mpirun`` starts its daemons there; directly for this machine), a small
probe (plain Python: no TensorFlow, well under a second) reports its name, its
addresses, what its own name resolves to there, the Python and Parallax it
would run, whether the program's script is there, the given ports' freedom,
the interface it would use to reach the launching machine, and its GPUs
(:func:`gpu_names`). :func:`judge` turns the report into problems (pure,
unit-tested), among them GPUs the job would give a process there that the host
lacks, and a bare host line whose host has GPUs the job would leave idle (it
stands for the launching machine's GPUs, and that machine has none).
"""

from __future__ import annotations

import concurrent.futures
import importlib.util
import inspect
import ipaddress
import json
import os
import socket
import subprocess
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from parallax.resources import slurm

__all__ = ["HostCheck", "Expected", "GpuUse", "check_hosts", "judge", "gpu_names", "PROBE", "format_checks"]


def gpu_names() -> list[str]:
    """This machine's NVIDIA GPUs, by name (``""`` where unknown): ``nvidia-smi -L``, else the driver's
    ``/proc/driver/nvidia/gpus``; ``[]`` without a driver. Plain Python: the probe runs it on every host."""
    import os
    import subprocess

    try:
        done = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=10)
        if done.returncode == 0:  # "GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-...)"
            return [line.split(":", 1)[1].split("(UUID")[0].strip() for line in done.stdout.splitlines()
                    if line.startswith("GPU ")]
    except (OSError, subprocess.SubprocessError):
        pass
    try:
        return [""] * len(os.listdir("/proc/driver/nvidia/gpus"))
    except OSError:
        return []


#: What runs on each host: prints one JSON object. Arguments: the launcher's address, the script path
#: ('' for none), then the ports to try.
PROBE = inspect.getsource(gpu_names) + r"""
import importlib.util, json, os, socket, subprocess, sys
target, script, ports = sys.argv[1], sys.argv[2], [int(p) for p in sys.argv[3:]]
name = socket.gethostname()
try:
    own = sorted({i[4][0] for i in socket.getaddrinfo(name, None, socket.AF_INET)})
except OSError as e:
    own = ["error: " + str(e)]
addresses = {}
try:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True, timeout=5).stdout
    for line in out.splitlines():
        parts = line.split()
        addresses[parts[3].split("/")[0]] = parts[1]
except (OSError, subprocess.SubprocessError):
    pass
source = None
try:
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.connect((target, 9))
    source = s.getsockname()[0]
    s.close()
except OSError:
    pass
taken = []
for port in ports:
    s = socket.socket()
    try:
        s.bind(("", port))
    except OSError:
        taken.append(port)
    finally:
        s.close()
spec = importlib.util.find_spec("parallax")
version = None
if spec is not None and spec.origin:
    try:
        with open(spec.origin, encoding="utf-8") as f:
            version = next((l.split("=")[1].strip().strip("\"'") for l in f if l.startswith("__version__")), None)
    except OSError:
        pass
print(json.dumps({"hostname": name, "own_name": own, "addresses": addresses, "source": source,
                  "python": sys.executable, "python_version": sys.version.split()[0],
                  "parallax": os.path.dirname(spec.origin) if spec and spec.origin else None,
                  "parallax_version": version, "script": (not script) or os.path.isfile(script),
                  "taken": taken, "gpus": gpu_names()}))
"""


@dataclass(frozen=True)
class Expected:
    """What every host must match: this machine's Python, Parallax and program."""

    python: str
    python_version: str
    parallax: str | None
    parallax_version: str | None
    script: str = ""
    several_hosts: bool = True


@dataclass(frozen=True)
class GpuUse:
    """What the job asks of a host's GPUs.

    Attributes:
        needed: the highest GPU id the job gives a process there, plus one (0: none).
        bare: a bare host line names the host and stands for no GPU (the launching machine has
            none), so the job would train on one CPU replica there.
    """

    needed: int = 0
    bare: bool = False


@dataclass
class HostCheck:
    """The outcome for one host: ``problems`` (empty: fine) and ``facts`` (what the line shows)."""

    host: str
    problems: list[str] = field(default_factory=list)
    facts: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def line(self) -> str:
        if self.ok:
            return f"{self.host}: ok: {'; '.join(self.facts)}"
        return f"{self.host}: FAILED: {' '.join(self.problems)}"


def expected_here(program: Sequence[str], several_hosts: bool) -> Expected:
    """What the hosts must match, read off this process."""
    spec = importlib.util.find_spec("parallax")
    from parallax import __version__

    script = program[0] if program and program[0] != "-m" else ""
    return Expected(sys.executable, sys.version.split()[0],
                    os.path.dirname(spec.origin) if spec and spec.origin else None, __version__, script,
                    several_hosts)


def judge(host: str, resolved: list[str], report: dict, expected: Expected, gpus: GpuUse = GpuUse()) -> HostCheck:
    """The problems of ``host`` (pure).

    Args:
        host: the name the resource file gives.
        resolved: the addresses ``host`` resolves to on the launching machine.
        report: what the probe printed on ``host``.
        expected: what it must match.
        gpus: what the job asks of its GPUs.
    """
    check = HostCheck(host)
    name = report.get("hostname", "?")
    own = [a for a in report.get("own_name", []) if not a.startswith("error")]
    addresses = report.get("addresses", {})
    if expected.several_hosts:
        if not own:
            check.problems.append(
                f"its own name {name!r} does not resolve there; TensorFlow's servers announce themselves by it. "
                f"Fix: add '<its address> {name}' to /etc/hosts on {host} (or to DNS).")
        elif all(ipaddress.ip_address(a).is_loopback for a in own):
            network = ", ".join(a for a in sorted(addresses) if not ipaddress.ip_address(a).is_loopback)
            check.problems.append(
                f"its own name {name!r} resolves to {', '.join(own)} there, a loopback address, so the other "
                f"hosts cannot reach what it announces. Fix: in /etc/hosts on {host}, map {name} to its network "
                f"address{f' ({network})' if network else ''} instead of {own[0]} (Debian's '127.0.1.1 {name}' "
                "line).")
        if addresses and resolved and not set(resolved) & set(addresses) \
                and not all(ipaddress.ip_address(a).is_loopback for a in resolved):
            check.problems.append(
                f"the name {host!r} resolves here to {', '.join(resolved)}, which is no address of that host "
                f"(its addresses: {', '.join(sorted(addresses))}). Fix the name in DNS or /etc/hosts.")
    if report.get("python") != expected.python or report.get("python_version") != expected.python_version:
        check.problems.append(
            f"it runs Python {report.get('python_version')} at {report.get('python')}, this machine "
            f"{expected.python_version} at {expected.python}: the same environment must be at the same path on "
            "every host.")
    if report.get("parallax") != expected.parallax or report.get("parallax_version") != expected.parallax_version:
        found = report.get("parallax")
        check.problems.append(
            (f"Parallax {report.get('parallax_version')} at {found}" if found else "no Parallax") +
            f" for that Python, this machine Parallax {expected.parallax_version} at {expected.parallax}: install "
            "the same Parallax at the same path on every host.")
    if report.get("script") is False:
        check.problems.append(f"the program {expected.script} is not there: the script must be at the same path on "
                              "every host (a shared file system or a copy).")
    if report.get("taken"):
        check.problems.append(f"port(s) {', '.join(map(str, report['taken']))} are taken there; the resource "
                              "file names them for Parallax's servers.")
    found = report.get("gpus")
    if found is not None and gpus.needed > len(found):
        check.problems.append(
            f"the job gives a process there GPU {gpus.needed - 1}, but it has {_gpus_text(found)}. A bare host line "
            "stands for the GPUs of the machine that starts the job (every host is taken to be alike): list the "
            f"GPU ids {host} has" + (f" (\"{host}: {','.join(map(str, range(len(found))))}\")." if found else "."))
    if found and gpus.bare:
        check.problems.append(
            f"its bare host line stands for the GPUs of the machine that starts the job, which has none, so the job "
            f"would train on one CPU replica there and leave its {_gpus_text(found)} idle. Fix: list them "
            f"(\"{host}: {','.join(map(str, range(len(found))))}\"), or start the job on a machine with the same GPUs.")
    if check.ok:
        source = report.get("source")
        interface = addresses.get(source, "?") if source else None
        check.facts = [f"hostname {name} -> {', '.join(own) or '?'}",
                       f"Python {report.get('python_version')} and Parallax {report.get('parallax_version')} "
                       "at the same paths",
                       f"reaches this machine from {source} ({interface})" if source else "no route to this machine"]
        if found is not None:
            check.facts.append(_gpus_text(found))
    return check


def _gpus_text(names: list[str]) -> str:
    """``no GPU``, ``1 GPU (Tesla T4)``, ``8 GPUs (NVIDIA A100-SXM4-40GB)``."""
    if not names:
        return "no GPU"
    kinds = ", ".join(dict.fromkeys(n for n in names if n))
    return f"{len(names)} GPU{'s' if len(names) > 1 else ''}" + (f" ({kinds})" if kinds else "")


Runner = Callable[[list[str], float], subprocess.CompletedProcess]


def _run(argv: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(argv, 124, "", f"no answer within {timeout:.0f} s")


def _remote(host: str, probe: list[str], via: str, ssh: Sequence[str], timeout: float) -> list[str]:
    """``probe`` run on ``host``: over ssh, or (``via="srun"``, inside a Slurm allocation) as a job step,
    which is how ``mpirun`` itself reaches the nodes there."""
    if via == "srun":
        return ["srun", "--nodes=1", "--ntasks=1", f"--nodelist={host}", "--overlap", "--quiet", *probe]
    import shlex

    return [*ssh, "-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, int(timeout / 2))}", host,
            " ".join(shlex.quote(a) for a in probe)]


def check_host(host: str, ports: Sequence[int], expected: Expected, local: bool, target: str, *,
               via: str = "ssh", ssh: Sequence[str] = ("ssh",), timeout: float = 15, run: Runner = _run,
               gpus: GpuUse = GpuUse()) -> HostCheck:
    """Check one host: resolve its name here, run the probe on it (here when ``local``; else over
    ssh, or with srun when ``via="srun"``); ``gpus``: what the job asks of its GPUs."""
    try:
        resolved = sorted({i[4][0] for i in socket.getaddrinfo(host, None, socket.AF_INET)})
    except OSError:
        return HostCheck(host, [f"the name {host!r} does not resolve on this machine ({socket.gethostname()}). "
                                "Fix: add it to DNS or /etc/hosts, or use the host's address in the resource "
                                "file."])
    probe = [expected.python, "-c", PROBE, target, expected.script, *map(str, ports)]
    done = run(probe if local else _remote(host, probe, via, ssh, timeout), timeout)
    if done.returncode != 0 or not done.stdout.strip():
        said = (done.stderr.strip().splitlines() or [f"exit code {done.returncode}"])[-1]
        if local:
            return HostCheck(host, [f"the probe failed here: {said}"])
        if done.returncode == 127 or "No such file" in said:
            return HostCheck(host, [f"no Python at {expected.python} there ({said}): the same environment must "
                                    "be at the same path on every host."])
        if via == "srun":
            return HostCheck(host, [f"srun could not run the check there ({said}). Fix: the node's slurmd must be "
                                    "up ('sinfo -N'); Parallax starts the job there through srun too."])
        return HostCheck(host, [f"cannot be reached by ssh ({said}). Fix: 'ssh {host} true' must work from "
                                f"{socket.gethostname()} without a password or a prompt (keys, known_hosts; "
                                "inside a Slurm allocation Parallax launches through Slurm instead)."])
    try:
        report = json.loads(done.stdout.strip().splitlines()[-1])
    except ValueError:
        return HostCheck(host, [f"the probe printed no report: {done.stdout.strip()[-200:]}"])
    return judge(host, resolved, report, expected, gpus)


def check_hosts(hosts: Sequence[str], ports: dict[str, list[int]], program: Sequence[str],
                is_local: Callable[[str], bool], gpus: dict[str, GpuUse] | None = None, **kwargs) -> list[HostCheck]:
    """Check every host at once (threads), in order. ``ports``: ports the job needs per host;
    ``gpus``: what it asks of each host's GPUs."""
    several = len(hosts) > 1 and not all(is_local(h) for h in hosts)
    expected = expected_here(program, several)
    target = _own_address(hosts, is_local)
    nodes = slurm.allocation_hosts(os.environ) if slurm.in_allocation(os.environ) else None
    if nodes is not None:
        kwargs.setdefault("via", "srun")
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, min(16, len(hosts)))) as pool:
        futures = {h: pool.submit(check_host, h, ports.get(h, []), expected, is_local(h), target,
                                  gpus=(gpus or {}).get(h, GpuUse()), **kwargs)
                   for h in hosts if nodes is None or h in nodes or is_local(h)}
        return [futures[h].result() if h in futures else _outside(h, nodes) for h in hosts]


def _outside(host: str, nodes: list[str]) -> HostCheck:
    name = slurm.allocation_name(os.environ)
    return HostCheck(host, [f"it is not a node of {name} ({', '.join(nodes)}), and inside an allocation the job "
                            "can only use its nodes. Fix: name only those, or use resource_info 'slurm' (the "
                            "allocation itself)."])


def _own_address(hosts: Sequence[str], is_local: Callable[[str], bool]) -> str:
    """An address of this machine for the hosts' route check: its name's, else loopback."""
    for host in hosts:
        if is_local(host):
            try:
                address = socket.gethostbyname(host)
                if not address.startswith("127."):
                    return address
            except OSError:
                pass
    try:
        address = socket.gethostbyname(socket.gethostname())
        return address
    except OSError:
        return "127.0.0.1"


def format_checks(checks: Sequence[HostCheck]) -> str:
    """One line per host."""
    return "\n".join(c.line() for c in checks)
