"""A traced step's tf.cond that writes variables, lowered into the graph (parallax/tf2/conds.py): no functional If
is left, the lowered graph computes what the function computes on either branch (nested conditionals too), and
a conditional that writes nothing is left as it is."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.errors import AnalysisError
from parallax.tf2.conds import lower_conds
from parallax.tf2.trace import trace_step


def conditional_step():
    """A step that adds ``x`` to ``v`` when ``flag`` holds, else subtracts it from ``w`` and, within that branch,
    doubles ``w`` when ``x`` is large (a nested conditional); it returns the conditional's output and ``v``."""
    v = tf.Variable(1.0, name="v")
    w = tf.Variable(10.0, name="w")

    def otherwise(x):
        w.assign_sub(x)
        tf.cond(x > 5.0, lambda: w.assign(w * 2.0), lambda: w.assign(w))
        return x * 3.0

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.bool)])
    def step(x, flag):
        out = tf.cond(flag, lambda: v.assign_add(x) * 1.0, lambda: otherwise(x))
        return out, v.read_value()

    return step, v, w


@pytest.mark.parametrize("calls", [[(2.0, True)], [(2.0, False)], [(7.0, False), (1.0, True), (6.0, False)]],
                         ids=["then", "else", "both-and-nested"])
def test_the_lowered_step_computes_what_the_eager_step_computes(calls):
    step, v, w = conditional_step()
    traced = trace_step(step)
    assert not [op for op in traced.graph.get_operations() if op.type in ("If", "StatelessIf")]
    with tf.compat.v1.Session(graph=traced.graph) as sess:
        sess.run(tf.compat.v1.variables_initializer(traced.graph.get_collection("variables")))
        got = [sess.run([traced.outputs, traced.train_op], dict(zip(traced.inputs, call)))[0] for call in calls]
        variables = {var.op.name: var for var in traced.graph.get_collection("variables")}
        trained = sess.run([variables["v"], variables["w"]])
    want = [tuple(float(t) for t in step(*call)) for call in calls]
    np.testing.assert_allclose(np.array(got, dtype=np.float64), np.array(want), rtol=1e-6)
    np.testing.assert_allclose(trained, [v.numpy(), w.numpy()], rtol=1e-6)


def test_lowering_keeps_its_input_and_says_which_tensor_stands_for_each_output():
    step, _, _ = conditional_step()
    graph_def = step.get_concrete_function().graph.as_graph_def()
    before = graph_def.SerializeToString(deterministic=True)
    lowered, outputs = lower_conds(graph_def)
    assert graph_def.SerializeToString(deterministic=True) == before
    names = {n.name: n for n in lowered.node}
    (cond,) = [n.name for n in graph_def.node if n.op in ("If", "StatelessIf")]
    assert names[cond].op == "NoOp" and outputs[f"{cond}:0"] == f"{cond}/output_0:0"
    assert (names[f"{cond}/pred"].op, names[f"{cond}/branch_executed"].op) == ("Switch", "Merge")
    assert not [n for n in lowered.node if n.op in ("If", "StatelessIf")]  # the nested one too


def test_a_cond_that_writes_no_variable_is_left_as_it_is():
    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def pure(x):
        return tf.cond(x > 0.0, lambda: x * 2.0, lambda: x - 1.0)

    graph_def = pure.get_concrete_function().graph.as_graph_def()
    lowered, outputs = lower_conds(graph_def)
    assert outputs == {} and [n.op for n in lowered.node] == [n.op for n in graph_def.node]


def test_a_trainable_variable_written_by_a_nested_function_inside_a_cond_is_still_refused():
    w = tf.Variable(1.0, name="w")

    @tf.function(autograph=False)
    def descend(g):
        w.assign_sub(0.1 * g)

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def step(x):
        with tf.GradientTape() as tape:
            loss = w * x
        grad = tape.gradient(loss, w)
        tf.cond(tf.math.is_finite(grad), lambda: descend(grad) or tf.constant(0), lambda: tf.constant(0))
        return loss

    traced = trace_step(step)
    assert not [op for op in traced.graph.get_operations() if op.type in ("If", "StatelessIf")]
    with pytest.raises(AnalysisError, match=r'^the trainable variable "w" is written inside StatefulPartitionedCall '
                                            r'"cond/then/'):
        analyse_graph(traced.graph)
