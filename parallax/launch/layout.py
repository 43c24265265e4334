"""Which processes a job has: one :class:`RankSpec` per MPI rank (pure)."""

from __future__ import annotations

import json
from dataclasses import dataclass

from parallax.errors import ResourceFileError
from parallax.resources.cluster import Cluster, Device, Role

__all__ = ["RankSpec", "ranks_per_device", "ps_ranks", "hybrid_ranks", "layout_to_json", "layout_from_json"]


@dataclass(frozen=True)
class RankSpec:
    """One process of a job.

    Attributes:
        host: where it runs.
        devices: the devices its replicas use; ``None`` for a bare host line
            (the host's GPUs, or its CPU).
        line: the resource-file line it comes from (0 when Parallax added it).
        role: ``Role.WORKER``, ``Role.PS`` (a parameter server) or ``Role.STAGE`` (a server holding
            one pipeline stage of a worker's replica, :func:`ranks_per_device`).
        port: the port an explicit-role file gives its server, else ``None``.
        group: a pipeline spread over processes: the replica (in device order) whose stage this
            rank holds (its stage 0 is a worker), else ``None``.
        stage: that stage.
    """

    host: str
    devices: tuple[Device, ...] | None
    line: int
    role: Role = Role.WORKER
    port: int | None = None
    group: int | None = None
    stage: int = 0

    @property
    def device(self) -> Device | None:
        """The one device of an MPI-mode rank (``None``: the host's default)."""
        return self.devices[0] if self.devices else None

    @property
    def gpu_ids(self) -> tuple[int, ...]:
        """The host's GPUs it uses (``()``: none, or a bare host line's, which the job plan spells out)."""
        return tuple(d.index for d in self.devices or () if d.kind == "gpu")


def _hosts_together(ranks: list[RankSpec]) -> tuple[RankSpec, ...]:
    # mpirun maps ranks to hosts in the order of --host, filling each host: keep
    # each host's ranks together, hosts in order of first appearance.
    order = {h: i for i, h in enumerate(dict.fromkeys(r.host for r in ranks))}
    return tuple(sorted(ranks, key=lambda r: order[r.host]))


def ranks_per_device(cluster: Cluster, group: int = 1) -> tuple[RankSpec, ...]:
    """MPI mode: one rank per listed device (per ``group`` consecutive devices: the stages of a
    pipeline), hosts in file order (one rank for a bare host).

    >>> from parallax.resources.files import parse_resource_text
    >>> [(r.host, str(r.device)) for r in ranks_per_device(parse_resource_text("a: 0,1\\nb"))]
    [('a', 'gpu:0'), ('a', 'gpu:1'), ('b', 'None')]
    >>> [len(r.devices) for r in ranks_per_device(parse_resource_text("a: 0,1,2,3"), group=2)]
    [2, 2]

    When a line's devices do not divide into groups of ``group``, each replica's stages are
    processes of their own, possibly on several hosts (TensorFlow's gRPC runtime carries the
    activations): ``group`` consecutive devices of the file, the first a worker and the others
    ``stage`` servers.

    >>> [(str(r.role), r.host, r.group, r.stage) for r in ranks_per_device(parse_resource_text("a: 0\\nb: 0"), 2)]
    [('worker', 'a', 0, 0), ('stage', 'b', 0, 1)]

    Raises:
        ResourceFileError: the devices do not divide into groups.
    """
    if group > 1 and any(w.devices is None or len(w.devices) % group for w in cluster.workers):
        return _stage_ranks(cluster, group)
    ranks = []
    for worker in cluster.workers:
        if worker.devices is None:
            ranks.append(RankSpec(worker.host, None, worker.line, port=worker.port))
            continue
        if len(worker.devices) % group:
            raise ResourceFileError(
                f"line {worker.line} ({worker.host}) lists {len(worker.devices)} device(s), but pipeline_stages="
                f"{group} gives each process {group} devices, one per stage: list a multiple of {group}")
        # a line of one process: its server takes the line's port
        port = worker.port if len(worker.devices) == group else None
        ranks.extend(RankSpec(worker.host, tuple(worker.devices[i:i + group]), worker.line, port=port)
                     for i in range(0, len(worker.devices), group))
    return _hosts_together(ranks)


