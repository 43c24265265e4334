"""The ``mpi`` backend without MPI (parallax/comm/mpi.py, mpi_calls.py, mpi_binding.py): the ops it adds to a graph
(fusion buckets, one chained call after another, the tokens each process binds), the buffers its sparse calls lay
out, and what its run-time functions return over a hand-written communicator of two members that hold the same
buffers. Real ranks sum in tests/multiprocess/test_mpi_allreduce.py; the compiled op is in
tests/unit/comm/test_native.py."""

from __future__ import annotations

import sys
import types

import numpy as np
import pytest
import tensorflow as tf

from parallax.comm import mpi_calls
from parallax.comm.mpi import TOKEN_PREFIX, MPIBackend
from parallax.comm.mpi_binding import _agreed_spin, bind_py_functions
from parallax.comm.mpi_calls import (
    _ALLGATHER,
    _ALLGATHER_SHARDS,
    _ALLGATHERV,
    _ALLREDUCE,
    _GATHERV,
    _REDUCE_SCATTER,
    CHUNK_BYTES,
    _functions,
    packed_layout,
)
from parallax.plan.model import CommSpec

# -- the ops a rewrite adds ---------------------------------------------------------------------------------------- #


def py_funcs(graph: tf.Graph) -> list[tf.Operation]:
    return [op for op in graph.get_operations() if op.type == "PyFunc"]


def test_dense_gradients_are_summed_in_buckets_of_at_most_fusion_bytes_per_dtype_each_call_after_the_last():
    graph = tf.Graph()
    with graph.as_default():
        grads = [tf.zeros([100]), tf.zeros([100]), tf.zeros([3], tf.int64), tf.zeros([300]), tf.zeros([2])]
        summed = MPIBackend(CommSpec(fusion_bytes=1000), 2).allreduce_sum(grads)
    calls = py_funcs(graph)
    # float32: 400 + 400 bytes, then 1200 (alone: over the fusion size), then 8 (over it with the 1200); int64 in a
    # bucket of its own, in the order its first gradient comes
    assert [(op.name, len(op.inputs)) for op in calls] == [
        ("allreduce_0", 2), ("allreduce_1", 1), ("allreduce_2", 1), ("allreduce_3", 1)]
    assert [[t.dtype for t in op.inputs] for op in calls] == [[tf.float32] * 2, [tf.int64], [tf.float32], [tf.float32]]
    for before, after in zip(calls, calls[1:]):
        assert after.control_inputs == [before]  # every worker issues the calls in one order
    assert [(s.dtype, s.shape.as_list()) for s in summed] == [(g.dtype, g.shape.as_list()) for g in grads]


def test_a_dtype_mpi_cannot_sum_travels_as_float32_and_comes_back_in_its_own():
    graph = tf.Graph()
    with graph.as_default():
        (summed,) = MPIBackend(CommSpec(), 2).allreduce_sum([tf.zeros([4], tf.int8)])
    (call,) = py_funcs(graph)
    assert [t.dtype for t in call.inputs] == [tf.float32] and summed.dtype == tf.int8


def test_each_gradient_reaches_the_call_through_a_buffer_of_its_own():
    """A ``Snapshot`` hands the call a buffer nothing else holds (it sums in place); a ``DebugIdentityV2`` before
    it keeps Grappler from folding or merging it (two equal constants would be one buffer summed twice)."""
    graph = tf.Graph()
    with graph.as_default():
        MPIBackend(CommSpec(), 2).allreduce_sum([tf.ones([3]), tf.ones([3])])
    (call,) = py_funcs(graph)
    assert [t.op.type for t in call.inputs] == ["Snapshot", "Snapshot"]
    assert [t.op.inputs[0].op.type for t in call.inputs] == ["DebugIdentityV2", "DebugIdentityV2"]


@pytest.mark.parametrize("group, suffix", [("", ""), ("host", "@host")])
def test_the_graph_names_each_call_by_a_fixed_token_a_named_group_suffixed(group, suffix):
    graph = tf.Graph()
    with graph.as_default():
        backend = MPIBackend(CommSpec(), 2, group=group)
        backend.allreduce_sum([tf.zeros([2])])
        backend.allgather([(tf.zeros([1, 2]), tf.zeros([1], tf.int64))])
    graph_def = graph.as_graph_def()
    backend.finalize_nodes(graph_def.node)
    assert [n.attr["token"].s.decode() for n in graph_def.node if n.op == "PyFunc"] == [
        _ALLREDUCE + suffix, _ALLGATHER + suffix]


@pytest.mark.parametrize("use_allgatherv, gather, token", [
    (False, False, _ALLGATHER), (True, False, _ALLGATHERV), (False, True, _GATHERV)])
