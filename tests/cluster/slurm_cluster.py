"""Slurm on a virtual cluster: ``munged``, ``slurmctld`` on the first host, a ``slurmd`` on every host.

Debian's ``slurm-wlm`` and ``munge``, configured as a small site would be:
``auth/munge``, ``select/cons_tres``, ``proctrack/linuxproc``, ``task/none``,
one partition (``debug``) holding every host, jobs run as root. Everything it
writes lives under ``<cluster state dir>/slurm``: the configuration (bind-mounted
on ``/etc/slurm`` in every host's mount namespace, so ``sbatch``, ``srun`` and
``scontrol`` there work as on a real cluster), the munge key and socket, the
daemons' spool, state and logs. The daemons run in the hosts' namespaces, so
:meth:`VirtualCluster.down` ends them too; :meth:`SlurmCluster.down` ends them
first (by PID) and waits for them.

Needs ``slurmctld``, ``slurmd`` (slurm-wlm) and ``munged`` (munge):
:func:`missing_slurm` says what is missing.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time

from tests.cluster.virtual_cluster import VirtualCluster, _kill, _wait_gone

__all__ = ["SlurmCluster", "missing_slurm"]

_DAEMONS = ("/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged")
_COMMANDS = ("sbatch", "srun", "sinfo", "scontrol")


def missing_slurm() -> str | None:
    """Why Slurm cannot run on a virtual cluster here, or ``None`` when it can."""
    missing = [d for d in _DAEMONS if not os.access(d, os.X_OK)] + [c for c in _COMMANDS if not shutil.which(c)]
    if missing:
        return (f"Slurm on the virtual cluster needs {', '.join(missing)} (apt-get install slurm-wlm munge; "
                "`make test-cluster` does)")
    return None


class SlurmCluster:
    """Slurm daemons on the hosts of ``cluster`` (see the module docstring).

    Args:
        cluster: a virtual cluster that is up; its first host is the controller
            (and the login node jobs are submitted from).
        cpus: CPUs each node offers (the hosts share this machine's cores).
    """

    def __init__(self, cluster: VirtualCluster, cpus: int = 2) -> None:
        self.cluster = cluster
        self.cpus = cpus
        self.controller = next(iter(cluster.hosts))
        self.dir = cluster.path("slurm")
        self._daemons: list[tuple[str, subprocess.Popen]] = []
        self._helpers: set[int] = set()

    def path(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    # ------------------------------------------------------------------ up / down
    def up(self, timeout: float = 60.0) -> SlurmCluster:
        """Write the configuration, start munged, slurmctld and the slurmds; wait until every node is idle.

        On failure, what was started is ended and the error raised (with the daemons' logs).
        """
        reason = missing_slurm()
        if reason:
            raise RuntimeError(reason)
        try:
            self._configure()
            self._start("munged", self.controller,
                        ["/usr/sbin/munged", "-F", "--force", f"--key-file={self.path('munge', 'munge.key')}",
                         f"--socket={self.path('munge', 'munge.socket')}",
                         f"--pid-file={self.path('munge', 'munged.pid')}",
                         f"--seed-file={self.path('munge', 'munged.seed')}",
                         f"--log-file={self.path('log', 'munged.log')}"])
            self._wait(lambda: os.path.exists(self.path("munge", "munge.socket")), 10, "munged made no socket")
            for host in self.cluster.hosts:
                self._prepare(host)
            self._start("slurmctld", self.controller, ["/usr/sbin/slurmctld", "-D", "-i"])
            for host in self.cluster.hosts:
                self._start(f"slurmd on {host}", host, ["/usr/sbin/slurmd", "-D"])
            self._wait(self.all_idle, timeout, "the nodes did not become idle")
            for host in self.cluster.hosts:  # the daemons' own helpers too (slurmctld's slurmscriptd)
                self._helpers.update(self.cluster.job_pids(host))
            self.cluster.daemons.update(self._helpers)
        except BaseException:
            self.down()
            raise
        return self

    def down(self) -> None:
        """End the daemons this object started (idempotent); the files go with the cluster's state dir."""
        for _, proc in reversed(self._daemons):
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 10
        for _, proc in self._daemons:
            try:
                proc.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _kill(proc.pid)
        for pid in self._helpers:
            _kill(pid)
        _wait_gone([p.pid for _, p in self._daemons] + sorted(self._helpers), 5.0)
        self.cluster.daemons.difference_update({p.pid for _, p in self._daemons} | self._helpers)
        self._daemons, self._helpers = [], set()

    def __enter__(self) -> SlurmCluster:
        return self.up()

    def __exit__(self, *exc) -> None:
        self.down()

    # ------------------------------------------------------------------ using it
    def run(self, argv: list[str], cwd: str | None = None, timeout: float = 60,
            **kwargs) -> subprocess.CompletedProcess:
        """Run a command on the login node (the controller's host), as a user there would."""
        return self.cluster.run(self.controller, argv, cwd=cwd, timeout=timeout, **kwargs)

    def logs(self) -> str:
        """The tail of every daemon's log (for a failure's message)."""
        parts = []
        for name in sorted(os.listdir(self.path("log"))) if os.path.isdir(self.path("log")) else []:
            with open(self.path("log", name), encoding="utf-8", errors="replace") as f:
                parts.append(f"--- {name}\n{f.read()[-1500:]}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ making it
    def _configure(self) -> None:
        for sub in ("etc", "munge", "log", "state", "spool"):
            os.makedirs(self.path(sub), exist_ok=True)
        os.chmod(self.path("munge"), 0o700)
        key = self.path("munge", "munge.key")
        with open(key, "wb") as f:
            f.write(os.urandom(1024))
        os.chmod(key, 0o400)
        hosts = self.cluster.hosts.values()
        nodes = "".join(f"NodeName={h.name} NodeAddr={h.address} CPUs={self.cpus} State=UNKNOWN\n" for h in hosts)
        controller = self.cluster.hosts[self.controller]
        with open(self.path("etc", "slurm.conf"), "w", encoding="utf-8") as f:
            f.write(
                f"ClusterName=parallax\nSlurmctldHost={controller.name}({controller.address})\n"
                "SlurmUser=root\nSlurmdUser=root\nAuthType=auth/munge\nCredType=cred/munge\n"
                f"AuthInfo=socket={self.path('munge', 'munge.socket')}\n"
                "SlurmctldPort=6817\nSlurmdPort=6818\n"
                f"StateSaveLocation={self.path('state')}\nSlurmdSpoolDir={self.path('spool', '%n')}\n"
                f"SlurmctldPidFile={self.path('state', 'slurmctld.pid')}\n"
                f"SlurmdPidFile={self.path('spool', 'slurmd.%n.pid')}\n"
                f"SlurmctldLogFile={self.path('log', 'slurmctld.log')}\n"
                f"SlurmdLogFile={self.path('log', 'slurmd.%n.log')}\n"
                "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n"
                "SelectType=select/cons_tres\nSelectTypeParameters=CR_Core\nSchedulerType=sched/backfill\n"
                "MpiDefault=none\nReturnToService=2\nJobCompType=jobcomp/none\n"
                "AccountingStorageType=accounting_storage/none\nJobAcctGatherType=jobacct_gather/none\n"
                "SlurmctldTimeout=30\nSlurmdTimeout=30\nInactiveLimit=0\nKillWait=5\n"
                # sbatch --wait reads an ended job's exit code from its record: kept 10 min (30 s lost it under load)
                "MinJobAge=600\n"
                "SlurmctldDebug=info\nSlurmdDebug=info\n"
                f"{nodes}PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n")

    def _prepare(self, host: str) -> None:
        """In ``host``'s mount namespace: this configuration on ``/etc/slurm``, and a cgroup v1 tree on
        ``/sys/fs/cgroup`` (the host's own sysfs has none; slurmd's cgroup plugin wants one even with
        ``proctrack/linuxproc``); its spool directory."""
        os.makedirs(self.path("spool", host), exist_ok=True)
        script = (f"mount --bind {self.path('etc')} /etc/slurm && mount -t tmpfs cgroup_root /sys/fs/cgroup && "
                  "mkdir /sys/fs/cgroup/freezer /sys/fs/cgroup/systemd && "
                  "mount -t cgroup -o freezer freezer /sys/fs/cgroup/freezer && "
                  "mount -t cgroup -o none,name=systemd systemd /sys/fs/cgroup/systemd")
        done = self.cluster.run(host, ["sh", "-c", script])
        if done.returncode != 0:
            raise RuntimeError(f"preparing {host} for slurmd: {done.stderr.strip()}")

    def _start(self, what: str, host: str, argv: list[str]) -> None:
        log = open(self.path("log", f"{what.replace(' ', '_')}.out"), "ab")  # noqa: SIM115 - the daemon's
        proc = self.cluster.popen(host, argv, cwd=self.dir, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                  start_new_session=True)
        log.close()
        self._daemons.append((what, proc))
        self.cluster.daemons.add(proc.pid)

    def all_idle(self) -> bool:
        """Every node idle: no job on it, none completing (a daemon that ended raises)."""
        for what, proc in self._daemons:
            if proc.poll() is not None:
                raise RuntimeError(f"{what} ended with exit code {proc.returncode}\n{self.logs()}")
        done = self.run(["sinfo", "--noheader", "--Node", "--format=%N %t"], timeout=20)
        states = dict(line.split() for line in done.stdout.splitlines() if line.strip())
        return done.returncode == 0 and set(states) == set(self.cluster.hosts) and \
            all(s == "idle" for s in states.values())

    def _wait(self, ready, timeout: float, what: str) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm on the virtual cluster: {what} within {timeout:.0f} s\n{self.logs()}")
            time.sleep(0.3)
