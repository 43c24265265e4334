"""Each worker's share of a ``tf.data`` pipeline (parallax/tf2/input_split.py): in every epoch, the union of the
workers' blocks of each step is the global batch one device iterates, each block the rows ``parallax.fit`` gives
that worker (contiguous parts, the last short batch cut as ``block_parts`` pads it), the maps run on the worker's
examples alone; pipelines that cannot be divided are read whole, naming why."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from parallax.tf2.batch_parts import block_parts
from parallax.tf2.input_split import _fingerprint, share_of


@pytest.fixture(autouse=True)
def _no_global_seed():
    """No global seed while a test runs (an earlier test of the process may have set one, which would seed the
    pipelines meant to draw without a seed), and the earlier one again after it."""
    from tensorflow.python.framework import random_seed

    earlier = random_seed.get_seed(None)[0]
    tf.random.set_seed(None)
    yield
    tf.random.set_seed(earlier)


def _pipeline(examples: int, batch: int, drop: bool = False, mapped: tf.Variable | None = None,
              parallel: bool = True, unknown: bool = False) -> tf.data.Dataset:
    """A source, a seeded shuffle (a new order each epoch), two per-example maps (one counting), batch, prefetch;
    ``unknown``: a filter that keeps every example before the maps, so that the length is not known before
    iterating."""

    def parse(ids, label):
        if mapped is not None:
            mapped.assign_add(1)
        return {"ids": tf.cast(ids, tf.int32) * 2}, label

    ds = tf.data.Dataset.from_tensor_slices((np.arange(examples), np.arange(examples) % 3)).shuffle(examples, seed=3)
    if unknown:
        ds = ds.filter(lambda ids, label: ids >= 0)
    ds = ds.map(parse, num_parallel_calls=2 if parallel else None)
    return ds.map(lambda x, y: (x, tf.cast(y, tf.float32))).batch(batch, drop_remainder=drop).prefetch(2)


def _epochs(dataset: tf.data.Dataset, epochs: int = 2) -> list[list[list[int]]]:
    return [[(x["ids"].numpy() // 2).tolist() for x, _ in dataset] for _ in range(epochs)]


def _blocks(share: tf.data.Dataset, epochs: int = 2) -> list[list[tuple[list[int], int]]]:
    """Each epoch's ``(block's ids, examples of its global batch)``."""
    return [[((x["ids"].numpy() // 2).tolist(), int(n)) for (x, _), n in share] for _ in range(epochs)]


@pytest.mark.parametrize("unknown", [False, True], ids=["known length", "unknown length"])
@pytest.mark.parametrize("examples, batch, drop, workers, replicas", [
    (12, 4, False, 2, 1),   # even
    (11, 4, False, 2, 1),   # a last batch of 3: 2 and 1
    (11, 4, True, 2, 1),    # dropped
    (9, 4, False, 2, 2),    # a last batch of 1: worker 1's block empty
    (13, 4, False, 4, 1),   # three empty blocks in the last step
    (14, 6, False, 3, 1),   # 3 workers, a last batch of 2
    (3, 4, False, 2, 1),    # one short batch alone
])
def test_the_workers_blocks_are_the_global_batches_parts(examples, batch, drop, workers, replicas, unknown):
    one_device = _epochs(_pipeline(examples, batch, drop))
    blocks = []
    for worker in range(workers):
        mapped = tf.Variable(0, dtype=tf.int64)
        made = _pipeline(examples, batch, drop, mapped, parallel=worker % 2 == 0, unknown=unknown)
        share = share_of(made, workers, worker, replicas)
        assert not isinstance(share, str), share
        if unknown:
            assert share.steps is None and int(share.dataset.cardinality()) == tf.data.UNKNOWN_CARDINALITY
        else:
            assert int(share.dataset.cardinality()) == share.steps == len(one_device[0])
        got = _blocks(share.dataset)
        blocks.append(got)
        assert int(mapped.numpy()) == sum(len(b) for epoch in got for b, _ in epoch)  # its own examples alone
    for epoch, steps in enumerate(one_device):
        assert all(len(b[epoch]) == len(steps) for b in blocks)  # every worker a block at every step
        for step, batch_ids in enumerate(steps):
            m = len(batch_ids)
            size = -(-m // (workers * replicas))
            for worker in range(workers):
                start = worker * replicas * size
                got, examples_there = blocks[worker][epoch][step]
                assert examples_there == m
                # a block the short batch leaves empty: the batch's first example, as padding
                assert got == (batch_ids[start:start + replicas * size] or batch_ids[:1]), (epoch, step, worker)


def test_the_shares_of_tfrecord_files_are_the_global_batches_parts(tmp_path):
    """``TFRecordDataset`` files, parsed by a map (the usual reading of records): a length known only by reading
    them; each of 3 workers maps only its block's records, and each step's blocks are the parts of the batch one
    device reads, the short last one cut as it comes (13 records in batches of 6: 6, 6, 1)."""
    files = [str(tmp_path / f"part-{i}.tfrecord") for i in range(2)]
    for i, name in enumerate(files):
        with tf.io.TFRecordWriter(name) as writer:
            for value in range(i * 7, min(i * 7 + 7, 13)):
                feature = tf.train.Feature(int64_list=tf.train.Int64List(value=[value]))
                writer.write(tf.train.Example(features=tf.train.Features(feature={"v": feature})).SerializeToString())

    def pipeline(mapped=None):
        def parse(record):
            if mapped is not None:
                mapped.assign_add(1)
            return tf.io.parse_single_example(record, {"v": tf.io.FixedLenFeature([], tf.int64)})["v"]

        return tf.data.TFRecordDataset(files).map(parse, num_parallel_calls=2).batch(6)

    one_device = [b.numpy().tolist() for b in pipeline()]
    assert one_device == [list(range(6)), list(range(6, 12)), [12]]
    for worker in range(3):
        mapped = tf.Variable(0, dtype=tf.int64)
        share = share_of(pipeline(mapped), 3, worker, 1)
        assert not isinstance(share, str) and share.steps is None, share
        got = [(b.numpy().tolist(), int(n)) for b, n in share.dataset]
        assert got == [(one_device[0][2 * worker:2 * worker + 2], 6), (one_device[1][2 * worker:2 * worker + 2], 6),
                       ([12], 1)]  # the short batch: worker 0's example; the others its first, as padding
        assert int(mapped.numpy()) == 5


@pytest.mark.parametrize("flavor", ["keras", "tf_keras"])
def test_class_weights_weigh_each_block_as_the_whole_batch(flavor):
    """``fit(dataset, class_weight=...)``, each worker reading its share: the weights of its block's examples are
    those Keras gives them in the whole batch."""
    weights = {0: 0.5, 1: 2.0, 2: 3.0}
    whole = _fit_batches(_pipeline(11, 4), class_weight=weights, flavor=flavor)
    batches = [(b[1].tolist(), b[2].tolist()) for _, epoch in whole.epochs(0, 1) for b, _ in epoch]
    for worker in range(2):
        mine = _fit_batches(_pipeline(11, 4), class_weight=weights, flavor=flavor)
        mine.split(_Group(), 2, worker, 1)
        assert mine.share is not None
        blocks = [(b[1].tolist(), b[2].tolist(), n) for _, epoch in mine.epochs(0, 1) for b, n in epoch]
        for (y, w), (y_here, w_here, n) in zip(batches, blocks):
            size = -(-len(y) // 2)
            rows = slice(worker * size, worker * size + size) if worker * size < len(y) else slice(0, 1)
            assert (y_here, w_here, n) == (y[rows], w[rows], len(y))


def test_a_block_of_the_short_batch_pads_like_the_whole_batch():
    """Worker 1's block of a batch of 5 over 4 parts (2 workers, 2 replicas): one real example, then padding
    weighing 0; its real example's weight scaled as the whole batch's."""
    whole, size = block_parts((np.arange(5.0), np.arange(5.0), None), 5, 4, 4, 5)
    mine, size_here = block_parts((np.arange(4.0, 5.0), np.arange(4.0, 5.0), None), 5, 4, 2, 1)
    assert size == size_here == 2
    np.testing.assert_array_equal(mine[2], whole[2][4:])
    np.testing.assert_array_equal(mine[0][:1], whole[0][4:5])


@pytest.mark.parametrize("make, reason", [
    (lambda: tf.data.Dataset.range(8).map(lambda v: v + 1).padded_batch(4), "does not end in batch()"),
    (lambda: tf.data.Dataset.range(8).map(lambda v: v + 1).batch(4).map(lambda v: v - tf.reduce_min(v)),
     "a map() after its batch() may look across a batch's examples: Min (Min) takes the rows"),
    (lambda: tf.data.Dataset.range(8).batch(4), "no map() comes before or after"),
    (lambda: tf.data.Dataset.range(8).map(lambda v: v + 1).batch(3), "does not split into 2 equal parts"),
    (lambda: tf.data.Dataset.range(8).shuffle(8).map(lambda v: v + 1).batch(4), "shuffle without a seed"),
    (lambda: tf.data.Dataset.range(8).repeat().map(lambda v: v + 1).batch(4), "without end"),
])
def test_a_pipeline_that_cannot_be_divided_is_read_whole_naming_why(make, reason):
    said = share_of(make(), 2, 0, 1)
    assert isinstance(said, str) and reason in said, said


def test_a_map_that_draws_random_numbers_is_not_divided():
    """Its draws would follow each worker's examples: it stays before the split (with a seed), so the maps after
    it are divided; without a seed nothing is."""
    seeded = tf.data.Dataset.range(8).map(lambda v: v + tf.random.uniform([], 0, 2, tf.int64, seed=4))
    share = share_of(seeded.map(lambda v: v * 2).batch(4), 2, 0, 1)
    assert not isinstance(share, str)
    unseeded = tf.data.Dataset.range(8).map(lambda v: v + tf.random.uniform([], 0, 2, tf.int64))
    said = share_of(unseeded.batch(4), 2, 0, 1)
    assert isinstance(said, str) and "no map() comes before or after" in said
    said = share_of(unseeded.map(lambda v: v * 2).batch(4), 2, 0, 1)
    assert isinstance(said, str) and "without a seed (RandomUniformInt)" in said, said


@pytest.mark.parametrize("layer", ["RandomFlip", "GaussianNoise", "RandomRotation"])
def test_a_keras_random_layer_in_a_map_stays_whole_and_the_maps_after_it_are_divided(layer):
    """Keras 3's random layers draw with a seed that their ``SeedGenerator`` moves on at every call (stateless ops
    seeded by an input): mapped over a worker's examples alone, they would draw other numbers than one device
    (until 2026-12-07 such a map was divided, and the blocks differed from one device's rows). Kept before the
    split, with the maps after it divided, each worker's blocks are one device's rows."""
    import keras

    images = np.random.default_rng(0).random((10, 4, 4, 1)).astype(np.float32)

    def pipeline():
        made = {"RandomFlip": lambda: keras.layers.RandomFlip(seed=1),
                "GaussianNoise": lambda: keras.layers.GaussianNoise(0.5, seed=2),
                "RandomRotation": lambda: keras.layers.RandomRotation(0.2, seed=3)}[layer]()
        ds = tf.data.Dataset.from_tensor_slices(images).map(lambda x: made(x, training=True))
        return ds.map(lambda x: x * 2.0).batch(4)

    one_device = [b.numpy() for b in pipeline()]
    for worker in range(2):
        share = share_of(pipeline(), 2, worker, 1)
        assert not isinstance(share, str), share
        for (block, n), whole in zip(share.dataset, one_device):
            size = -(-len(whole) // 2)
            assert int(n) == len(whole)
            np.testing.assert_array_equal(block.numpy(), whole[worker * size:worker * size + size])
    noise = keras.layers.GaussianNoise(0.5, seed=2)
    after_batch = tf.data.Dataset.from_tensor_slices(images).batch(4).map(lambda x: noise(x, training=True))
    said = share_of(after_batch, 2, 0, 1)
    assert isinstance(said, str) and "draws random numbers" in said, said


def test_the_fingerprint_is_alike_in_processes_that_made_other_things_before():
    """What each worker hashes names no counter of the process: datasets, functions and resources made before
    (another epoch iterator, the chief's callbacks) number theirs differently on each worker."""

    def make():
        ds = tf.data.Dataset.from_tensor_slices(np.arange(10)).map(lambda v: v * 2).cache()
        return ds.shuffle(10, seed=1).filter(lambda v: v > 2)

    first = _fingerprint(make())
    for i in range(3):
        tf.function(lambda v, i=i: v + i).get_concrete_function(tf.constant(1))
        tf.data.Dataset.range(3).map(lambda v: v).cache().shuffle(3)
    assert _fingerprint(make()) == first
    assert _fingerprint(tf.data.Dataset.from_tensor_slices(np.arange(10)).shuffle(10, seed=2)) != \
        _fingerprint(tf.data.Dataset.from_tensor_slices(np.arange(10)).shuffle(10, seed=1))


def test_the_fingerprint_holds_the_values_of_the_variables_the_pipeline_reads():
    """A variable a map reads (a scale, a Keras ``SeedGenerator``'s state) is no part of the pipeline's graph: the
    fingerprint has its value, so workers whose values differ (a job whose processes are not seeded alike, a
    cluster manager's) are found, and read everything (the first-batch check judging), where each would otherwise
    map its block with its own value: here two pipelines alike but for the value of the scale they map with."""

    def make(value: float):
        scale = tf.Variable(value)
        return tf.data.Dataset.from_tensor_slices(np.ones((8, 2), np.float32)).map(lambda x: x * scale).batch(4)

    prints = [share_of(make(value), 2, 0, 1).fingerprint for value in (2.0, 2.0, 3.0)]
    assert prints[0] == prints[1] != prints[2]


class _Group:
    """Two workers whose pipelines hash alike (``differ``: not; ``other``: what the other worker says)."""

    def __init__(self, differ: bool = False, other: object = "same") -> None:
        self.differ, self.other = differ, other

    def gather(self, value):
        if self.other != "same":
            return [value, self.other]
        return [value, value + 1 if self.differ else value]


def _fit_batches(dataset: tf.data.Dataset, steps_per_epoch: int | None = None, class_weight: dict | None = None,
                 flavor: str = "keras"):
    import importlib

    from parallax.tf2.batches import FitBatches

    k = importlib.import_module(flavor)
    model = k.Sequential([k.layers.Input((1,)), k.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return FitBatches(flavor, model, dataset, None, None, None, steps_per_epoch, True, class_weight, 0, 2, 0)


def test_fit_reads_the_share_where_every_worker_made_the_same_pipeline_else_everything():
    """Worker 1 of 2: its blocks (of 11 examples in batches of 4: 2, 2 and 1 of the short one's 3), iterated as
    Keras's epoch iterator iterates them; the same pipeline hashed differently on another worker, or
    ``steps_per_epoch`` given: every batch whole, as before, said at INFO."""
    import logging

    from parallax.logs import log

    batches = _fit_batches(_pipeline(11, 4))
    batches.split(_Group(), 2, 1, 1)
    assert batches.share is not None and batches.steps == 3
    sizes = [[(len(b[1]), examples) for b, examples in epoch] for _, epoch in batches.epochs(0, 2)]
    assert sizes == [[(2, 4), (2, 4), (1, 3)]] * 2
    said: list[str] = []
    handler = logging.Handler(logging.INFO)  # the PARALLAX logger passes nothing on to pytest's caplog
    handler.emit = lambda record: said.append(record.getMessage())
    level = log.level
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    try:
        for group, steps, why in [(_Group(differ=True), None, "differs between the workers"),
                                  (_Group(other=None), None, "another worker could not divide it"),
                                  (_Group(), 3, "steps_per_epoch is given")]:
            whole = _fit_batches(_pipeline(11, 4), steps)
            whole.split(group, 2, 1, 1)
            assert whole.share is None
            assert why in said[-1] and "every worker reads the whole dataset" in said[-1]
            assert [(len(b[1]), n) for _, epoch in whole.epochs(0, 1) for b, n in epoch][:3] == [(4, None)] * 2 + [
                (3, None)]
    finally:
        log.removeHandler(handler)
        log.setLevel(level)


_TABLE = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(np.arange(40), np.arange(40) * 10), -1)
#: maps of whole batches (the ids and labels of the source below) that work row by row
_ROW_MAPS = {
    "cast and scale": lambda x, y: (tf.cast(x, tf.float32) / 255.0 - 0.5, y),
    "one-hot labels": lambda x, y: (x, tf.one_hot(y, 3)),
    "a table": lambda x, y: (_TABLE.lookup(x), y),
    "reshape, crop, stack": lambda x, y: (tf.stack([tf.reshape(x, [-1, 2, 2])[:, 1:, :], tf.ones([1, 1, 2], x.dtype)
                                                    * tf.reshape(x, [-1, 2, 2])[:, :1, :]], axis=1), y),
    "a dict, its size unused": lambda x, y: ({"x": x[..., ::2] + tf.shape(x, tf.int64)[-1],
                                              "n": tf.shape(x)[0]}["x"], y),
}


@pytest.mark.parametrize("unknown", [False, True], ids=["known length", "unknown length"])
@pytest.mark.parametrize("name", list(_ROW_MAPS))
def test_a_map_after_batch_that_works_row_by_row_maps_each_workers_rows_alone(name, unknown):
    """A map of whole batches (``ds.batch(B).map(f)``, as ``image_dataset_from_directory``'s users write): where
    ``f`` works row by row, each worker maps its block of each batch alone, and gets the rows one device's ``f``
    gives the whole batch (13 examples of 4 ids in batches of 6 over 3 workers: the short last batch padded)."""

    def pipeline(counted=None):
        ds = tf.data.Dataset.from_tensor_slices((np.arange(52).reshape(13, 4), np.arange(13) % 3))
        ds = ds.shuffle(13, seed=5)
        if unknown:
            ds = ds.filter(lambda x, y: y >= 0)

        def rows(x, y):  # counts the rows it maps
            if counted is not None:
                counted.assign_add(tf.cast(tf.shape(x)[0], tf.int64))
            return _ROW_MAPS[name](x, y)

        return ds.batch(6).map(rows, num_parallel_calls=2)

    one_device = [(x.numpy(), y.numpy()) for x, y in pipeline()]
    for worker in range(3):
        counted = tf.Variable(0, dtype=tf.int64)
        share = share_of(pipeline(counted), 3, worker, 1)
        assert not isinstance(share, str), share
        got = list(share.dataset)
        assert len(got) == len(one_device) == 3
        for ((x, y), n), (x_all, y_all) in zip(got, one_device):
            rows = slice(2 * worker, 2 * worker + 2) if 2 * worker < len(x_all) else slice(0, 1)
            assert int(n) == len(x_all)
            np.testing.assert_array_equal(x.numpy(), x_all[rows])
            np.testing.assert_array_equal(y.numpy(), y_all[rows])
        assert int(counted.numpy()) == 5  # 2 + 2 + 1 (worker 0's, or the padding)


@pytest.mark.parametrize("f, op", [
    (lambda x: x - tf.reduce_mean(x, axis=0), "Mean"),
    (lambda x: tf.reshape(x, [6, -1]), "Reshape"),
    (lambda x: x + tf.range(6, dtype=x.dtype)[:, None], "AddV2"),
    (lambda x: x * tf.cast(tf.shape(x)[0], x.dtype), "StridedSlice"),
    (lambda x: tf.concat([x, x[:1]], axis=0), "StridedSlice"),
    (lambda x: tf.transpose(x), "Transpose"),
    (lambda x: x[::2], "StridedSlice"),
    (lambda x: tf.squeeze(x), "Squeeze"),
    (lambda x: tf.math.cumsum(x, axis=0), "Cumsum"),
    (lambda x: tf.expand_dims(x, 0)[0], "ExpandDims"),
])
def test_a_map_after_batch_that_may_look_across_rows_is_not_divided_naming_the_op(f, op):
    ds = tf.data.Dataset.from_tensor_slices(np.arange(48).reshape(12, 4)).batch(6).map(f)
    said = share_of(ds, 2, 0, 1)
    assert isinstance(said, str) and said.startswith("a map() after its batch() may look across a batch's "
                                                     f"examples: {op} ("), said


def test_text_vectorized_after_batch_to_a_fixed_length_is_divided_and_to_the_longest_is_not():
    """keras-io's text classification: ``text_dataset_from_directory`` gives batches of strings, which
    ``.map(vectorize_text)`` (``TextVectorization`` of each batch, the text expanded to a column first) makes ids.
    With ``output_sequence_length`` each row is cut or padded alone: each worker vectorises its block alone and
    gets the rows of the whole batch's; without it the rows are padded to the batch's longest: read whole."""
    import keras

    words = [" ".join(f"w{(7 * i + j) % 23}" for j in range(1 + i % 9)) for i in range(26)]

    def pipeline(layer):
        def vectorize_text(text, label):
            return layer(tf.expand_dims(text, -1)), label

        ds = tf.data.Dataset.from_tensor_slices((words, np.arange(26) % 2)).shuffle(26, seed=1).batch(8)
        # text_dataset_from_directory's prefetch, then the example's map, cache and prefetch
        return ds.prefetch(tf.data.AUTOTUNE).map(vectorize_text).cache().prefetch(10)

    fixed = keras.layers.TextVectorization(max_tokens=30, output_sequence_length=6)
    fixed.adapt(words)
    one_device = [x.numpy() for x, _ in pipeline(fixed)]
    for worker in range(2):
        share = share_of(pipeline(fixed), 2, worker, 1)
        assert not isinstance(share, str), share
        for ((x, _), n), whole in zip(share.dataset, one_device):
            size = -(-len(whole) // 2)  # the last batch of 2: one row each
            rows = slice(size * worker, size * worker + size)
            assert int(n) == len(whole)
            np.testing.assert_array_equal(x.numpy(), whole[rows])
    longest = keras.layers.TextVectorization(max_tokens=30)
    longest.adapt(words)
    said = share_of(pipeline(longest), 2, 0, 1)
    assert isinstance(said, str) and "pads each row to the batch's longest" in said, said
