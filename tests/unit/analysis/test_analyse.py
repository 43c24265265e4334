import itertools

import pytest
import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.errors import AnalysisError
from tests.models import OPTIMIZERS, build_embedding, build_mlp

CASES = list(itertools.product(sorted(OPTIMIZERS), [True, False], [None, 1.0], [True, False]))


@pytest.mark.parametrize("optimizer, resource, clip, global_step", CASES,
                         ids=[f"{o}-{'resource' if r else 'ref'}-{'clip' if c else 'noclip'}-"
                              f"{'step' if g else 'nostep'}" for o, r, c, g in CASES])
def test_finds_dense_and_sparse_gradients_for_every_optimizer(optimizer, resource, clip, global_step):
    model = build_embedding(optimizer, resource=resource, clip=clip, global_step=global_step)
    analysis = analyse_graph(model.graph)
    assert [g.variable for g in analysis.gradients] == ["embedding", "proj/kernel"]
    emb, proj = analysis.gradients
    assert emb.sparse and emb.indices is not None and emb.indices_dtype in ("int32", "int64")
    assert not proj.sparse and proj.indices is None
    graph = model.graph
    assert graph.get_tensor_by_name(emb.tensor).shape.as_list() == [None, 4]
    assert graph.get_tensor_by_name(proj.tensor).shape.as_list() == [4, 1]
    if clip:
        assert "clip_by_global_norm" in emb.tensor and "clip_by_global_norm" in proj.tensor
        # traced back to the raw tf.gradients outputs, where Parallax aggregates
        assert emb.aggregation_tensors == ("gradients/embedding_lookup_grad/Reshape:0", emb.indices)
        assert proj.aggregation_tensors[0].startswith("gradients/MatMul_grad/")
    else:
        assert emb.aggregation_tensors == (emb.tensor, emb.indices)
    assert analysis.train_ops == (model.train_op.name,)
    names = {v.name for v in analysis.variables}
    assert {"embedding", "proj/kernel"} <= names
    assert ("global_step" in names) == global_step


def test_variables_carry_shape_dtype_and_trainability():
    analysis = analyse_graph(build_mlp("adam").graph)
    kernel = analysis.variable("dense/kernel")
    assert (kernel.shape, kernel.dtype, kernel.trainable, kernel.resource) == ((4, 8), "float32", True, True)
    assert kernel.num_bytes == 4 * 8 * 4
    assert analysis.variable("global_step").trainable is False
    assert analysis.gradient("global_step") is None
    assert analysis.gradient("dense/kernel/Adam") is None  # slots have no gradient


def test_learning_rate_placeholder_is_not_taken_for_a_gradient():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2])
        lr = tf.compat.v1.placeholder(tf.float32, [], name="lr")
        w = tf.compat.v1.get_variable("w", [2, 1])
        loss = tf.reduce_mean(tf.matmul(x, w))
        train = tf.compat.v1.train.MomentumOptimizer(lr, 0.9).minimize(loss)
    analysis = analyse_graph(graph)
    assert analysis.gradient("w").tensor.startswith("gradients/")
    assert analysis.train_ops == (train.name,)


def two_variable_loss():
    """Inside a graph context: variables a, b (both [2, 1]) and a loss using both."""
    x = tf.compat.v1.placeholder(tf.float32, [None, 2])
    a = tf.compat.v1.get_variable("a", [2, 1])
    b = tf.compat.v1.get_variable("b", [2, 1])
    return a, b, tf.reduce_mean(tf.matmul(x, a) + tf.matmul(x, b))


def test_two_optimizers_give_two_train_ops_without_the_collection():
    graph = tf.Graph()
    with graph.as_default():
        a, b, loss = two_variable_loss()
        t1 = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, var_list=[a])
        t2 = tf.compat.v1.train.AdamOptimizer(0.1).minimize(loss, var_list=[b])
        graph.clear_collection(tf.compat.v1.GraphKeys.TRAIN_OP)
    analysis = analyse_graph(graph)
    assert set(analysis.train_ops) == {t1.name, t2.name}


def test_graph_loaded_from_a_meta_graph_file(tmp_path):
    model = build_embedding("adagrad")
    path = str(tmp_path / "model.meta")
    with model.graph.as_default():
        tf.compat.v1.train.export_meta_graph(path)
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(path)
    analysis = analyse_graph(graph)
    assert [g.variable for g in analysis.gradients] == ["embedding", "proj/kernel"]


