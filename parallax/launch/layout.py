"""Which processes a job has: one :class:`RankSpec` per MPI rank (pure)."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

from parallax.resources import Cluster, Device

__all__ = ["RankSpec", "ranks_per_device", "layout_to_json", "layout_from_json"]


@dataclass(frozen=True)
class RankSpec:
    """One process of an MPI-style job: its host and the one device it trains on.

    ``device`` is ``None`` for a bare host line: the process then uses the
    host's first GPU, or its CPU.
    """

    host: str
    device: Device | None
    line: int


def ranks_per_device(cluster: Cluster) -> tuple[RankSpec, ...]:
    """One rank per listed device, hosts in file order (one rank for a bare host).

    >>> from parallax.resources import parse_resource_text
    >>> [(r.host, str(r.device)) for r in ranks_per_device(parse_resource_text("a: 0,1\\nb"))]
    [('a', 'gpu:0'), ('a', 'gpu:1'), ('b', 'None')]
    """
    ranks = []
    for worker in cluster.workers:
        if worker.devices is None:
            ranks.append(RankSpec(worker.host, None, worker.line))
        else:
            ranks.extend(RankSpec(worker.host, d, worker.line) for d in worker.devices)
    # mpirun maps ranks to hosts in the order of --host, filling each host: keep
    # each host's ranks together, hosts in order of first appearance.
    order = {h: i for i, h in enumerate(dict.fromkeys(r.host for r in ranks))}
    return tuple(sorted(ranks, key=lambda r: order[r.host]))


def layout_to_json(ranks: tuple[RankSpec, ...]) -> str:
    return json.dumps([asdict(r) for r in ranks], sort_keys=True)


def layout_from_json(text: str) -> tuple[RankSpec, ...]:
    out = []
    for r in json.loads(text):
        device = Device(**r["device"]) if r["device"] else None
        out.append(RankSpec(r["host"], device, r["line"]))
    return tuple(out)