def test_every_sparse_gradient_of_a_call_travels_in_one_call(use_allgatherv, gather, token):
    graph = tf.Graph()
    with graph.as_default():
        backend = MPIBackend(CommSpec(use_allgatherv=use_allgatherv), 2)
        pairs = [(tf.zeros([2, 3]), tf.constant([1, 2], tf.int64)),
                 (tf.zeros([1, 4], tf.float16), tf.constant([5], tf.int32))]
        out = (backend.gather if gather else backend.allgather)(pairs)
    graph_def = graph.as_graph_def()
    backend.finalize_nodes(graph_def.node)
    (call,) = [n for n in graph_def.node if n.op == "PyFunc"]
    assert call.attr["token"].s.decode() == token and len(call.input) == 4
    assert [(v.dtype, v.shape.as_list(), i.dtype, i.shape.as_list()) for v, i in out] == [
        (tf.float32, [None, 3], tf.int64, [None]), (tf.float16, [None, 4], tf.int32, [None])]


def test_no_sparse_gradients_no_call():
    graph = tf.Graph()
    with graph.as_default():
        assert MPIBackend(CommSpec(), 2).allgather([]) == []
    assert py_funcs(graph) == []


def test_sharded_states_are_reduce_scattered_into_parts_and_gathered_back_whole():
    graph = tf.Graph()
    with graph.as_default():
        backend = MPIBackend(CommSpec(), 3)
        (part,) = backend.reduce_scatter_sum([tf.zeros([10])])
        (whole,) = backend.allgather_shards([part], [10])
    assert part.shape.as_list() == [4] and whole.shape.as_list() == [10]  # ceil(10 / 3) each
    assert [op.name for op in py_funcs(graph)] == ["reducescatter_0", "allgather_shards_0"]


def test_a_sharded_tensor_needs_a_static_length():
    graph = tf.Graph()
    with graph.as_default():
        unknown = tf.compat.v1.placeholder(tf.float32, [None], name="grad")
        with pytest.raises(ValueError, match=r"^a sharded tensor needs a static length, grad:0 has shape \(None,\)"):
            MPIBackend(CommSpec(), 2).reduce_scatter_sum([unknown])


# -- the sparse calls' buffers --------------------------------------------------------------------------------------- #


def test_each_piece_of_a_members_sparse_buffer_starts_at_a_multiple_of_8_bytes():
    # member 0: 1 row of 3-byte values and 4-byte indices, then 2 rows of 5 and 2; member 1: no rows at all
    offsets, words = packed_layout(np.array([[1, 2], [0, 0]]), [(3, 4), (5, 2)])
    assert offsets == [[(0, 8), (16, 32)], [(0, 0), (0, 0)]]
    assert words == [5, 0]


# -- what the calls do at run time, over two members that hold the same buffers ----------------------------------- #


class _Op:
    def __init__(self, function):
        self.function = function


FAKE_MPI = types.SimpleNamespace(IN_PLACE="IN_PLACE", SUM="SUM", MAX="MAX",
                                 Op=types.SimpleNamespace(Create=lambda function, commute: _Op(function)))


class TwoAlike:
    """An mpi4py communicator of 2 members, as member ``rank`` sees it, where the other member holds the same
    buffers as this one (so a sum is twice the buffer, a gather the buffer twice); records each call's
    ``(name, bytes)``."""

    size = 2

    def __init__(self, rank: int = 0, other_spin: float = -1.0):
        self.rank = rank
        self.other_spin = other_spin
        self.calls: list[tuple[str, int]] = []

    def Dup(self):
        return self

    def allreduce(self, value, op):
        assert op == "MAX"
        return max(value, self.other_spin)

    def Allreduce(self, in_place, buffer, op):
        assert in_place == "IN_PLACE"
        self.calls.append(("Allreduce" if op == "SUM" else "Allreduce(16-bit sum)", buffer.nbytes))
        if op == "SUM":
            buffer[...] = buffer + buffer
        else:
            op.function(buffer.copy(), buffer, None)

    def Allgather(self, send, received):
        self.calls.append(("Allgather", send.nbytes))
        received.reshape(self.size, -1)[...] = send.reshape(1, -1)

    def Gather(self, send, received, root):
        self.calls.append(("Gather", send.nbytes))
        if self.rank == root:
            received.reshape(self.size, -1)[...] = send.reshape(1, -1)

    def Allgatherv(self, send, received):
        self.calls.append(("Allgatherv", send.nbytes))
        whole, counts = received
        at = 0
        for n in counts:
            whole[at:at + n] = send[:n]
            at += n

    def Gatherv(self, send, received, root):
        self.calls.append(("Gatherv", send.nbytes))
        if self.rank == root:
            self.Allgatherv(send, received)
            self.calls.pop()

    def Reduce_scatter(self, send, received, recvcounts, op):
        part, n = received
        start = sum(recvcounts[:self.rank])
        part[:n] = 2 * send[start:start + n]


