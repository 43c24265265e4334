"""A cluster of virtual hosts on this one machine, for the multi-host tests.

Each host is a network namespace with its own address (198.18.0.0/24, an
unrouted benchmarking range, never this machine's network) and its own host
name (a UTS namespace), joined to the others by a bridge that lives in a
namespace of its own: nothing is added to the machine's own network and no
packet can leave it. Each host runs Debian's ``sshd`` with a key made for the
cluster, and resolves names through a hosts file of its own (a mount
namespace with the file bind-mounted on ``/etc/hosts``; the ssh client's
configuration is bind-mounted the same way). Every process started on a host
(through :meth:`VirtualCluster.popen`, or by its sshd) lives in that host's
namespaces.

Everything made is written down in ``<state_dir>/state.json`` first, so
:meth:`VirtualCluster.down` (or ``tools/virtual-cluster down``) removes it
all, even after a crash: the processes in the cluster's namespaces (ours by
construction), the namespaces, the state directory.

Needs root, ``ip`` (iproute2), ``unshare``/``nsenter`` (util-linux) and
``sshd``/``ssh``/``ssh-keygen`` (openssh-server / -client):
:func:`missing_requirements` says what is missing.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass

__all__ = ["VirtualCluster", "VirtualHost", "missing_requirements", "SUBNET"]

SUBNET = "198.18.0"  # /24 inside the cluster's own namespaces only (RFC 2544 benchmarking range)
_TOOLS = ("ip", "unshare", "nsenter", "ssh", "ssh-keygen")
_SSHD = "/usr/sbin/sshd"


def missing_requirements() -> str | None:
    """Why a virtual cluster cannot be made here, or ``None`` when it can."""
    if os.geteuid() != 0:
        return "a virtual cluster needs root (network, UTS and mount namespaces)"
    missing = [t for t in _TOOLS if shutil.which(t) is None]
    if not os.access(_SSHD, os.X_OK):
        missing.append(_SSHD)
    if missing:
        return (f"a virtual cluster needs {', '.join(missing)} (apt-get install iproute2 util-linux "
                "openssh-server openssh-client; `make test-cluster` does)")
    probe = subprocess.run(["unshare", "--net", "--uts", "--mount", "true"], capture_output=True, text=True,
                           timeout=30)
    if probe.returncode != 0:  # root in a container without CAP_SYS_ADMIN, a seccomp profile, ...
        return ("a virtual cluster needs network, UTS and mount namespaces, which this machine refuses even to "
                f"root (unshare --net --uts --mount: {probe.stderr.strip() or f'exit {probe.returncode}'})")
    return None


@dataclass
class VirtualHost:
    """One host: its name, namespace, address and the pid of its sshd (whose namespaces it has)."""

    name: str
    netns: str
    address: str
    pid: int = 0


class VirtualCluster:
    """A virtual cluster of ``names`` (see the module docstring).

    Args:
        names: the host names, e.g. ``("vhost1", "vhost2", "vhost3")``.
        tag: what the namespaces are named after (``<tag>-sw``, ``<tag>-<name>``);
            unique per cluster on this machine.
        state_dir: where keys, configurations and ``state.json`` go.
    """

    def __init__(self, names: Sequence[str] = ("vhost1", "vhost2", "vhost3"), tag: str | None = None,
                 state_dir: str | None = None) -> None:
        self.tag = tag or f"pvc{os.getpid()}"
        self.state_dir = state_dir or f"/tmp/parallax-{self.tag}"
        self.switch = f"{self.tag}-sw"
        self.hosts = {n: VirtualHost(n, f"{self.tag}-{n}", f"{SUBNET}.{i + 1}") for i, n in enumerate(names)}
        self.daemons: set[int] = set()  # services started on the hosts besides sshd (Slurm's): not a job's

    # ------------------------------------------------------------------ state
    @classmethod
    def load(cls, state_dir: str) -> VirtualCluster:
        """The cluster whose state is in ``state_dir`` (made by :meth:`up`)."""
        with open(os.path.join(state_dir, "state.json"), encoding="utf-8") as f:
            state = json.load(f)
        cluster = cls([], tag=state["tag"], state_dir=state_dir)
        cluster.hosts = {h["name"]: VirtualHost(**h) for h in state["hosts"]}
        return cluster

    def _save(self) -> None:
        path = os.path.join(self.state_dir, "state.json")
        with open(path + ".tmp", "w", encoding="utf-8") as f:
            json.dump({"tag": self.tag, "switch": self.switch, "hosts": [asdict(h) for h in self.hosts.values()]},
                      f, indent=1)
        os.replace(path + ".tmp", path)

    def path(self, *parts: str) -> str:
        return os.path.join(self.state_dir, *parts)

    # ------------------------------------------------------------------ up / down
    def up(self, timeout: float = 30.0) -> VirtualCluster:
        """Make the namespaces, the bridge, the hosts' files and sshds; wait until each answers ssh.

        On any failure everything made so far is removed and the error raised.
        """
        reason = missing_requirements()
        if reason:
            raise RuntimeError(reason)
        os.makedirs(self.path("ssh"), exist_ok=True)
        self._save()  # before anything exists: down() can always clean up
        try:
            self._make_keys()
            _ip("netns", "add", self.switch)
            _ip("-n", self.switch, "link", "add", "br0", "type", "bridge")
            _ip("-n", self.switch, "link", "set", "br0", "up")
            for i, host in enumerate(self.hosts.values()):
                self._make_host(i, host)
            self._save()
            for host in self.hosts.values():
                self._wait_for_ssh(host, timeout)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """Remove everything this cluster made (idempotent; also after a crash)."""
        for host in self.hosts.values():
            for pid in self.pids(host.name) + ([host.pid] if host.pid else []):
                _kill(pid)
        for host in self.hosts.values():
            _wait_gone(self.pids(host.name) + ([host.pid] if host.pid else []), 5.0)
            _ip("netns", "del", host.netns, check=False)
        _ip("netns", "del", self.switch, check=False)
        shutil.rmtree(self.state_dir, ignore_errors=True)

    def __enter__(self) -> VirtualCluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    def status(self) -> list[str]:
        """One line per host: name, address, link state, whether its sshd runs, processes in it."""
        lines = []
        existing = set(subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split())
        for host in self.hosts.values():
            if host.netns not in existing:
                lines.append(f"{host.name}: namespace {host.netns} missing")
                continue
            link = subprocess.run(["ip", "-n", host.netns, "-br", "link", "show", "eth0"], capture_output=True,
                                  text=True).stdout.split()
            alive = host.pid and _alive(host.pid)
            lines.append(f"{host.name}: {host.address} eth0 {link[1] if len(link) > 1 else '?'}, "
                         f"sshd {'pid ' + str(host.pid) if alive else 'not running'}, "
                         f"{len(self.pids(host.name))} processes")
        return lines

    # ------------------------------------------------------------------ using it
    def hosts_file(self, name: str) -> str:
        """The path of ``name``'s private ``/etc/hosts`` (rewrite it to change what it resolves)."""
        return self.path("hosts", name, "hosts")

    def command(self, name: str, argv: Sequence[str], cwd: str | None = None) -> list[str]:
        """``argv`` run on host ``name`` (in its namespaces), in ``cwd`` (default: this one)."""
        host = self.hosts[name]
        return ["nsenter", f"--target={host.pid}", "--net", "--uts", "--mount", f"--wd={cwd or os.getcwd()}",
                "--", *argv]

    def popen(self, name: str, argv: Sequence[str], cwd: str | None = None, **kwargs) -> subprocess.Popen:
        """Start ``argv`` on host ``name``."""
        return subprocess.Popen(self.command(name, argv, cwd), **kwargs)

    def run(self, name: str, argv: Sequence[str], cwd: str | None = None, timeout: float = 60,
            **kwargs) -> subprocess.CompletedProcess:
        """Run ``argv`` on host ``name`` to its end (output captured as text unless told otherwise)."""
        kwargs.setdefault("capture_output", True)
        kwargs.setdefault("text", True)
        return subprocess.run(self.command(name, argv, cwd), timeout=timeout, **kwargs)

    def link(self, name: str, up: bool) -> None:
        """Set host ``name``'s network link up or down (down: it vanishes for the others)."""
        _ip("-n", self.hosts[name].netns, "link", "set", "eth0", "up" if up else "down")

    def pids(self, name: str) -> list[int]:
        """The processes in host ``name``'s network namespace (its sshd among them)."""
        out = subprocess.run(["ip", "netns", "pids", self.hosts[name].netns], capture_output=True, text=True)
        return [int(p) for p in out.stdout.split()]

    def job_pids(self, name: str) -> list[int]:
        """The processes on host ``name`` other than its sshd and :attr:`daemons`: what a job left there."""
        return [p for p in self.pids(name) if p != self.hosts[name].pid and p not in self.daemons]

    # ------------------------------------------------------------------ making it
    def _make_keys(self) -> None:
        for key in ("id_ed25519", "host_ed25519_key"):
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"parallax {self.tag}",
                            "-f", self.path("ssh", key)], check=True, capture_output=True)
        shutil.copy(self.path("ssh", "id_ed25519.pub"), self.path("ssh", "authorized_keys"))
        with open(self.path("ssh", "ssh_config"), "w", encoding="utf-8") as f:
            f.write(f"Host *\n  IdentityFile {self.path('ssh', 'id_ed25519')}\n  StrictHostKeyChecking no\n"
                    "  UserKnownHostsFile /dev/null\n  LogLevel ERROR\n  BatchMode yes\n  ConnectTimeout 5\n")

    def _make_host(self, i: int, host: VirtualHost) -> None:
        _ip("netns", "add", host.netns)
        _ip("-n", host.netns, "link", "set", "lo", "up")
        _ip("-n", self.switch, "link", "add", f"v{i}", "type", "veth", "peer", "name", "eth0", "netns", host.netns)
        _ip("-n", self.switch, "link", "set", f"v{i}", "master", "br0", "up")
        _ip("-n", host.netns, "addr", "add", f"{host.address}/24", "dev", "eth0")
        _ip("-n", host.netns, "link", "set", "eth0", "up")
        os.makedirs(self.path("hosts", host.name), exist_ok=True)
        with open(self.hosts_file(host.name), "w", encoding="utf-8") as f:
            f.write("127.0.0.1 localhost\n" + "".join(f"{h.address} {h.name}\n" for h in self.hosts.values()))
        config = self.path("hosts", host.name, "sshd_config")
        with open(config, "w", encoding="utf-8") as f:
            f.write(f"ListenAddress {host.address}\nHostKey {self.path('ssh', 'host_ed25519_key')}\n"
                    f"AuthorizedKeysFile {self.path('ssh', 'authorized_keys')}\n"
                    f"PidFile {self.path('hosts', host.name, 'sshd.pid')}\n"
                    "PermitRootLogin prohibit-password\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
                    "UsePAM no\nStrictModes no\nPrintMotd no\nMaxStartups 100\nMaxSessions 100\n"
                    "ClientAliveInterval 2\nClientAliveCountMax 3\n")
        script = (f"hostname {host.name} && mount --bind {self.hosts_file(host.name)} /etc/hosts && "
                  f"mount --bind {self.path('ssh', 'ssh_config')} /etc/ssh/ssh_config && mkdir -p /run/sshd && "
                  f"exec {_SSHD} -D -e -f {config}")
        log = open(self.path("hosts", host.name, "sshd.log"), "ab")  # noqa: SIM115 - the daemon's
        proc = subprocess.Popen(["ip", "netns", "exec", host.netns, "unshare", "--uts", "--mount",
                                 "--propagation", "private", "sh", "-c", script],
                                stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True)
        log.close()
        host.pid = proc.pid
        self._save()

    def _wait_for_ssh(self, host: VirtualHost, timeout: float) -> None:
        first = next(iter(self.hosts))
        deadline = time.monotonic() + timeout
        while True:
            done = self.run(first, ["ssh", host.name, "hostname"], timeout=timeout)
            if done.returncode == 0 and done.stdout.strip() == host.name:
                return
            if time.monotonic() > deadline or not _alive(host.pid):
                with open(self.path("hosts", host.name, "sshd.log"), encoding="utf-8", errors="replace") as f:
                    log = f.read()[-2000:]
                raise RuntimeError(f"the sshd of virtual host {host.name} did not answer: {done.stderr.strip()}\n"
                                   f"{log}")
            time.sleep(0.2)


def _ip(*args: str, check: bool = True) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True)
    if check and done.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {done.stderr.strip()}")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie of ours is not alive
        with open(f"/proc/{pid}/stat", encoding="utf-8") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def _kill(pid: int) -> None:
    try:
        os.kill(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _wait_gone(pids: list[int], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for pid in pids:
        try:
            os.waitpid(pid, os.WNOHANG)  # reap our own children
        except ChildProcessError:
            pass
        while _alive(pid) and time.monotonic() < deadline:
            time.sleep(0.05)
