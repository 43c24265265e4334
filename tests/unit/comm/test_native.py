"""The compiled all-reduce op: how a graph's all-reduce PyFunc becomes it, and what happens
where it cannot be built. Its sums are checked on real ranks (tests/multiprocess/test_mpi_allreduce.py)."""

from __future__ import annotations

import logging

import pytest
import tensorflow as tf

from parallax.comm import native
from parallax.comm.mpi import _ALLGATHER, _ALLREDUCE, CHUNK_BYTES, _lower, _native_for


def py_func_graph(token: str) -> tf.compat.v1.GraphDef:
    graph = tf.Graph()
    with graph.as_default():
        outputs = tf.numpy_function(lambda a, b: (a, b), [tf.zeros([3]), tf.zeros([2], tf.int64)],
                                    [tf.float32, tf.int64], stateful=True, name="allreduce_0")
        tf.identity(outputs[0], name="after")
    graph_def = graph.as_graph_def()
    for node in graph_def.node:
        if node.op == "PyFunc":
            node.attr["token"].s = token.encode()
    return graph_def


def test_an_all_reduce_py_func_becomes_the_compiled_op_with_its_inputs_and_types():
    graph_def = py_func_graph(_ALLREDUCE + "@host")
    node = next(n for n in graph_def.node if n.op == "PyFunc")
    inputs = list(node.input)
    _lower(node, "7.1@host")
    assert node.op == native.OP_NAME and list(node.input) == inputs
    assert [tf.as_dtype(t) for t in node.attr["T"].list.type] == [tf.float32, tf.int64]
    assert node.attr["comm"].s == b"7.1@host" and node.attr["chunk_bytes"].i == CHUNK_BYTES
    assert not {"Tin", "Tout", "token"} & set(node.attr)


def test_only_graphs_with_an_all_reduce_load_the_op(monkeypatch):
    asked = []
    monkeypatch.setattr(native, "native_ops", lambda: asked.append(1) or "ops")
    assert _native_for(py_func_graph(_ALLGATHER)) is None and not asked
    assert _native_for(py_func_graph(_ALLREDUCE + "@host")) == "ops" and asked


@pytest.fixture
def fresh_native(monkeypatch, tmp_path):
    monkeypatch.setenv("PARALLAX_CACHE_DIR", str(tmp_path))
    native.native_ops.cache_clear()
    yield
    native.native_ops.cache_clear()


def test_without_a_compiler_the_backend_warns_once_and_keeps_python(fresh_native, monkeypatch, caplog):
    monkeypatch.setenv("CXX", "false")
    with caplog.at_level(logging.WARNING, logger="parallax"):
        assert native.native_ops() is None
        assert native.native_ops() is None
    warnings = [r.getMessage() for r in caplog.records if "compiled all-reduce op" in r.getMessage()]
    assert len(warnings) == 1 and "false failed (exit code 1)" in warnings[0], warnings
    with pytest.raises(RuntimeError, match="exit code 1"):
        native.build()


def test_it_can_be_turned_off(fresh_native, monkeypatch, caplog):
    monkeypatch.setenv(native.DISABLE_ENV, "0")
    monkeypatch.setenv("CXX", "false")
    with caplog.at_level(logging.WARNING, logger="parallax"):
        assert native.native_ops() is None
    assert not caplog.records
