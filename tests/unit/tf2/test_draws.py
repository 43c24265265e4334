"""Random draws made one device's (parallax/tf2/draws.py): in the traced step's graph, a stateless draw (or a seeded
stateful one) of the part's rows is made for the whole batch and the part's rows of it are taken; a draw of another
shape is left as it is; a custom loop's step is marked from its batch's rows and the replica's index, which each
replica's copy sets; a step without draws is not marked."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from parallax.tf2.draws import PART_MARKS, exact_draws, mark_part, mark_replica_parts

SEED = tf.constant([3, 4], tf.int64)


def _step_def(marked: bool):
    """A step's graph: a part ``x`` whose every value gets a uniform draw of its shape (as a dropout mask), and a
    draw of a shape of its own (``[5]``)."""

    def step(x, examples, start):
        if marked:
            mark_part(examples, start, tf.shape(x)[0])
        mask = tf.random.stateless_uniform(tf.shape(x), seed=SEED)
        own = tf.random.stateless_uniform([5], seed=SEED)
        return tf.identity(x * mask, name="masked"), tf.identity(own, name="own")

    concrete = tf.function(step).get_concrete_function(tf.TensorSpec([None, 3], tf.float32),
                                                       tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32))
    return concrete.graph.as_graph_def(), [t.op.name for t in concrete.inputs]


def _run(graph_def, inputs, x, examples, start):
    with tf.Graph().as_default() as graph:
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            feeds = {f"{name}:0": value for name, value in zip(inputs, (x, np.float32(examples), np.int32(start)))}
            return session.run(["masked:0", "own:0"], feeds)


def test_a_parts_draw_is_its_rows_of_the_whole_batchs_and_another_draw_is_one_devices():
    graph_def, inputs = _step_def(marked=True)
    rewritten = exact_draws(graph_def)
    assert len(rewritten) == 4  # two draws, each with the op that makes its key from the seed
    whole = tf.random.stateless_uniform([7, 3], seed=SEED).numpy()
    for start, rows in ((0, 4), (4, 3), (6, 1)):  # the parts of a batch of 7, the last of them uneven
        masked, own = _run(graph_def, inputs, np.ones((rows, 3), np.float32), 7, start)
        np.testing.assert_array_equal(masked, whole[start:start + rows])
        np.testing.assert_array_equal(own, tf.random.stateless_uniform([5], seed=SEED).numpy())
    masked, _ = _run(graph_def, inputs, np.ones((1, 3), np.float32), 7, 8)  # a part of padding only: past the end
    assert masked.shape == (1, 3)


def test_a_step_without_the_parts_marks_is_left_as_it_is():
    graph_def, inputs = _step_def(marked=False)
    before = graph_def.SerializeToString()
    assert exact_draws(graph_def) == [] and graph_def.SerializeToString() == before
    assert not any(mark in {n.name for n in graph_def.node} for mark in PART_MARKS)


def _loop_def(stateful: bool):
    """A custom loop's step (no marks of its own): a part ``x`` masked by a draw of its shape (a seeded
    ``tf.random.uniform``, a stateful kernel, or a stateless draw)."""

    def step(x):
        draw = tf.random.uniform(tf.shape(x), seed=5) if stateful else tf.random.stateless_uniform(tf.shape(x), SEED)
        return tf.identity(x * draw, name="masked")

    concrete = tf.function(step).get_concrete_function(tf.TensorSpec([None, 3], tf.float32))
    return concrete.graph.as_graph_def(), concrete.inputs[0].op.name


def _set(graph_def, name: str, value: int) -> None:
    node = next(n for n in graph_def.node if n.name == name)
    node.attr["value"].tensor.int_val[:] = [value]


def test_a_loops_part_is_marked_by_the_replicas_index_and_takes_its_rows_of_one_devices_draw():
    graph_def, batch = _loop_def(stateful=False)
    index, count, given = mark_replica_parts(graph_def, batch)
    assert len(exact_draws(graph_def)) == 2
    whole = tf.random.stateless_uniform([6, 3], seed=SEED).numpy()
    for replica in range(3):  # 3 replicas of 2 examples each: the replica's copy sets its index and the count
        part = type(graph_def)()
        part.CopyFrom(graph_def)
        _set(part, index, replica)
        _set(part, count, 3)
        with tf.Graph().as_default() as graph:
            tf.graph_util.import_graph_def(part, name="")
            with tf.compat.v1.Session(graph=graph) as session:
                masked = session.run("masked:0", {f"{batch}:0": np.ones((2, 3), np.float32), f"{given}:0": 2})
        np.testing.assert_array_equal(masked, whole[2 * replica:2 * replica + 2])


def test_a_seeded_stateful_draw_is_drawn_whole_so_that_its_kernel_advances_as_one_devices():
    graph_def, batch = _loop_def(stateful=True)
    alone_def = _loop_def(stateful=True)[0]  # traced here, as the other (in a graph's scope its seeds would differ)
    index, count, given = mark_replica_parts(graph_def, batch)
    assert len(exact_draws(graph_def)) == 1  # the draw (its seed is an attribute: no key op)
    with tf.Graph().as_default() as graph:  # one device: two steps of 4 examples
        tf.graph_util.import_graph_def(alone_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            alone = [session.run("masked:0", {f"{batch}:0": np.ones((4, 3), np.float32)}) for _ in range(2)]
    _set(graph_def, index, 1)
    _set(graph_def, count, 2)
    with tf.Graph().as_default() as graph:  # the second of two replicas: its rows of each step's draw
        tf.graph_util.import_graph_def(graph_def, name="")
        with tf.compat.v1.Session(graph=graph) as session:
            for step in range(2):
                masked = session.run("masked:0", {f"{batch}:0": np.ones((2, 3), np.float32), f"{given}:0": 2})
                np.testing.assert_array_equal(masked, alone[step][2:])


def test_a_loop_without_draws_is_not_marked():
    concrete = tf.function(lambda x: tf.identity(x * 2.0, name="doubled")).get_concrete_function(
        tf.TensorSpec([None, 3], tf.float32))
    graph_def = concrete.graph.as_graph_def()
    before = graph_def.SerializeToString()
    assert mark_replica_parts(graph_def, concrete.inputs[0].op.name) is None
    assert graph_def.SerializeToString() == before
