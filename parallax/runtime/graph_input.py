"""What ``parallel_run`` accepts as the single-device graph, read into both forms it needs."""

from __future__ import annotations

import os

import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

__all__ = ["load_graph", "export_graph"]


def export_graph(graph: tf.Graph) -> meta_graph_pb2.MetaGraphDef:
    """``graph`` as a ``MetaGraphDef``, every op kept: a ``tf.compat.v1.train.Saver`` the program
    built keeps its ops, so that it can save and restore through the session
    (:mod:`parallax.runtime.saver_calls`)."""
    with graph.as_default():
        return tf.compat.v1.train.export_meta_graph(graph=graph)


def load_graph(single_gpu_graph: tf.Graph | meta_graph_pb2.MetaGraphDef | str | os.PathLike
               ) -> tuple[tf.Graph, meta_graph_pb2.MetaGraphDef]:
    """The user's graph both as a ``tf.Graph`` and as a ``MetaGraphDef``.

    Args:
        single_gpu_graph: a ``tf.Graph``, a ``MetaGraphDef``, or the path of a
            ``.meta`` file (binary or text).

    Raises:
        ValueError: the path does not exist.
        TypeError: something else was given.
    """
    if isinstance(single_gpu_graph, tf.Graph):
        return single_gpu_graph, export_graph(single_gpu_graph)
    if isinstance(single_gpu_graph, (str, os.PathLike)):
        path = os.fspath(single_gpu_graph)
        if not os.path.exists(path):
            raise ValueError(f"parallel_run: single_gpu_graph {path!r} does not exist; expected a "
                             "tf.Graph or the path of a MetaGraphDef (.meta) file")
        meta = meta_graph_pb2.MetaGraphDef()
        with open(path, "rb") as f:
            data = f.read()
        try:
            meta.ParseFromString(data)
        except Exception:  # noqa: BLE001 - fall back to the text format
            from google.protobuf import text_format

            text_format.Merge(data.decode("utf-8"), meta)
        single_gpu_graph = meta
    if isinstance(single_gpu_graph, meta_graph_pb2.MetaGraphDef):
        graph = tf.Graph()
        with graph.as_default():
            tf.compat.v1.train.import_meta_graph(single_gpu_graph)
        return graph, single_gpu_graph
    hint = " (a plain Python function: decorate your training step with @tf.function)" \
        if callable(single_gpu_graph) else ""
    raise TypeError(f"parallel_run: single_gpu_graph must be a tf.Graph, a MetaGraphDef (or the path of a .meta "
                    f"file) or a tf.function training step, got {type(single_gpu_graph).__name__}{hint}")
