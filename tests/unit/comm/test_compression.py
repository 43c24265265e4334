"""16-bit gradients on the wire (parallax/comm/compression.py), in one process: what travels in which dtype, the
fp16 scales (powers of two that keep every sum at or below 2**15), and the values that arrive, over hand-written
collectives of two workers that hold the same tensors (their sums are the real backends', tested in
tests/multiprocess/test_compression.py)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from parallax.comm.compression import (
    FP16_CEILING_EXPONENT,
    UNIT_ROUNDOFF,
    WIRE_DTYPES,
    agreed_scales,
    compress,
    compressed_allgather,
    compressed_allreduce,
    compressible,
    decompress,
    for_push,
    local_scale,
)
from parallax.config import BF16, COMPRESSED_FORMATS, FP16, NO_COMPRESSION


def evaluate(build):
    """What ``build()`` (run inside a fresh graph, as the rewrite runs these functions) evaluates to."""
    graph = tf.Graph()
    with graph.as_default():
        out = build()
        with tf.compat.v1.Session(graph=graph) as sess:
            return sess.run(out)


class TwoWorkers:
    """An all-reduce and an all-gather of two workers that hold the same tensors; records the dtypes each call
    was given."""

    def __init__(self):
        self.sent: list[list[tf.DType]] = []

    def allreduce_sum(self, tensors):
        self.sent.append([t.dtype for t in tensors])
        return [t + t for t in tensors]  # summed in the dtype it travels in

    def allgather(self, pairs):
        self.sent.append([t.dtype for pair in pairs for t in pair])
        return [(tf.concat([v, v], 0), tf.concat([i, i], 0)) for v, i in pairs]


def test_the_formats_are_the_configs_and_each_rounds_to_its_own_unit_roundoff():
    assert set(WIRE_DTYPES) == set(COMPRESSED_FORMATS) == {FP16, BF16}
    assert (WIRE_DTYPES[FP16], WIRE_DTYPES[BF16]) == (tf.float16, tf.bfloat16)
    assert UNIT_ROUNDOFF == {FP16: 2.0 ** -11, BF16: 2.0 ** -8}


@pytest.mark.parametrize("dtype, travels_compressed", [
    (tf.float32, True), (tf.float64, True), (tf.float16, False), (tf.bfloat16, False), (tf.int32, False),
    (tf.int64, False)])
def test_float32_and_float64_travel_in_16_bits_every_other_dtype_as_it_is(dtype, travels_compressed):
    assert compressible(dtype) == travels_compressed


def test_compress_casts_floats_to_the_format_and_leaves_other_tensors_alone():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant([1.0, 2.0])
        ids = tf.constant([3, 4], tf.int64)
        assert compress(x, BF16).dtype == tf.bfloat16 and compress(x, FP16).dtype == tf.float16
        assert compress(ids, FP16) is ids
        back = tf.constant([1.0], tf.float16)
        assert decompress(back, tf.float16) is back  # nothing was compressed: nothing to undo


def test_decompress_undoes_compress_with_its_scale():
    scaled = evaluate(lambda: decompress(compress(tf.constant([0.75, -3.0]), FP16, tf.constant(8.0)), tf.float32,
                                         tf.constant(8.0)))
    np.testing.assert_array_equal(scaled, [0.75, -3.0])  # exact: the values and the scale are powers of two apart


@pytest.mark.parametrize("bound, scale", [
    (3.0, 2.0 ** (FP16_CEILING_EXPONENT - 2)),  # ceil(log2 3) = 2
    (5.0, 2.0 ** (FP16_CEILING_EXPONENT - 3)),
    (0.3, 2.0 ** (FP16_CEILING_EXPONENT + 1)),  # ceil(log2 0.3) = -1
    (1e5, 2.0 ** (FP16_CEILING_EXPONENT - 17)),  # a value above float16's largest (65504) is scaled down
    (1e-35, 2.0 ** 100),  # the exponent is kept within +-100
    (0.0, 1.0), (np.inf, 1.0), (np.nan, 1.0),  # nothing to scale, or an infinite or NaN gradient that stays so
])
def test_a_tensor_sent_alone_is_scaled_by_a_power_of_two_that_puts_its_largest_value_at_most_2_to_the_15(bound,
                                                                                                         scale):
    assert evaluate(lambda: local_scale(tf.constant([bound, -bound / 2], tf.float32))) == scale


def test_an_empty_tensor_has_the_scale_1():
    assert evaluate(lambda: local_scale(tf.zeros([0, 4]))) == 1.0


def test_the_workers_agree_on_scales_from_the_sum_of_their_largest_magnitudes():
    workers = TwoWorkers()
    scales = evaluate(lambda: agreed_scales([tf.constant([1.0, -3.0]), tf.constant([[0.3]], tf.float64)],
                                            workers.allreduce_sum))
    # the sums over the two workers: 6 and 0.6, so 2**(15 - 3) and 2**(15 - 0)
    np.testing.assert_array_equal(scales, [2.0 ** 12, 2.0 ** 15])
    assert workers.sent == [[tf.float32]]  # one call: a float32 vector, one element per tensor


@pytest.mark.parametrize("fmt", [NO_COMPRESSION, FP16, BF16])
def test_a_push_to_a_server_carries_its_own_scale_in_fp16_alone(fmt):
    graph = tf.Graph()
    with graph.as_default():
        x = tf.constant([1.5, -2.0])
        sent, scale = for_push(x, fmt)
        ids = tf.constant([1, 2])
        assert for_push(ids, fmt) == (ids, None)
    if fmt == NO_COMPRESSION:
        assert (sent, scale) == (x, None)
        return
    assert sent.dtype == WIRE_DTYPES[fmt] and (scale is None) == (fmt == BF16)
    with graph.as_default(), tf.compat.v1.Session(graph=graph) as sess:
        np.testing.assert_array_equal(sess.run(decompress(sent, tf.float32, scale)), [1.5, -2.0])


@pytest.mark.parametrize("value", [1e-8, 1e5])
def test_fp16_pushes_keep_gradients_float16_cannot_hold_as_they_are(value):
    """Unscaled, 1e-8 is zero in float16 and 1e5 infinite; scaled, each arrives within fp16's rounding."""
    plain = evaluate(lambda: tf.cast(tf.cast(tf.constant([value]), tf.float16), tf.float32))[0]
    assert plain == 0.0 or np.isinf(plain)

    def pushed():
        sent, scale = for_push(tf.constant([value]), FP16)
        return decompress(sent, tf.float32, scale)

    assert evaluate(pushed)[0] == pytest.approx(value, rel=UNIT_ROUNDOFF[FP16])


