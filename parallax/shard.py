"""Shard a ``tf.data`` input pipeline over the replicas.

In the single-device graph, :func:`shard` reads everything (one shard of one).
When Parallax rewrites the graph, each replica's copy of the two constants
becomes the total number of replicas and that replica's global index, so every
replica reads a disjoint part of the data::

    ds = tf.data.Dataset.range(100).batch(4)
    ds = parallax.shard.shard(ds)
    it = tf.compat.v1.data.make_initializable_iterator(ds)

Initializable and one-shot iterators both work: a one-shot iterator copies the
constants into its dataset function, and the rewrite gives each replica its own
copy of that function with its own index.
"""

from __future__ import annotations

import tensorflow as tf

__all__ = ["create_num_shards_and_shard_id", "shard", "NUM_SHARDS_COLLECTION", "SHARD_ID_COLLECTION"]

NUM_SHARDS_COLLECTION = "parallax_num_shards"
SHARD_ID_COLLECTION = "parallax_shard_id"


def create_num_shards_and_shard_id() -> tuple[tf.Tensor, tf.Tensor]:
    """Create (or return) the shard count and shard id tensors of the default graph.

    Returns:
        ``(num_shards, shard_id)``: int64 scalars, 1 and 0 in the single-device graph.
    """
    graph = tf.compat.v1.get_default_graph()
    existing = graph.get_collection(NUM_SHARDS_COLLECTION), graph.get_collection(SHARD_ID_COLLECTION)
    if existing[0] and existing[1]:
        return existing[0][0], existing[1][0]
    with graph.as_default(), graph.name_scope(None):
        num_shards = tf.constant(1, dtype=tf.int64, name="parallax_num_shards")
        shard_id = tf.constant(0, dtype=tf.int64, name="parallax_shard_id")
    graph.add_to_collection(NUM_SHARDS_COLLECTION, num_shards)
    graph.add_to_collection(SHARD_ID_COLLECTION, shard_id)
    return num_shards, shard_id


def shard(ds: tf.data.Dataset) -> tf.data.Dataset:
    """``ds.shard(num_replicas, replica_index)``, filled in by Parallax per replica.

    Args:
        ds: the dataset to shard.

    Returns:
        The sharded dataset (the whole of ``ds`` in the single-device graph).
    """
    num_shards, shard_id = create_num_shards_and_shard_id()
    return ds.shard(num_shards, shard_id)
