"""Pipelines that may yield their elements in another order at each reading (``deterministic=False``).

``Dataset.map``, ``interleave`` and ``batch`` with ``num_parallel_calls`` take ``deterministic=False``, and a
dataset's options ``deterministic = False`` (TensorFlow's tf.data performance guide suggests both): an element
whose work ends first comes first. On one device that only reorders the examples a little. In a job every worker
reads the pipeline and keeps its part of each global batch (or its share of the examples): where each reads the
elements in another order, a step's parts are cut from different batches, and the union repeats some examples
and leaves out others, which no worker can see. ``parallax.fit`` refuses such a pipeline on several workers
(:func:`unordered`), naming the operation and how to read it in order.
"""

from __future__ import annotations

import tensorflow as tf

from parallax.logs import log

__all__ = ["check_ordered", "unordered"]


def unordered(dataset: tf.data.Dataset) -> list[str]:
    """Where ``dataset`` asks to yield in the order its work ends: each ``deterministic=False`` op by its kind
    (``ParallelMapDatasetV2``, ...), and ``options().deterministic = False``; empty where it yields in order (or
    where TensorFlow cannot serialise its graph, which ``parallax.fit``'s first-batch check then watches alone)."""
    from tensorflow.core.framework import graph_pb2
    from tensorflow.python.data.ops import options

    try:
        graph = graph_pb2.GraphDef.FromString(
            dataset._as_serialized_graph(external_state_policy=options.ExternalStatePolicy.IGNORE).numpy())
    except Exception as e:  # noqa: BLE001 - a pipeline TensorFlow cannot serialise: its options alone are read
        log.debug("Parallax: the dataset's graph could not be read for its order (%s: %s)", type(e).__name__, e)
        graph = graph_pb2.GraphDef()
    found = [node.op for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]
             if "deterministic" in node.attr and node.attr["deterministic"].s == b"false"]
    if dataset.options().deterministic is False:
        found.append("options().deterministic = False")
    return found


def check_ordered(data: object, workers: int, caller: str, argument: str) -> None:
    """Refuse a ``tf.data.Dataset`` given as ``argument`` that may yield in another order at each reading
    (:func:`unordered`), where ``workers`` (more than one) each read it.

    Raises:
        ValueError: naming the operations and what to change.
    """
    if workers < 2 or not isinstance(data, tf.data.Dataset):
        return
    found = unordered(data)
    if found:
        raise ValueError(
            f"{caller}: {argument} is a dataset that yields its elements in the order their work ends "
            f"({', '.join(found)}): each of the {workers} workers would read them in another order, so a step's parts "
            "would come from different batches, repeating some examples and leaving out others. Leave deterministic "
            "at its default (or True) in map, interleave and batch, and options().deterministic unset or True")
