"""The user's graph read into both forms: every op kept, a program's own Saver included (it saves and restores
through the session, parallax.runtime.saver_calls), and a MetaGraphDef read back into a graph."""

from __future__ import annotations

import tensorflow as tf

from parallax.runtime.graph_input import load_graph
from tests.models import build_mlp


def test_a_programs_saver_is_kept_with_every_other_op():
    graph = build_mlp("adam").graph
    with graph.as_default():
        saver = tf.compat.v1.train.Saver()
    _, meta = load_graph(graph)
    names = {n.name for n in meta.graph_def.node}
    assert names == {op.name for op in graph.get_operations()}
    assert saver.saver_def.save_tensor_name.split(":")[0] in names and saver.saver_def.restore_op_name in names


def test_a_meta_graph_is_read_into_a_graph_of_the_same_ops():
    graph = build_mlp("adam").graph
    _, meta = load_graph(graph)
    again, same = load_graph(meta)
    assert same is meta
    assert {op.name for op in again.get_operations()} >= {op.name for op in graph.get_operations()}
