"""The user's graph read into both forms: a program's own Saver is left out of the MetaGraphDef, and a graph
without one takes TensorFlow's fast export (the same graph)."""

from __future__ import annotations

import tensorflow as tf

from parallax.graph_input import load_graph
from tests.models import build_mlp


def test_a_programs_saver_is_left_out():
    graph = build_mlp("adam").graph
    with graph.as_default():
        tf.compat.v1.train.Saver()
    _, meta = load_graph(graph)
    ops = {n.op for n in meta.graph_def.node}
    assert not ops & {"SaveV2", "RestoreV2"}, ops
    assert len(meta.graph_def.node) < len(graph.as_graph_def().node)


def test_without_a_saver_the_export_is_the_same_graph():
    graph = build_mlp("adam").graph
    _, meta = load_graph(graph)
    with graph.as_default():
        slow = tf.compat.v1.train.export_meta_graph(graph=graph, clear_extraneous_savers=True)

    def nodes(m):  # control inputs may come in another order
        return {n.name: (n.op, sorted(n.input), n.device, sorted(n.attr)) for n in m.graph_def.node}

    assert nodes(meta) == nodes(slow)
    assert sorted(meta.collection_def) == sorted(slow.collection_def)
