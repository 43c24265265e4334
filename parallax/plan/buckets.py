"""The buckets dense gradients are all-reduced in while the backward pass goes on (``MPIConfig.overlap``).

The gradients, in the order the backward pass makes them ready (:mod:`parallax.rewrite.readiness`),
are cut into consecutive buckets of about ``1 / OVERLAP_BUCKETS`` of their bytes (at least
:data:`MIN_BUCKET_BYTES`, at most ``fusion_bytes``): the first bucket's all-reduce starts while the
backward pass still computes the rest, and the last one, which nothing overlaps, is short. Gradients
that make one bucket only are not overlapped at all (:attr:`parallax.plan.model.Plan.overlaps_backward`).
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["overlap_buckets", "OVERLAP_BUCKETS", "MIN_BUCKET_BYTES"]

#: How many buckets the dense gradients are cut into (fewer when they are small: MIN_BUCKET_BYTES).
OVERLAP_BUCKETS = 8
#: No bucket is cut smaller than this (bytes), unless it is the last: a call costs a latency or two.
MIN_BUCKET_BYTES = 1024 * 1024


def overlap_buckets(sizes: Sequence[int], fusion_bytes: int) -> list[list[int]]:
    """Consecutive positions of ``sizes`` (bytes, in readiness order) cut into buckets.

    Each bucket is filled until it holds about ``total / OVERLAP_BUCKETS`` bytes, at least
    :data:`MIN_BUCKET_BYTES` and at most ``fusion_bytes`` (0: every tensor alone); a tensor larger
    than that is a bucket of its own.

    >>> MiB = 1024 * 1024
    >>> overlap_buckets([4 * MiB] * 8, 64 * MiB)
    [[0], [1], [2], [3], [4], [5], [6], [7]]
    >>> overlap_buckets([MiB // 4] * 6, 64 * MiB)   # 1.5 MiB in all: buckets of at least 1 MiB
    [[0, 1, 2, 3], [4, 5]]
    >>> overlap_buckets([100, 100, 100], 0)
    [[0], [1], [2]]
    """
    if not sizes:
        return []
    if fusion_bytes <= 0:
        return [[i] for i in range(len(sizes))]
    target = min(fusion_bytes, max(MIN_BUCKET_BYTES, -(-sum(sizes) // OVERLAP_BUCKETS)))
    buckets: list[list[int]] = [[]]
    held = 0
    for i, size in enumerate(sizes):
        if buckets[-1] and held + size > target:
            buckets.append([])
            held = 0
        buckets[-1].append(i)
        held += size
    return buckets
