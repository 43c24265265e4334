"""Synchronised batch statistics (parallax/tf2/replica_sums.py, the aggregation pass's replica sums): a Keras
``BatchNormalization(synchronized=True)`` (Keras 3, tf_keras) traced in a step is found as sums over the replicas,
forward and backward, while the optimizer's own all-reduce of the gradients is not one; two replicas in one
process then train as one device on the union batch; ``Config(sync_batch_norm=True)`` asks it of every layer of
``parallax.fit``'s model while it traces, and is refused where it cannot be honoured. The same over processes, in
every mode: tests/multiprocess/test_tf2_keras_programs.py."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.analysis import analyse_graph
from parallax.config import Config
from parallax.errors import AnalysisError, PlanError
from parallax.job.plan import make_job_plan
from parallax.job.settings import derive
from parallax.resources.files import parse_resource_text
from parallax.tf2.replica_sums import synchronised_statistics
from parallax.tf2.trace import trace_step
from tests.unit.analysis.test_batch_statistics import _step_of


def _model(flavor: str = "keras", synchronized: bool = True):
    import importlib

    keras = importlib.import_module(flavor)
    keras.utils.set_random_seed(3)
    norm = keras.layers.BatchNormalization(synchronized=synchronized, momentum=0.5, name="norm")
    return keras, keras.Sequential([keras.Input((4,)), keras.layers.Dense(3), norm, keras.layers.Dense(1)])


def _step(keras, model):
    return _step_of(model, keras)[0]  # SGD, a mean squared error


@pytest.mark.parametrize("flavor", ["keras", "tf_keras"])
def test_a_synchronised_batch_norm_is_three_sums_forward_and_three_backward(flavor):
    keras, model = _model(flavor)
    analysis = analyse_graph(trace_step(_step(keras, model)).graph)
    forward = [n for n in analysis.replica_sums if "norm" in n]
    assert len(forward) == 3 and len(analysis.replica_sums) == 6  # sum, sum of squares, count; their gradients
    assert analysis.replica_sums[:3] == tuple(forward)  # the graph's order: the forward pass first
    assert analysis.batch_statistics == ()  # not said at WARNING: it normalises as one device


def test_the_optimizers_all_reduce_of_the_gradients_is_left_to_parallax():
    keras, model = _model(synchronized=False)
    graph = trace_step(_step(keras, model)).graph
    assert any(op.type == "IdentityN" for op in graph.get_operations())  # Keras 3's optimizer's all_reduce
    assert analyse_graph(graph).replica_sums == ()


def test_a_step_that_differentiates_another_all_reduce_is_refused_naming_its_caller():
    keras, model = _model(synchronized=False)

    def summed_over_replicas(h):
        return tf.distribute.get_replica_context().all_reduce("sum", h)

    @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 1])])
    def step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(summed_over_replicas(model(x, training=True)) - y)
        return tape.gradient(loss, model.trainable_variables)[0]

    with pytest.raises(AnalysisError, match=r"^the step differentiates tf.distribute's all_reduce called from "
                                            r"summed_over_replicas \(.*test_replica_sums.py:\d+\): Parallax sums"):
        trace_step(step)


@pytest.mark.parametrize("flavor", ["keras", "tf_keras"])
def test_two_replicas_in_one_process_train_as_one_device_on_the_union_batch(tmp_path, flavor):
    rng = np.random.RandomState(0)
    x = (rng.normal(size=(3, 8, 4)) * 3 + 1).astype("float32")
    y = rng.normal(size=(3, 8, 1)).astype("float32")
    keras, model = _model(flavor)
    step = _step(keras, model)
    for k in range(3):
        alone = step(x[k], y[k])
    expected = [v.numpy() for v in model.weights]  # gamma, beta, moving mean and variance among them
    keras, model = _model(flavor)
    resources = tmp_path / "resources"
    resources.write_text("localhost: cpu:0,cpu:1\n")
    distributed, workers, _, replicas = parallax.parallel_run(_step(keras, model), str(resources),
                                                             parallax_config=Config(run_option="PS"))
    assert (workers, replicas) == (1, 2)
    for k in range(3):
        losses = distributed([x[k, :4], x[k, 4:]], [y[k, :4], y[k, 4:]])
    distributed.close()
    np.testing.assert_allclose(np.mean(losses), alone.numpy(), rtol=1e-5)
    for got, want, v in zip([v.numpy() for v in model.weights], expected, model.weights):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6, err_msg=v.name)


@pytest.mark.parametrize("flavor", ["keras", "tf_keras"])
def test_sync_batch_norm_asks_it_of_every_layer_while_the_step_is_traced(flavor):
    keras, model = _model(flavor, synchronized=False)
    if flavor == "tf_keras":
        model(np.zeros((2, 4), "float32"), training=True)  # built: fused where it can be
    norm = model.get_layer("norm")
    before = (norm.synchronized, getattr(norm, "fused", None))
    with synchronised_statistics(model, every=True):
        assert norm.synchronized and not getattr(norm, "fused", False)
        assert len(analyse_graph(trace_step(_step(keras, model)).graph).replica_sums) == 6
    assert (norm.synchronized, getattr(norm, "fused", None)) == before
    with synchronised_statistics(model, every=False):
        assert norm.synchronized is False


def test_sync_batch_norm_is_refused_where_a_layer_cannot_be_synchronised():
    keras, model = _model(synchronized=False)  # a tf.function step: its layers are the program's, not reached
    analysis = analyse_graph(trace_step(_step(keras, model)).graph)
    cluster = parse_resource_text("localhost: cpu:0,cpu:1\n")
    settings = derive(Config(run_option="MPI", sync_batch_norm=True), True, cluster, gpus=0)
    with pytest.raises(PlanError, match=r"^Config\(sync_batch_norm=True\): .*norm.* normalise by their batch's "
                                        r"statistics in a way Parallax does not synchronise"):
        make_job_plan(cluster, settings, analysis)


def test_synchronised_statistics_are_refused_in_micro_batches():
    keras, model = _model()
    analysis = analyse_graph(trace_step(_step(keras, model)).graph)
    cluster = parse_resource_text("localhost: cpu:0,cpu:1\n")
    settings = derive(Config(run_option="MPI", micro_batches=2), True, cluster, gpus=0)
    with pytest.raises(PlanError, match=r"^synchronised batch statistics with pipeline_stages=1, micro_batches=2"):
        make_job_plan(cluster, settings, analysis)
