"""A traced step's read of a variable it has just assigned reads the value assigned (parallax/tf2/state_reads.py):
a Keras 3 SeedGenerator drawn from twice in one step (one Dropout layer called on two batches) reads its state
again after advancing it; nothing the step computes then waits for that write."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

from parallax.graph.graph_ops import node_map, parse_input
from parallax.tf2.state_reads import read_assigned_values
from parallax.tf2.trace import trace_step


def test_a_read_after_the_steps_own_assign_is_the_value_assigned_and_waits_for_no_write():
    state = tf.Variable([1, 2], dtype=tf.int64)

    @tf.function
    def step():
        state.assign(state + 1)
        return tf.identity(state.read_value() * 10, name="second")

    concrete = step.get_concrete_function()
    graph_def = concrete.graph.as_graph_def()
    made = read_assigned_values(graph_def, {op.name for op in concrete.graph.control_outputs}, set())
    nodes = node_map(graph_def)
    assert len(made) == 1 and nodes[made[0]].op == "Identity"
    assert not any(nodes[parse_input(t)[0]].op == "AssignVariableOp" for t in nodes[made[0]].input if t[0] == "^")


def test_a_write_that_runs_only_for_the_read_after_it_is_left_as_it_is():
    # as an update in a conditional's branch, which assigns a momentum and adds it to its variable: the branch's
    # writes are no side effects of the function of their own (the conditional is; lowered, the write would run
    # only for the read after it), so the read keeps waiting for the write
    state = tf.Variable([1.0, 2.0])

    @tf.function
    def step():
        state.assign(state + 1.0)
        return tf.identity(state.read_value(), name="read")

    concrete = step.get_concrete_function()
    graph_def = concrete.graph.as_graph_def()
    before = graph_def.SerializeToString()
    assert read_assigned_values(graph_def, set(), set()) == [] and graph_def.SerializeToString() == before


def test_a_dropout_layer_called_twice_in_a_traced_step_draws_what_the_eager_step_draws():
    import keras

    def build():
        keras.utils.set_random_seed(3)
        dropout = keras.layers.Dropout(0.5)

        @tf.function(input_signature=[tf.TensorSpec([None, 6])])
        def step(x):
            return dropout(x, training=True) + 10.0 * dropout(x, training=True)

        return step, dropout

    x = np.ones((4, 6), np.float32)
    step, _ = build()
    eager = [step(x).numpy() for _ in range(2)]
    step, dropout = build()
    traced = trace_step(step)
    assert not any(op.type == "ReadVariableOp" and any(c.type == "AssignVariableOp" for c in op.control_inputs)
                   for op in traced.graph.get_operations())
    with tf.compat.v1.Session(graph=traced.graph) as session:
        session.run(tf.compat.v1.variables_initializer(traced.graph.get_collection("variables")))
        feeds = {traced.inputs[0]: x, traced.part_rows: 4}  # one device: the part is the batch
        got = [session.run([traced.outputs, traced.train_op], feeds)[0] for _ in range(2)]
    np.testing.assert_array_equal(got, eager)


def test_a_value_computed_from_the_batch_is_read_back_from_the_variable():
    # a metric's total every replica adds to (an optimizer's momentum too): the read stays a read of the variable
    total = tf.Variable(0.0)

    @tf.function
    def step(x):
        total.assign(total + tf.reduce_sum(x))
        return tf.identity(total.read_value(), name="read")

    concrete = step.get_concrete_function(tf.TensorSpec([None], tf.float32))
    graph_def = concrete.graph.as_graph_def()
    effects = {op.name for op in concrete.graph.control_outputs}
    assert read_assigned_values(graph_def, effects, {concrete.inputs[0].op.name}) == []
    assert len(read_assigned_values(graph_def, effects, set())) == 1  # as if x were no argument
