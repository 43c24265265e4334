"""parallax.fit's random draws made one device's (parallax/tf2/draws.py): in the traced step's graph, a stateless
draw of the part's rows is made for the whole batch and the part's rows of it are taken; a draw of another shape
is left as it is; a step without the part's marks is not rewritten."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from parallax.tf2.draws import PART_MARKS, exact_draws, mark_part

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
