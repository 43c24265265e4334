"""``get_partitioner``: split a variable into partitions Parallax can place and search."""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from parallax.invocation import setting

__all__ = ["get_partitioner", "PARTITIONER_COLLECTION"]

PARTITIONER_COLLECTION = "parallax_partitioned_variables"


def get_partitioner(min_num_partitions: int) -> Callable:
    """A partitioner for ``tf.compat.v1.get_variable(partitioner=...)``.

    The variable is split along its first axis into ``min_num_partitions``
    parts, or more when a partition search (``search_partitions=True``) has
    chosen a larger count (passed in the ``PARALLAX_NUM_PARTITIONS``
    environment variable of each task). Parts are never more than the rows.

    Args:
        min_num_partitions: the smallest number of partitions (>= 1).

    Returns:
        A partitioner: ``(shape, dtype) -> list of partitions per axis``.

    Raises:
        ValueError: ``min_num_partitions`` is not a positive int.
    """
    if isinstance(min_num_partitions, bool) or not isinstance(min_num_partitions, int) \
            or min_num_partitions < 1:
        raise ValueError(f"get_partitioner: min_num_partitions must be an int >= 1, "
                         f"got {min_num_partitions!r}")

    def partitioner(shape, dtype):
        shape = tf.TensorShape(shape)
        if shape.rank is None or shape.rank == 0:
            raise ValueError("parallax.get_partitioner needs a variable of known rank >= 1")
        chosen = setting("partitions") or ""  # the user-facing door: the search's count, read here
        count = max(min_num_partitions, int(chosen)) if chosen.isdigit() else min_num_partitions
        rows = shape.dims[0] if shape.dims[0] is not None else count
        count = max(1, min(count, int(rows)))
        graph = tf.compat.v1.get_default_graph()
        graph.add_to_collection(PARTITIONER_COLLECTION, tf.constant(min_num_partitions,
                                                                    name="parallax_min_partitions"))
        return [count] + [1] * (shape.rank - 1)

    return partitioner