def _stage_ranks(cluster: Cluster, group: int) -> tuple[RankSpec, ...]:
    """A process per device; each ``group`` consecutive devices a replica: a worker (stage 0)
    and ``group - 1`` stage servers."""
    flat = [(w, d) for w in cluster.workers for d in (w.devices or (None,))]
    if len(flat) % group:
        raise ResourceFileError(
            f"{cluster.source} lists {len(flat)} device(s), but pipeline_stages={group} needs each replica's "
            f"{group} stages: list a multiple of {group} devices (one process per device when a line's devices "
            "do not divide into stages)")
    ranks = []
    for i, (w, d) in enumerate(flat):
        alone = w.devices is None or len(w.devices) == 1
        role = Role.WORKER if i % group == 0 else Role.STAGE
        ranks.append(RankSpec(w.host, None if d is None else (d,), w.line, role, w.port if alone else None,
                              i // group, i % group))
    return _hosts_together(ranks)


def ps_ranks(cluster: Cluster) -> tuple[RankSpec, ...]:
    """PS mode: one worker rank per worker line (its devices become in-graph replicas)
    and the parameter servers: the file's ps lines, or one per host.

    Ranks are grouped by host (as mpirun places them); a worker's index is its
    position among the workers, a server's among the servers.

    >>> from parallax.resources.files import parse_resource_text
    >>> [(str(r.role), r.host) for r in ps_ranks(parse_resource_text("a: 0,1\\nb: 0"))]
    [('worker', 'a'), ('ps', 'a'), ('worker', 'b'), ('ps', 'b')]
    """
    workers = [RankSpec(w.host, w.devices, w.line, Role.WORKER, w.port) for w in cluster.workers]
    return _hosts_together([*workers, *_servers(cluster)])


def hybrid_ranks(cluster: Cluster, group: int = 1) -> tuple[RankSpec, ...]:
    """HYBRID (and AUTO with servers): one worker rank per device, as in MPI mode,
    and the parameter servers of :func:`ps_ranks`.

    >>> from parallax.resources.files import parse_resource_text
    >>> [(str(r.role), r.host, str(r.device)) for r in hybrid_ranks(parse_resource_text("a: 0,1"))]
    [('worker', 'a', 'gpu:0'), ('worker', 'a', 'gpu:1'), ('ps', 'a', 'None')]
    """
    return _hosts_together([*ranks_per_device(cluster, group), *_servers(cluster)])


def _servers(cluster: Cluster) -> list[RankSpec]:
    """The file's ps lines, or one server per worker host."""
    if cluster.servers:
        return [RankSpec(s.host, None, s.line, Role.PS, s.port) for s in cluster.servers]
    return [RankSpec(h, None, 0, Role.PS) for h in dict.fromkeys(w.host for w in cluster.workers)]


def layout_to_json(ranks: tuple[RankSpec, ...]) -> str:
    return json.dumps([{"host": r.host, "line": r.line, "role": r.role, "port": r.port, "group": r.group,
                        "stage": r.stage,
                        "devices": None if r.devices is None else [[d.kind, d.index] for d in r.devices]}
                       for r in ranks], sort_keys=True)


def layout_from_json(text: str) -> tuple[RankSpec, ...]:
    out = []
    for r in json.loads(text):
        devices = None if r["devices"] is None else tuple(Device(k, i) for k, i in r["devices"])
        out.append(RankSpec(r["host"], devices, r["line"], Role(r["role"]), r.get("port"), r.get("group"),
                            r.get("stage", 0)))
    return tuple(out)
