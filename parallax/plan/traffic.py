"""What one synchronous training step sends, inside hosts and between them: the plan's traffic model.

Bytes of the whole job per step (every process), split into what stays inside a
host and what crosses between hosts, for each variable with a gradient, from
the plan (how each variable is synchronised, where its server is, the hosts of
the workers). ``n`` workers on ``H`` hosts, ``h`` of them on a host. For a dense
gradient of ``B`` bytes, and a sparse one whose worker touches ``k`` rows of
``r`` bytes (``i`` bytes per index; ``u(j)``: the *distinct* rows that the
batches of ``j`` workers touch together, at most ``j * k``):

============  ===============================================  ==============================
sync          inside hosts, per host                           between hosts, the whole job
============  ===============================================  ==============================
allreduce     ``2 (h-1) B``: reduce to the host's first        ``2 (H-1) B``: all-reduce among
              worker, broadcast back                           the hosts' first workers (ring)
allgather     ``(h-1) m + (h-1) n m``, ``m = k (r+i)``        ``(H-1) n m``: each host's rows
              (``u(1) (r+i)`` when the update merges           to every other host
              repeats itself): gather to the first worker,
              broadcast all rows
ps (dense)    each worker pushes ``B``, its server returns     what workers on other hosts
              ``B`` (the new value)                            than the server exchange
ps (sparse)   each worker pushes ``u(1) (r+i)`` (rows with     what senders and readers on
              equal indices summed first), and reads its       other hosts than the server
              ``u(1)`` distinct rows: ``u(1) i`` to the        exchange
              server, ``u(1) r`` back
host gather   the other ``h-1`` workers send ``u(1) (r+i)``    the first worker alone pushes
              to the host's first worker                       ``u(h) (r+i)``
============  ===============================================  ==============================

The collectives are Open MPI 5's on several hosts (its ``han`` component:
hierarchical, each host's first rank speaks for the host); on one host they are
rings (``2 (n-1) B`` and ``n (n-1) m`` in all). ``u`` defaults to
``min(rows, j k)`` with ``k`` the plan's density times the rows (from static
shapes: repeated indices counted); a caller that has counted the rows real
batches touch passes them (benchmarks/scale.py does). Not counted: message
headers, the step's control messages (tokens, the global step), and what a
chief reads to save a checkpoint. Measured on two virtual hosts, the model is
within a few percent (docs/benchmarks.md, "Bytes at scale").
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np

from parallax.plan.model import Plan, Sync, VariablePlacement

__all__ = ["Traffic", "StepTraffic", "RowsFn", "Payload", "UNKNOWN_DENSITY", "payload", "payload_of",
           "variable_traffic", "step_traffic", "allreduce", "allgather", "servers"]

#: The density assumed when nothing says better: an embedding-like 1 % of the rows per worker and step.
UNKNOWN_DENSITY = 0.01

#: The distinct rows of a sparse gradient that the batches of ``j`` workers touch in one step.
RowsFn = Callable[[int], float]


@dataclass(frozen=True)
class Traffic:
    """Bytes per step that stay inside a host, and that cross between hosts."""

    inside: float = 0.0
    crossing: float = 0.0

    def __add__(self, other: Traffic) -> Traffic:
        return Traffic(self.inside + other.inside, self.crossing + other.crossing)

    @property
    def total(self) -> float:
        return self.inside + self.crossing

    def per(self, count: int) -> Traffic:
        """Divided among ``count`` workers."""
        return Traffic(self.inside / count, self.crossing / count)


@dataclass(frozen=True)
class StepTraffic:
    """A step's traffic: per variable with a gradient, and all together."""

    variables: Mapping[str, Traffic]
    total: Traffic


def _per_host(hosts: Sequence[str]) -> list[int]:
    """Workers per host, hosts in order of their first worker."""
    return list(Counter(hosts).values())


def allreduce(num_bytes: float, hosts: Sequence[str]) -> Traffic:
    """An all-reduce of ``num_bytes`` among workers on ``hosts`` (module docstring).

    >>> allreduce(100, ["a", "a", "b", "b"]), allreduce(100, ["a", "a"])
    (Traffic(inside=400.0, crossing=200.0), Traffic(inside=200.0, crossing=0.0))
    """
    groups, n = _per_host(hosts), len(hosts)
    if n < 2:
        return Traffic()
    if len(groups) == 1:
        return Traffic(2.0 * (n - 1) * num_bytes, 0.0)
    return Traffic(float(sum(2 * (h - 1) * num_bytes for h in groups)), 2.0 * (len(groups) - 1) * num_bytes)


def allgather(per_worker: float, hosts: Sequence[str]) -> Traffic:
    """An all-gather of ``per_worker`` bytes from each worker on ``hosts`` (module docstring).

    >>> allgather(10, ["a", "a", "b", "b"])
    Traffic(inside=100.0, crossing=40.0)
    """
    groups, n = _per_host(hosts), len(hosts)
    if n < 2:
        return Traffic()
    if len(groups) == 1:
        return Traffic(float(n * (n - 1) * per_worker), 0.0)
    inside = sum((h - 1) * (1 + n) * per_worker for h in groups)
    return Traffic(float(inside), float((len(groups) - 1) * n * per_worker))


def servers(sent: Sequence[tuple[str, float]], server_host: str | None, hosts: Sequence[str]) -> Traffic:
    """``sent``: ``(host, bytes)`` exchanged with a server on ``server_host`` (``None``: unknown,
    taken as one server on each host, each equally likely)."""
    distinct = list(dict.fromkeys(hosts))
    inside = crossing = 0.0
    for host, num_bytes in sent:
        if server_host is None:
            away = (len(distinct) - 1) / len(distinct) if distinct else 0.0
        else:
            away = float(host != server_host)
        crossing += away * num_bytes
        inside += (1 - away) * num_bytes
    return Traffic(inside, crossing)


