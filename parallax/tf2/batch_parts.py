"""The replicas' parts of ``parallax.fit``'s global batches: which examples each replica of each worker takes, and
the padding of a batch that does not split evenly (weighed 0, cut off by the step before the forward pass).

Replica ``k`` of worker ``w`` takes part ``w * replicas + k`` of equal parts of each global batch (:func:`parts`),
so one step's union is the batch ``model.fit`` trains at that step. A batch that does not split into equal parts
(an epoch's last) is padded at its end to equal parts (:func:`even_parts`, :func:`block_parts`): each replica trains
on its part's real examples, and its loss counts for its share of the batch's examples
(:func:`parallax.tf2.part_loss.part_loss`). A worker that reads only its share of a dataset
(:mod:`parallax.tf2.input_split`) has its block of each batch alone (:func:`worker_block`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["parts", "even_parts", "block_parts", "worker_block", "block_rows", "per_leaf"]


def parts(batch: Any, num_workers: int, worker_id: int, num_replicas: int) -> list:
    """This worker's replicas' parts of a global ``batch`` (an array, or a structure of arrays), in replica
    order: the batch cut in ``num_workers * num_replicas`` equal parts, part ``worker_id * num_replicas + k``
    for replica ``k``.

    >>> parts(np.arange(6), 3, 1, 1)
    [array([2, 3])]
    """
    if batch is None:  # no targets, or no weights: none in any part
        return [None] * num_replicas
    n = num_workers * num_replicas
    cut = [np.split(np.asarray(a), n) for a in tf.nest.flatten(batch)]
    first = worker_id * num_replicas
    return [tf.nest.pack_sequence_as(batch, [pieces[first + k] for pieces in cut]) for k in range(num_replicas)]


def even_parts(batch: tuple, replicas: int) -> tuple[tuple, int, int]:
    """A global ``batch`` ``(x, y, sample_weight or None)`` made ready to cut into ``replicas`` equal parts:
    ``(fed, size, examples)``. A batch of ``examples`` that does not split evenly (the last of an epoch) is
    padded at its end, by repeats of its first example, to ``replicas * size`` (``size`` the examples a part
    takes, rounded up); the weights fed are the user's (or ones) for the real examples and 0 for the padding.
    The step cuts each part to its real examples and scales its loss by them (:func:`part_loss`).

    >>> fed, size, examples = even_parts((np.arange(5.0), np.arange(5.0), None), 2)
    >>> fed[0], fed[2], size, examples
    (array([0., 1., 2., 3., 4., 0.]), array([1., 1., 1., 1., 1., 0.], dtype=float32), 3, 5)
    """
    examples = len(tf.nest.flatten(batch[0])[0])
    fed, size = block_parts(batch, examples, replicas, replicas, examples)
    return fed, size, examples


def block_parts(block: tuple, examples: int, replicas: int, here: int, real: int) -> tuple[tuple, int]:
    """A worker's ``here`` parts of a global batch of ``examples`` cut into ``replicas`` equal parts of ``size``
    (rounded up), from ``block`` ``(x, y, sample_weight or None)``, whose first ``real`` rows are the
    examples of those parts (the rest of the parts, past the batch's end, padding): ``(fed, size)``, ``fed``
    ``here * size`` rows, padded by repeats of ``block``'s first row, and the weights as :func:`even_parts`
    makes them. The whole batch is the block of all parts (``here == replicas``); a worker that reads only its
    share of the data (:mod:`parallax.tf2.input_split`) has its block alone.

    >>> fed, size = block_parts((np.arange(2.0), np.arange(2.0), None), 5, 4, 2, 1)
    >>> fed[0], fed[2], size
    (array([0., 0., 0., 0.]), array([1., 0., 0., 0.], dtype=float32), 2)
    """
    x, y, weights = block
    w = np.ones(real, np.float32) if weights is None else \
        tf.nest.map_structure(lambda a: np.asarray(a, np.float32)[:real], weights)  # a structure: one per output
    size = -(-examples // replicas)
    if size * replicas == examples:
        return (x, y, w), size
    padding = size * here - real
    order = np.concatenate([np.arange(real), np.zeros(padding, np.int64)])
    zeros = functools.partial(tf.nest.map_structure, lambda a: np.concatenate(
        [a, np.zeros((padding, *a.shape[1:]), np.float32)]))
    pad = functools.partial(tf.nest.map_structure, lambda a: np.asarray(a)[order])
    return (pad(x), None if y is None else pad(y), zeros(w)), size


def worker_block(batch: tuple, num_workers: int, worker_id: int, num_replicas: int,
                 examples: int | None) -> tuple[tuple, int, int]:
    """This worker's block of the global batch, padded (:func:`block_parts`: its weights, 0 for the padding, are
    also the metrics'): ``(fed, size of a part, examples of the global batch)``; ``batch`` the global batch
    (``examples`` ``None``), or this worker's block of one of ``examples``."""
    replicas = num_workers * num_replicas
    if examples is None:  # the global batch
        examples = len(tf.nest.flatten(batch[0])[0])
        whole, size = block_parts(batch, examples, replicas, replicas, examples)
        return tuple(parts(a, num_workers, worker_id, 1)[0] for a in whole), size, examples
    real = block_rows(examples, num_workers, worker_id, num_replicas)
    block, size = block_parts(batch, examples, replicas, num_replicas, real)
    return block, size, examples


def block_rows(examples: int, num_workers: int, worker_id: int, num_replicas: int = 1) -> int:
    """The examples in worker ``worker_id``'s block of a global batch of ``examples`` cut into ``num_workers *
    num_replicas`` equal parts (rounded up), as a worker's share of the data holds them: 0 where the batch ends
    before its block (its block is then padding).

    >>> [block_rows(5, 2, w) for w in range(2)], [block_rows(1, 2, w) for w in range(2)], block_rows(5, 2, 1, 2)
    ([3, 2], [1, 0], 1)
    """
    size = -(-examples // (num_workers * num_replicas))
    return min(max(examples - worker_id * num_replicas * size, 0), num_replicas * size)


def per_leaf(per_replica: list, structure: Any) -> Any:
    """``structure`` with each leaf the list of that leaf's value on every replica (what a step takes)."""
    flat = [tf.nest.flatten(part) for part in per_replica]
    return tf.nest.pack_sequence_as(structure, [[f[i] for f in flat] for i in range(len(flat[0]))])