def test_without_a_format_the_all_reduce_is_the_backends_alone():
    workers = TwoWorkers()
    summed = evaluate(lambda: compressed_allreduce([tf.constant([1.0, 2.0])], NO_COMPRESSION, workers.allreduce_sum))
    np.testing.assert_array_equal(summed[0], [2.0, 4.0])
    assert workers.sent == [[tf.float32]]


def test_bf16_all_reduces_floats_in_bfloat16_and_gives_each_sum_back_in_its_dtype():
    workers = TwoWorkers()
    tensors = lambda: [tf.constant([1.0, -0.3]), tf.constant([7, 8], tf.int32), tf.constant([0.1], tf.float64)]  # noqa: E731
    out = evaluate(lambda: compressed_allreduce(tensors(), BF16, workers.allreduce_sum))
    assert workers.sent == [[tf.bfloat16, tf.int32, tf.bfloat16]]  # no scales to agree on
    assert [o.dtype for o in out] == [np.float32, np.int32, np.float64]
    np.testing.assert_allclose(out[0], [2.0, -0.6], rtol=2 * UNIT_ROUNDOFF[BF16])
    np.testing.assert_array_equal(out[1], [14, 16])
    np.testing.assert_allclose(out[2], [0.2], rtol=2 * UNIT_ROUNDOFF[BF16])


def test_fp16_agrees_on_the_scales_first_then_sums_values_float16_alone_would_lose():
    workers = TwoWorkers()
    values = [[3e-8, -1e-8], [6e4, 1.0]]  # too small for float16; and a sum (1.2e5) above its largest value
    out = evaluate(lambda: compressed_allreduce([tf.constant(v) for v in values] + [tf.constant([5], tf.int64)],
                                                FP16, workers.allreduce_sum))
    assert workers.sent == [[tf.float32], [tf.float16, tf.float16, tf.int64]]  # the scales, then the tensors
    for got, sent in zip(out[:2], values):
        assert got.dtype == np.float32 and np.all(np.isfinite(got))
        np.testing.assert_allclose(got, 2 * np.array(sent, np.float32), rtol=2 * UNIT_ROUNDOFF[FP16])
    np.testing.assert_array_equal(out[2], [10])


def test_an_all_gather_sends_values_in_16_bits_and_indices_as_they_are():
    workers = TwoWorkers()

    def gathered():
        pairs = [(tf.constant([[0.5, 1e-7]]), tf.constant([4], tf.int64)), (tf.constant([[2, 3]]), tf.constant([1]))]
        return compressed_allgather(pairs, FP16, workers.allgather, workers.allreduce_sum)

    (values, ids), (ints, int_ids) = evaluate(gathered)
    # the scale of the float values agreed first (over their one tensor), then one gather of every pair
    assert workers.sent == [[tf.float32], [tf.float16, tf.int64, tf.int32, tf.int32]]
    assert values.dtype == np.float32
    np.testing.assert_allclose(values, [[0.5, 1e-7]] * 2, rtol=UNIT_ROUNDOFF[FP16])
    np.testing.assert_array_equal(ids, [4, 4])
    np.testing.assert_array_equal(ints, [[2, 3]] * 2)
    np.testing.assert_array_equal(int_ids, [1, 1])


@pytest.mark.parametrize("fmt", [NO_COMPRESSION, BF16])
def test_an_all_gather_without_fp16_agrees_on_nothing(fmt):
    workers = TwoWorkers()
    pair = lambda: [(tf.constant([[0.5]]), tf.constant([4], tf.int64))]  # noqa: E731
    values, ids = evaluate(lambda: compressed_allgather(pair(), fmt, workers.allgather, workers.allreduce_sum))[0]
    assert workers.sent == [[WIRE_DTYPES.get(fmt, tf.float32), tf.int64]]
    np.testing.assert_array_equal(values, [[0.5], [0.5]])