@pytest.fixture
def fake_mpi(monkeypatch):
    """mpi4py's MPI module as the functions use it (no MPI is initialised in this process); the 16-bit sums it
    creates kept apart from those of a real MPI."""
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=FAKE_MPI))
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", FAKE_MPI)
    monkeypatch.setattr(mpi_calls, "_SIXTEEN_BIT_SUMS", {})


def test_small_buffers_are_summed_together_large_ones_in_place_in_pieces(fake_mpi):
    comm = TwoAlike()
    small = [np.array([1.0, 2.0, 3.0], np.float32), np.array([[4.0]], np.float32)]
    large = np.arange(600_000, dtype=np.float32)  # 2.4 MB: over FUSE_BELOW_BYTES and CHUNK_BYTES
    others = [np.float32(5.0), np.int64(7), np.array([0.5, -1.5], np.float16)]
    expected_large = 2 * large
    out = _functions(comm)[_ALLREDUCE](*small, large, *others)
    np.testing.assert_array_equal(out[0], [2.0, 4.0, 6.0])
    np.testing.assert_array_equal(out[1], [[8.0]])
    assert out[2] is large  # summed where it is: TensorFlow takes the buffer back without a copy
    np.testing.assert_array_equal(out[2], expected_large)
    assert out[3] == 10.0 and out[3].shape == () and out[4] == 14 and out[4].dtype == np.int64
    assert out[5].dtype == np.float16 and out[5].tolist() == [1.0, -3.0]
    assert comm.calls == [
        ("Allreduce", 192),  # the two small float32 ones and the float32 scalar, each at a multiple of 64 bytes
        ("Allreduce", CHUNK_BYTES), ("Allreduce", large.nbytes - CHUNK_BYTES),  # the large one in two pieces
        ("Allreduce", 8),  # the int64 scalar: not the fused buffer's dtype
        ("Allreduce(16-bit sum)", 4)]  # float16 as 16-bit words, added in float32 and rounded back


@pytest.mark.parametrize("dtype, tiny", [("float16", 2.0 ** -12), ("bfloat16", 2.0 ** -9)])  # under half an ulp of 1
def test_16_bit_floats_travel_as_words_and_are_summed_as_floats_rounded_to_their_format(fake_mpi, dtype, tiny):
    """MPI has no type for them: it moves 16-bit words, and the sum it is given adds them as floats (in float32),
    then rounds to the format, as the compiled op does."""
    import ml_dtypes  # TensorFlow's own dependency: numpy's bfloat16

    fmt = np.dtype(getattr(ml_dtypes, dtype) if dtype == "bfloat16" else dtype)
    add = mpi_calls._sum_op(fmt)
    assert add is not FAKE_MPI.SUM and mpi_calls._sum_op(fmt) is add  # one operation a format, made once
    incoming, inout = np.array([0.5, 1.0, 3.0], fmt), np.array([1.5, tiny, -3.0], fmt)
    add.function(incoming.view(np.uint16), inout.view(np.uint16), None)
    expected = (np.array([0.5, 1.0, 3.0], np.float32) + np.array([1.5, tiny, -3.0], np.float32)).astype(fmt)
    assert inout.tolist() == expected.tolist() == [2.0, 1.0, 0.0]  # 1 + tiny rounds to 1
    assert mpi_calls._sum_op(np.dtype(np.float32)) == FAKE_MPI.SUM


@pytest.mark.parametrize("token, calls", [
    (_ALLGATHER, ["Allgather", "Allgather"]),
    (_ALLGATHERV, ["Allgather", "Allgatherv"]),
    (_GATHERV, ["Gather", "Gatherv"]),
])
def test_the_sparse_calls_give_every_members_rows_in_member_order_in_two_rounds(fake_mpi, token, calls):
    comm = TwoAlike()
    values = np.array([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]], np.float32)
    indices = np.array([7, 9], np.int64)
    empty_values, empty_indices = np.zeros((0, 2), np.float64), np.zeros([0], np.int32)
    out = _functions(comm)[token](values, indices, empty_values, empty_indices)
    np.testing.assert_array_equal(out[0], np.concatenate([values, values]))
    np.testing.assert_array_equal(out[1], [7, 9, 7, 9])
    assert (out[2].shape, out[2].dtype, out[3].shape, out[3].dtype) == ((0, 2), np.float64, (0,), np.int32)
    assert [name for name, _ in comm.calls] == calls  # the row counts, then every pair's rows in one buffer