@dataclass(frozen=True)
class Payload:
    """What synchronising one variable moves: its bytes and, for a sparse gradient, its rows.

    Attributes:
        num_bytes: the whole variable.
        sparse: whether its gradient is sparse.
        rows: its first dimension.
        row_bytes: one row; ``index_bytes``: one index.
        k: rows one worker's gradient has per step, repeats counted (the static shapes' figure).
        distinct: :data:`RowsFn`, the distinct rows ``j`` workers' batches touch together.
        itemsize: bytes of one element.
        wire_ratio: the gradient's bytes on the wire over its bytes in memory (0.5: float32 sent in
            16 bits, ``CommSpec.compression``); the variable's own reads are not compressed.
    """

    num_bytes: int
    sparse: bool = False
    rows: int = 1
    row_bytes: int = 0
    index_bytes: int = 8
    k: float = 0.0
    distinct: RowsFn | None = None
    itemsize: int = 4
    wire_ratio: float = 1.0

    def u(self, workers: int) -> float:
        return self.distinct(workers) if self.distinct else min(self.rows, workers * self.k)


def payload(shape: Sequence[int | None], itemsize: int, sparse: bool, density: float | None,
            index_bytes: int = 8, distinct: RowsFn | None = None) -> Payload:
    """A variable's :class:`Payload` from its shape; ``density``: the rows one worker's gradient
    has over all rows (unknown: ``UNKNOWN_DENSITY``, an embedding-like 1 %)."""
    rows = (shape[0] or 1) if shape else 1
    row_bytes = itemsize * math.prod(d or 1 for d in shape[1:])
    k = (density if density is not None else UNKNOWN_DENSITY) * rows if sparse else 0.0
    return Payload(rows * row_bytes, sparse, rows, row_bytes, index_bytes, k, distinct, itemsize)


def variable_traffic(p: Payload, sync: Sync, hosts: Sequence[str], server_host: str | None = None, *,
                     merged: bool = True, host_aggregation: bool = False, rows_on_server: bool = True) -> Traffic:
    """One step's traffic for one variable synchronised by ``sync`` among workers on ``hosts``.

    ``merged``: a sparse gradient is sent with the rows of equal indices summed (to the servers:
    synchronous training with local aggregation; all-gathered: :attr:`GradientRef.repeats_merged`);
    ``host_aggregation``: a host's first worker sends its rows; ``rows_on_server``:
    gathers of rows run on the server (``boundary_between_workers_and_servers``), asking for each
    distinct row once.
    """
    n = len(hosts)
    if sync == Sync.LOCAL or n < 1:
        return Traffic()
    if sync == Sync.ALLREDUCE:  # a sparse gradient is made dense, with a count per row
        return allreduce((p.num_bytes + (p.rows * p.itemsize if p.sparse else 0)) * p.wire_ratio, hosts)
    sent = p.row_bytes * p.wire_ratio + p.index_bytes  # one row of the gradient and its index
    if sync == Sync.ALLGATHER:
        return allgather((p.u(1) if merged else p.k) * sent, hosts)
    if sync != Sync.PS:
        raise ValueError(f"unknown sync method {sync!r}")
    if not p.sparse:  # push the gradient, read the new value
        return servers([(h, (1.0 + p.wire_ratio) * p.num_bytes) for h in hosts], server_host, hosts)
    each = p.row_bytes + p.index_bytes
    reads = [(h, p.u(1) * each if rows_on_server else p.num_bytes) for h in hosts]
    if not host_aggregation:
        return servers(reads + [(h, (p.u(1) if merged else p.k) * sent) for h in hosts], server_host, hosts)
    counts = Counter(hosts)
    gather = sum((count - 1) * p.u(1) * each for count in counts.values())
    pushes = [(h, p.u(count) * sent) for h, count in counts.items()]  # the gather inside a host: not compressed
    return Traffic(inside=gather) + servers(reads + pushes, server_host, hosts)


def payload_of(v: VariablePlacement, distinct: RowsFn | None = None, compression: str = "none") -> Payload:
    """The :class:`Payload` of a planned variable whose gradient travels as ``compression`` says."""
    itemsize = np.dtype(v.dtype).itemsize if v.dtype != "bfloat16" else 2
    index = np.dtype(v.gradient.indices_dtype).itemsize if v.gradient and v.gradient.indices_dtype else 8
    p = payload(v.gradient_shape, itemsize, v.sparse, v.density, index, distinct)
    if compression != "none" and v.dtype in ("float32", "float64"):
        p = replace(p, wire_ratio=2 / itemsize)
    return p


def step_traffic(plan: Plan, rows: Mapping[str, RowsFn] | None = None) -> StepTraffic:
    """The traffic of one synchronous step of ``plan`` (module docstring); ``rows``: counted
    :data:`RowsFn` of sparse variables, instead of the plan's estimate."""
    hosts = [w.host for w in plan.workers]
    rows = rows or {}
    out: dict[str, Traffic] = {}
    for v in plan.variables:
        if v.gradient is None:
            continue
        server = plan.server_hosts[v.server] if v.server is not None and v.server < len(plan.server_hosts) else None
        merged = v.gradient.repeats_merged and (v.sync is Sync.ALLGATHER or plan.sync and plan.ps.local_aggregation)
        out[v.name] = variable_traffic(
            payload_of(v, rows.get(v.name), plan.comm.compression), v.sync, hosts, server, merged=merged,
            host_aggregation=plan.ps.host_aggregation,
            rows_on_server=plan.ps.boundary_between_workers_and_servers)
    total = Traffic()
    for t in out.values():
        total = total + t
    return StepTraffic(out, total)
