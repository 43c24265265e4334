"""The compiled all-reduce op: how a graph's all-reduce PyFunc becomes it, and what happens
where it cannot be built. Its sums are checked on real ranks (tests/multiprocess/test_mpi_allreduce.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.comm import native
from parallax.comm.mpi import (
    _ALLGATHER,
    _ALLREDUCE,
    CHUNK_BYTES,
    FUSE_BELOW_BYTES,
    HUGE_PAGE_BYTES,
    MPIBackend,
    _lower,
    _native_for,
    _skip_owned,
    fused_layout,
)
from parallax.invocation import HUGE_PAGES_ENV, NATIVE_OPS_ENV, Invocation
from parallax.plan.model import CommSpec


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
    assert node.attr["huge_page_bytes"].i == HUGE_PAGE_BYTES
    assert node.attr["fuse_below"].i == FUSE_BELOW_BYTES  # the same rule as the PyFunc's (fused_layout)
    assert not {"Tin", "Tout", "token"} & set(node.attr)


def test_small_buffers_of_one_dtype_are_fused_in_order_at_aligned_offsets():
    f4, i8 = np.dtype(np.float32), np.dtype(np.int64)
    big = FUSE_BELOW_BYTES
    # 12 bytes at 0, 100 at 64 (ending at 164), a scalar at 192, total 256: the big one and the int64 stay apart
    assert fused_layout([(12, f4), (big, f4), (100, f4), (8, i8), (4, f4)]) == ([0, 2, 4], [0, 64, 192], 256)
    assert fused_layout([(FUSE_BELOW_BYTES - 4, f4), (64, f4)]) == ([0, 1], [0, FUSE_BELOW_BYTES], big + 64)
    # one small buffer, empty ones and big ones: nothing to fuse
    assert fused_layout([(12, f4), (0, f4), (big, f4)]) == ([], [], 0)
    assert fused_layout([(big, f4), (big + 4, f4)]) == ([], [], 0)


def test_huge_page_advice_can_be_turned_off():
    off = Invocation.from_env({HUGE_PAGES_ENV: "0"}).comm.huge_pages  # PARALLAX_HUGE_PAGES=0, as parallel_run reads it
    for huge_pages, expected in ((off, 0), (True, HUGE_PAGE_BYTES)):
        node = next(n for n in py_func_graph(_ALLREDUCE).node if n.op == "PyFunc")
        _lower(node, "7.1", huge_pages)
        assert node.attr["huge_page_bytes"].i == expected


def test_the_compiled_op_reads_gradients_without_the_snapshots_the_py_func_needs():
    """The op forwards or copies a buffer itself, so _owned's DebugIdentityV2 + Snapshot go, except
    where something else reads them."""
    graph = tf.Graph()
    with graph.as_default():
        grads = [tf.fill([70000], 1.0) * 2.0, tf.fill([80000], 1.0) * 3.0]
        backend = MPIBackend(CommSpec(fusion_bytes=1 << 40), 2)
        summed = backend.allreduce_sum(grads)
        tf.identity(summed[0], name="after")
    graph_def = graph.as_graph_def()
    backend.finalize_nodes(graph_def.node)
    by_name = {n.name: n for n in graph_def.node}
    call = next(n for n in graph_def.node if n.op == "PyFunc")
    snapshots = [by_name[i.split(":")[0]] for i in call.input]
    assert [n.op for n in snapshots] == ["Snapshot", "Snapshot"]
    # a second reader of the first gradient's snapshot keeps that one
    extra = graph_def.node.add(name="also_reads", op="Identity", input=[snapshots[0].name])
    extra.attr["T"].type = tf.float32.as_datatype_enum
    _lower(call, "7.1")
    _skip_owned(graph_def)
    ops = {n.name: n.op for n in graph_def.node}
    call = next(n for n in graph_def.node if n.op == native.OP_NAME)
    assert call.input[0] == snapshots[0].name  # kept: also_reads needs it
    assert call.input[1] == by_name[snapshots[1].input[0].split(":")[0]].input[0]  # the gradient itself
    assert snapshots[1].name not in ops and snapshots[0].name in ops
    assert sum(op == "DebugIdentityV2" for op in ops.values()) == 1
    assert all(i.lstrip("^").split(":")[0] in ops for n in graph_def.node for i in n.input)  # none dangles


def test_only_graphs_with_an_all_reduce_load_the_op(monkeypatch):
    asked = []
    monkeypatch.setattr(native, "native_ops", lambda root=None: asked.append(root) or "ops")
    assert _native_for(py_func_graph(_ALLGATHER)) is None and not asked
    assert _native_for(py_func_graph(_ALLREDUCE + "@host"), "/cache") == "ops" and asked == ["/cache"]


@pytest.fixture
def fresh_native(tmp_path):
    """A cache of the test's own (given to the op, as a process's settings give theirs)."""
    native.native_ops.cache_clear()
    yield str(tmp_path)
    native.native_ops.cache_clear()


def test_without_a_compiler_the_backend_warns_once_and_keeps_python(fresh_native, monkeypatch, parallax_warnings):
    monkeypatch.setenv("CXX", "false")
    assert native.native_ops(fresh_native) is None
    assert native.native_ops(fresh_native) is None
    warnings = [m for m in parallax_warnings if "compiled all-reduce op" in m]
    assert len(warnings) == 1 and "false failed (exit code 1)" in warnings[0], warnings
    assert native.library_path(fresh_native).startswith(fresh_native)
    with pytest.raises(RuntimeError, match="exit code 1"):
        native.build(native.library_path(fresh_native))


def test_it_can_be_turned_off(fresh_native, monkeypatch, parallax_warnings):
    """PARALLAX_NATIVE_OPS=0 reaches a worker's communicators through its settings: the op is never asked for."""
    from types import SimpleNamespace

    from parallax.job.settings import derive
    from parallax.member.roles import process_comms
    from parallax.plan.model import Layout
    from parallax.resources.files import parse_resource_text

    cluster = parse_resource_text("localhost: cpu:0,cpu:1", "res")
    asked = Invocation.from_env({NATIVE_OPS_ENV: "0", "PARALLAX_CACHE_DIR": fresh_native})
    settings = derive(parallax.Config(), True, cluster, gpus=0, cpu_count=2, invocation=asked)
    comms = process_comms(SimpleNamespace(layout=Layout.MPI, workers=()), settings)
    assert (comms.native_ops, comms.huge_pages, comms.cache_root) == (False, True, fresh_native)
    on = process_comms(SimpleNamespace(layout=Layout.MPI, workers=()), derive(parallax.Config(), True, cluster,
                                                                               gpus=0, cpu_count=2))
    assert on.native_ops and not parallax_warnings