def test_a_gather_to_the_first_member_leaves_the_others_without_rows(fake_mpi):
    comm = TwoAlike(rank=1)
    out = _functions(comm)[_GATHERV](np.ones([2, 3], np.float32), np.array([7, 9], np.int64))
    assert [a.shape for a in out] == [(0, 3), (0,)] and [a.dtype for a in out] == [np.float32, np.int64]


@pytest.mark.parametrize("rank, part", [(0, [0.0, 2.0, 4.0]), (1, [6.0, 8.0, 0.0])])
def test_a_reduce_scatter_gives_each_member_its_part_of_the_sum_padded_to_the_longest(fake_mpi, rank, part):
    summed = _functions(TwoAlike(rank))[_REDUCE_SCATTER](np.arange(5, dtype=np.float32))
    np.testing.assert_array_equal(summed, part)


def test_a_gather_of_shards_drops_the_padding(fake_mpi):
    whole = _functions(TwoAlike())[_ALLGATHER_SHARDS](np.array([1.0, 2.0, 3.0], np.float32), np.int64(5))
    np.testing.assert_array_equal(whole, [1.0, 2.0, 3.0, 1.0, 2.0])  # 3 of member 0's, 2 of member 1's


# -- binding a graph's calls to a process -------------------------------------------------------------------------- #


@pytest.mark.parametrize("mine, others, agreed", [(None, -1.0, None), (None, 0.002, 0.002), (0.001, 0.002, 0.002),
                                                  (0.003, 0.002, 0.003)])
def test_the_members_of_a_communicator_agree_on_the_longest_spin_any_asked_for(fake_mpi, mine, others, agreed):
    assert _agreed_spin(TwoAlike(other_spin=others), mine) == agreed


def _host_group_allgather():
    """The graph of one all-gather in the group ``host``, its calls finalised (tokens in place)."""
    graph = tf.Graph()
    with graph.as_default():
        backend = MPIBackend(CommSpec(), 2, group="host")
        backend.allgather([(tf.zeros([1, 2]), tf.zeros([1], tf.int64))])
    graph_def = graph.as_graph_def()
    backend.finalize_nodes(graph_def.node)
    return graph_def


def test_a_token_of_a_group_this_process_has_no_communicator_for_is_refused(fake_mpi):
    graph_def = _host_group_allgather()
    with pytest.raises(RuntimeError, match=rf"^no Parallax MPI function for token '{TOKEN_PREFIX}mpi_allgather@host' "
                                           r"\(groups bound: \[\]\)"):
        bind_py_functions(graph_def, comm=TwoAlike(), native_ops=False)


def test_bound_calls_point_at_this_processs_functions_until_released(fake_mpi):
    from tensorflow.python.ops import script_ops

    graph_def = _host_group_allgather()
    registry = script_ops._py_funcs
    before = registry.size()
    bound, release = bind_py_functions(graph_def, comm=TwoAlike(), groups={"host": TwoAlike()}, native_ops=False)
    (token,) = [n.attr["token"].s.decode() for n in bound.node if n.op == "PyFunc"]
    assert not token.startswith(TOKEN_PREFIX) and registry.size() == before + 12  # 6 calls for each communicator
    assert [n.attr["token"].s.decode() for n in graph_def.node if n.op == "PyFunc"] == [_ALLGATHER + "@host"]
    release()
    assert registry.size() == before


def test_a_job_of_several_workers_whose_process_has_a_world_of_one_is_refused(monkeypatch):
    """A task a cluster manager started (TF_CONFIG) has no workers' communicator and an MPI world of itself alone:
    sums over ``COMM_WORLD`` would be this worker's own, so binding refuses, naming the way out."""
    from parallax.comm.base import ProcessComms
    from parallax.errors import PlanError

    alone = types.SimpleNamespace(**vars(FAKE_MPI), COMM_WORLD=types.SimpleNamespace(Get_size=lambda: 1))
    monkeypatch.setitem(sys.modules, "mpi4py", types.SimpleNamespace(MPI=alone))
    monkeypatch.setitem(sys.modules, "mpi4py.MPI", alone)
    with pytest.raises(PlanError, match=r"over the job's 2 workers with MPI .* its MPI world has 1 process\(es\) .* "
                                        r"use run_option='MPI'"):
        MPIBackend.prepare(_host_group_allgather(), ProcessComms(num_workers=2))