def test_graph_built_before_importing_parallax_is_analysed(tmp_path):
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent("""
        import tensorflow as tf
        g = tf.Graph()
        with g.as_default():
            x = tf.compat.v1.placeholder(tf.float32, [None, 2])
            w = tf.compat.v1.get_variable("w", [2, 1])
            tf.compat.v1.train.AdamOptimizer(0.1).minimize(tf.reduce_sum(tf.matmul(x, w)))
        from parallax.analysis import analyse_graph  # imported after the graph is built
        print([x.variable for x in analyse_graph(g).gradients])
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "['w']" in out.stdout


def test_a_graph_without_training_op_is_forward_only():
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 2])
        w = tf.compat.v1.get_variable("w", [2, 1])
        tf.reduce_sum(tf.matmul(x, w))
    analysis = analyse_graph(graph)
    assert analysis.forward_only and analysis.train_ops == () and [v.name for v in analysis.variables] == ["w"]


def test_ambiguous_post_processing_falls_back_to_the_update_inputs():
    graph = tf.Graph()
    with graph.as_default():
        _, _, loss = two_variable_loss()
        opt = tf.compat.v1.train.GradientDescentOptimizer(0.1)
        (ga, va), (gb, vb) = opt.compute_gradients(loss)
        mixed = ga + gb  # one post-processed tensor made of two raw gradients, used for both
        opt.apply_gradients([(mixed, va), (mixed * 2.0, vb)])
    analysis = analyse_graph(graph)
    for g in analysis.gradients:
        assert g.aggregation_tensors == (g.tensor, None)


@pytest.mark.parametrize("optimizer", OPTIMIZERS)
def test_repeated_rows_may_be_merged_when_the_update_sums_them_first(optimizer):
    """TensorFlow's sparse updates sum the rows of repeated indices first (an UnsortedSegmentSum
    on the values, which is all they do with them), and plain SGD scales them and scatter-adds,
    adding as it goes; clipping reads them before: summing repeats before sending changes nothing
    but there."""
    analysis = analyse_graph(build_embedding(optimizer).graph)
    assert analysis.gradient("embedding").repeats_merged is True
    clipped = analyse_graph(build_embedding(optimizer, clip=0.5).graph)
    assert clipped.gradient("embedding").repeats_merged is False


def test_an_update_that_squares_each_row_before_summing_keeps_its_rows_apart():
    """Keras 3's Adam sums the rows for its first moment but squares each row before summing them for
    its second: merging repeated rows before sending would change the second moment."""
    graph = tf.Graph()
    with graph.as_default():
        emb = tf.compat.v1.get_variable("emb", [10, 2], use_resource=True)
        slot = tf.compat.v1.get_variable("emb/v", [10, 2], use_resource=True, trainable=False)
        ids = tf.compat.v1.placeholder(tf.int32, [None])
        grad = tf.gradients(tf.reduce_sum(tf.nn.embedding_lookup(emb, ids)), emb)[0]
        with tf.compat.v1.name_scope("opt/update_emb"):
            rows = tf.math.unsorted_segment_sum(tf.square(grad.values), grad.indices, 10)
            tf.compat.v1.assign_add(slot, rows)
            tf.compat.v1.assign_sub(emb, tf.math.unsorted_segment_sum(grad.values, grad.indices, 10))
    assert analyse_graph(graph).gradient("emb").repeats_merged is False


def test_tf_keras_non_legacy_optimizers_in_a_v1_graph_are_refused_not_run_forward_only():
    import tf_keras

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        model = tf_keras.Sequential([tf_keras.layers.Dense(1, input_shape=(3,))])
        loss = tf.reduce_mean(model(x))
        variables = model.trainable_variables
        tf_keras.optimizers.Adam(0.1).apply_gradients(zip(tf.gradients(loss, variables), variables))
    with pytest.raises(AnalysisError, match=r"the graph computes gradients .* but no optimizer update that Parallax "
                                            r"recognises applies the gradients: it would run forward-only.*"
                                            r"tf_keras.optimizers.legacy"):
        analyse_graph(graph)


def test_gradients_without_any_write_stay_a_forward_only_graph():
    graph = tf.Graph()
    with graph.as_default():  # e.g. the gradient of the loss with respect to the input (an adversarial example)
        x = tf.compat.v1.placeholder(tf.float32, [None, 3])
        w = tf.compat.v1.get_variable("w", [3, 1])
        tf.gradients(tf.reduce_sum(tf.matmul(x, w)), x)
    assert analyse_graph(graph).forward_only


@pytest.mark.parametrize("source", ["placeholder", "dataset"])
def test_a_trainable_variable_the_program_writes_from_the_batch_is_refused_naming_it(source):
    """Outside the optimizer, each worker would write its own part's value, and the copies of a trained variable
    would drift apart; a variable set from a fixed-shape feed (a pretrained table) is accepted."""
    graph = tf.Graph()
    with graph.as_default():
        if source == "placeholder":
            x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        else:
            x = tf.compat.v1.data.make_one_shot_iterator(tf.data.Dataset.from_tensors(tf.ones([4, 3]))).get_next()
        w = tf.compat.v1.get_variable("w", [3, 1], use_resource=True)
        b = tf.compat.v1.get_variable("b", [1], use_resource=True)
        table = tf.compat.v1.placeholder(tf.float32, [3, 1], name="table")
        w.assign(table)  # accepted: the same feed on every worker
        train = tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_mean(tf.matmul(x, w) + b),
                                                                          var_list=[w])
        with tf.control_dependencies([train]):
            b.assign_add(tf.reduce_mean(x, axis=0)[:1], name="shift")
    with pytest.raises(AnalysisError, match=r'^the trainable variable "b" is written by "shift" '
                                            r"\(AssignAddVariableOp\) outside the optimizer's updates, with a value "
                                            r'computed from the batch input ".+".*trainable=False'):
        analyse_graph(graph)
