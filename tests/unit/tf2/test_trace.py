"""A tf.function training step traced into a single-device graph (parallax/tf2/trace.py, regions.py): the
graph trains as the eager step does, and the analysis reads its variables, slots, gradients and training op;
what cannot be traced or synchronised is refused with the reason."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest
import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.errors import AnalysisError
from parallax.plan.policies import choose_sync
from parallax.tf2.trace import STEP_OP, trace_step
from tests.tf2.programs import MIXED, MORE_OPTIMIZERS, PLAIN, batches, build, eager


def run_traced(traced, steps: int) -> list[float]:
    with tf.compat.v1.Session(graph=traced.graph) as sess:
        sess.run(tf.compat.v1.variables_initializer(traced.graph.get_collection("variables")))
        rows = {} if traced.part_rows is None else {traced.part_rows: len(batches(1)[0][0])}  # one device's part
        return [float(sess.run([traced.outputs, traced.train_op], {**dict(zip(traced.inputs, batch)), **rows})[0])
                for batch in batches(steps)]


@pytest.mark.parametrize("case", [c for c in (*PLAIN, *MORE_OPTIMIZERS) if not c.startswith("tfkeras")])
def test_the_traced_graph_trains_as_the_eager_step(case):
    losses, _ = eager(case, 3)
    step, _ = build(case)
    np.testing.assert_allclose(run_traced(trace_step(step), 3), losses, rtol=1e-6)


@pytest.mark.parametrize("case, slots_per_variable", [("module-v1-adam", 2), ("keras3-adam", 2), ("keras3-sgd", 1)])
def test_the_analysis_finds_every_gradient_its_slots_and_the_step(case, slots_per_variable):
    step, variables = build(case)
    traced = trace_step(step)
    analysis = analyse_graph(traced.graph)
    trainable = {v.name for v in analysis.variables if v.trainable}
    assert {g.variable for g in analysis.gradients} == trainable and len(trainable) == len(variables())
    embeddings = [g for g in analysis.gradients if g.sparse]
    assert len(embeddings) == 1  # the embedding's gradient stays sparse (values, indices)
    for name in trainable:
        assert len([v for v in analysis.variables if v.slot_of == name]) == slots_per_variable, name
    assert analysis.train_ops == (STEP_OP,)


def test_a_traced_tf1_optimizers_update_scopes_are_named_after_their_variables():
    step, _ = build("module-v1-adam")
    names = {op.name for op in trace_step(step).graph.get_operations()}
    assert any(n.startswith("Adam/update_w/") for n in names) and not any("update_/" in n for n in names)


def test_a_keras_3_update_is_colocated_with_its_variable_in_a_scope_of_its_own():
    step, _ = build("keras3-adam")
    graph = trace_step(step).graph
    writes = [op for op in graph.get_operations() if op.type == "AssignSubVariableOp" and "/update_" in op.name]
    assert writes
    for op in writes:
        variable = op.name.split("/update_", 1)[1].rsplit("/", 1)[0]
        assert op.get_attr("_class") == [f"loc:@{variable}".encode()]


def test_a_step_without_an_input_signature_is_refused_saying_how_to_give_one():
    @tf.function
    def step(x):
        return x

    with pytest.raises(ValueError, match=r"^parallel_run: the tf.function 'step' has no input_signature; declare one"):
        trace_step(step)


def test_something_other_than_a_tf_function_is_refused():
    with pytest.raises(TypeError, match=r"^parallel_run: a TensorFlow 2 step must be a tf.function, got function$"):
        trace_step(lambda x: x)


def test_a_captured_constant_becomes_a_constant_of_the_graph():
    table = np.arange(3.0, dtype=np.float32)
    w = tf.Variable(1.0, name="w")

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def step(x):
        w.assign_add(x * tf.reduce_sum(tf.constant(table) * table))
        return w.read_value()

    traced = trace_step(step)
    with tf.compat.v1.Session(graph=traced.graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        assert sess.run([traced.outputs, traced.train_op], {traced.inputs[0]: 2.0})[0] == 11.0


def test_a_lookup_table_the_step_reads_is_carried_into_the_graph_by_its_contents():
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer([1, 2], [10, 20]), -1)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
    def step(keys):
        return table.lookup(keys)

    traced = trace_step(step)
    with tf.compat.v1.Session(graph=traced.graph) as sess:
        sess.run(traced.graph.get_collection(tf.compat.v1.GraphKeys.TABLE_INITIALIZERS))
        assert sess.run(traced.outputs, {traced.inputs[0]: [2, 3, 1]}).tolist() == [20, -1, 10]


def test_a_table_the_step_writes_is_refused_naming_it():
    table = tf.lookup.experimental.MutableHashTable(tf.int32, tf.int32, -1)

    @tf.function(input_signature=[tf.TensorSpec([None], tf.int32)])
    def step(keys):
        table.insert(keys, keys)
        return table.lookup(keys)

    with pytest.raises(AnalysisError, match=r"^the step 'step' captures '.*', a resource that is no variable nor a "
                                            r"lookup table it only reads"):
        trace_step(step)


@pytest.mark.parametrize("case", [c for c in MIXED if c.startswith("keras3") or importlib.util.find_spec("tf_keras")])
def test_a_mixed_precision_step_traced_trains_as_the_eager_step(case):
    losses, _ = eager(case, 3)
    step, _ = build(case)
    traced = trace_step(step)
    with tf.compat.v1.Session(graph=traced.graph) as sess:
        sess.run(tf.compat.v1.variables_initializer(traced.graph.get_collection("variables")))
        got = [float(sess.run([traced.outputs, traced.train_op], dict(zip(traced.inputs, batch)))[0])
               for batch in batches(3, case)]
    np.testing.assert_allclose(got, losses, rtol=1e-6)  # the overflow cases: inf at the second step, on both


@pytest.mark.parametrize("case", ["keras3-lso-adam", "tfkeras-lso-adam"])
def test_a_loss_scale_optimizers_updates_are_read_through_its_lowered_cond(case):
    if case.startswith("tfkeras"):
        pytest.importorskip("tf_keras")
    step, variables = build(case)
    graph = trace_step(step).graph
    assert not [op for op in graph.get_operations() if op.type in ("If", "StatelessIf")]
    analysis = analyse_graph(graph)
    trainable = {v.name for v in analysis.variables if v.trainable}
    assert {g.variable for g in analysis.gradients} == trainable and len(trainable) == len(variables())
    for g in analysis.gradients:  # aggregated where the tape made them: before the finite check and the cond
        assert all(t.startswith("gradient_tape/") for t in g.aggregation_tensors if t), g
    assert [g.sparse for g in analysis.gradients].count(True) == 1
    for name in trainable:
        assert len([v for v in analysis.variables if v.slot_of == name]) == 2, name
    for g in analysis.gradients:  # the finite check reads every gradient: one decision, on aggregated gradients
        assert set(g.coupled_with) == trainable - {g.variable}, g
    scale = [v for v in analysis.variables
             if v.name.rsplit("/", 1)[-1] in ("dynamic_scale", "step_counter", "current_loss_scale", "good_steps")]
    assert scale and all(v.slot_of is None for v in scale)  # the loss scale and its counter are no one's slots


def test_hybrid_keeps_a_loss_scaled_embedding_off_the_servers_since_every_worker_takes_the_skip_decision():
    step, _ = build("keras3-lso-adam")
    choices, notes = choose_sync(analyse_graph(trace_step(step).graph), 2, 1, "hybrid")
    assert {c.sync for c in choices.values()} == {"allreduce", "allgather"}
    assert len(notes) == 1 and "embedding" in notes[0] and "instead of ps" in notes[0]


def test_clipping_that_densifies_a_sparse_gradient_inside_a_loss_scale_optimizers_cond_is_refused():
    import keras

    from tests.tf2.programs import _keras_model

    keras.utils.set_random_seed(1)
    model = _keras_model(keras)  # a trainable embedding: a sparse gradient, made dense by the clipping in the cond
    opt = keras.optimizers.LossScaleOptimizer(keras.optimizers.SGD(0.1, global_clipnorm=0.5))

    @tf.function(input_signature=[tf.TensorSpec([None, 3], tf.int32), tf.TensorSpec([None, 1], tf.float32)])
    def step(ids, y):
        with tf.GradientTape() as tape:
            scaled = opt.scale_loss(tf.reduce_mean(tf.square(model(ids) - y)))
        opt.apply_gradients(zip(tape.gradient(scaled, model.trainable_variables), model.trainable_variables))
        return scaled

    with pytest.raises(AnalysisError, match=r'^the gradient of ".*" \(.*\) is computed inside a '
                                            r'conditional that the gradients decide \(".*": a LossScaleOptimizer'):
        analyse_graph(trace_step(step).graph)


def test_a_trainable_variable_written_inside_a_loop_is_refused_naming_it():
    w = tf.Variable(1.0, name="w")

    @tf.function(input_signature=[tf.TensorSpec([], tf.float32)])
    def step(x):
        with tf.GradientTape() as tape:
            loss = w * x
        grad = tape.gradient(loss, w)
        tf.while_loop(lambda i: i < 2, lambda i: (w.assign_sub(0.1 * grad), i + 1)[1], [0])
        return loss

    with pytest.raises(AnalysisError, match=r'^the trainable variable "w" is written inside While ".*" \(a TensorFlow '
                                            r"2 loop, nested function or tf.cond\)"):
        analyse_graph(trace_step(step).graph)


@pytest.mark.parametrize("average_sparse, aggregation", [(None, "mean"), (False, "sum"), (True, "mean")],
                         ids=["default", "sum", "mean"])
def test_a_steps_sparse_gradients_are_averaged_unless_the_config_says_sum(tmp_path, average_sparse, aggregation):
    """A TF2 step follows its own framework: model.fit and the distribution strategies average every gradient, so
    the default (``None``) averages the embedding's sparse gradient too, where a tf.compat.v1 graph sums."""
    import parallax

    resources = tmp_path / "resources"
    resources.write_text("localhost: cpu:0,cpu:1\n")
    step, _ = build("keras3-adam")
    config = parallax.Config(run_option="MPI", average_sparse=average_sparse)
    plan = parallax.preview_plan(step, str(resources), parallax_config=config)
    embedding = [v for v in plan.variables if v.sparse]
    assert embedding and {v.aggregation for v in embedding} == {aggregation}


