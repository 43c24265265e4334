"""The cost model behind ``run_option='AUTO'`` and the plan's byte estimates.

Everything is in bytes one worker sends per training step, for ``n`` worker
processes. For a variable of ``B`` bytes whose rows are ``r`` bytes each, and
a sparse gradient that touches ``k`` rows per worker and step (indices of
``i`` bytes each):

============  =====================================  ===========================
sync          dense gradient                         sparse gradient
============  =====================================  ===========================
allreduce     ``2 (n-1)/n * B`` (ring all-reduce)    the same, made dense first
allgather     -                                      ``(n-1) * k * (r + i)``
ps            ``2 * B`` (push gradient, pull value)  ``2 * k * (r + i)`` (push
                                                     rows, pull the rows read)
============  =====================================  ===========================

Hence all-gather beats all-reduce of the densified gradient only when
``k / rows < 2 / n`` (each worker touches fewer than about ``2/n`` of the
rows), parameter servers beat all-gather from ``n > 3`` workers, and a dense
gradient is always cheaper to all-reduce. :func:`choose` takes the cheapest;
ties go to all-gather, then all-reduce (no servers needed).

``density`` (``k / rows``) comes from the static shape of the gradient's
indices (an upper bound: duplicates are counted), from a user override, or is
unknown; an unknown density is taken as small (embedding-like), which only
ever chooses between all-gather and parameter servers, whose costs grow alike
with ``k``.
"""

from __future__ import annotations

import math

__all__ = ["bytes_per_worker", "choose", "estimate_density", "UNKNOWN_DENSITY"]

#: The density assumed for the byte estimate when nothing says better.
UNKNOWN_DENSITY = 0.01


def _row_bytes(shape: tuple[int | None, ...], itemsize: int) -> int:
    return itemsize * math.prod(d or 1 for d in shape[1:])


def estimate_density(shape: tuple[int | None, ...], indices_per_replica: int | None,
                     replicas_per_worker: int) -> float | None:
    """Rows touched per worker and step over all rows, at most 1; ``None`` when unknown."""
    if indices_per_replica is None or not shape or not shape[0]:
        return None
    return min(1.0, indices_per_replica * replicas_per_worker / shape[0])


def bytes_per_worker(sync: str, shape: tuple[int | None, ...], itemsize: int, sparse: bool,
                     density: float | None, num_workers: int, indices_itemsize: int = 8, host_peers: int = 0) -> int:
    """Estimated bytes one worker sends per step to synchronise one variable (table above).

    ``host_peers``: with host aggregation (HYBRID), the other workers of the host
    a sparse server variable's rows are first all-gathered with: ``host_peers * k * (r + i)``
    more (inside the host; :func:`choose` leaves it out, counting what crosses hosts).
    """
    n = num_workers
    total = itemsize * math.prod(d or 1 for d in shape)
    if sync == "local" or n < 1:
        return 0
    if sync == "allreduce":
        return int(2 * (n - 1) / n * total) if n > 1 else 0
    rows = (shape[0] or 1) if shape else 1
    k = (density if density is not None else UNKNOWN_DENSITY) * rows
    per_row = _row_bytes(shape, itemsize) + indices_itemsize
    if sync == "allgather":
        return int((n - 1) * k * per_row)
    if sync == "ps":
        return int((2 + host_peers) * k * per_row) if sparse else 2 * total
    raise ValueError(f"unknown sync method {sync!r}")


def choose(shape: tuple[int | None, ...], itemsize: int, sparse: bool, density: float | None,
           num_workers: int) -> str:
    """The cheapest way to synchronise a variable across ``num_workers`` workers."""
    if not sparse:
        return "allreduce"
    options = ("allgather", "allreduce", "ps")
    if density is None:  # unknown: small; only all-gather vs servers can be compared honestly
        options = ("allgather", "ps")
    costs = {s: bytes_per_worker(s, shape, itemsize, True, density, num_workers) for s in options}
    return min(options, key=lambda s: (costs[s], options.index(s)))