def test_an_update_that_each_worker_would_decide_on_its_own_data_is_refused_naming_it():
    """``tf.cond(loss < 1, apply, no-op)``: the gradients are aggregated, but the loss is each replica's own, so
    each worker would apply or skip alone (a LossScaleOptimizer's finite check, on the aggregated gradients, is
    accepted: test_a_loss_scale_optimizers_updates_are_read_through_its_lowered_cond)."""
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((3,)), keras.layers.Dense(1)])
    optimizer = keras.optimizers.SGD(0.1)
    optimizer.build(model.trainable_variables)

    @tf.function(input_signature=[tf.TensorSpec([None, 3]), tf.TensorSpec([None, 1])])
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(model(x) - y))
        grads = tape.gradient(loss, model.trainable_variables)
        tf.cond(loss < 1.0, lambda: optimizer.apply_gradients(zip(grads, model.trainable_variables)),
                lambda: tf.constant(0, tf.int64))
        return loss

    with pytest.raises(AnalysisError, match=r'^the update of "sequential.*" runs under the conditional ".+", whose '
                                            r'predicate is computed from the batch input "[xy]" without going through '
                                            r"the gradients: each worker would decide on its own part"):
        analyse_graph(trace_step(step).graph)


@pytest.mark.parametrize("case", ["keras3-rmsprop", "keras3-adagrad"])
def test_a_conditional_on_one_updates_own_slot_is_part_of_that_update(case):
    """Keras 3 divides an embedding's sparse gradient by a slot through a tf.cond on whether the slot holds a zero:
    with the table on a server (HYBRID), the non-chief worker, which runs no server update, must not read it."""
    from tests.unit.rewrite.test_hybrid import hybrid, rewrite

    step, _ = build(case)
    model = type("Traced", (), {"graph": trace_step(step).graph})
    plan = hybrid(model, hosts=("h", "h"))
    assert [v.name for v in plan.variables if v.server is not None and v.sparse]  # the table is on the server
    for worker in (0, 1):
        assert rewrite(model, plan, worker).graph_def.node  # no RewriteError: nothing outside reads the update
