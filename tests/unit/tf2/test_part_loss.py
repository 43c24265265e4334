"""A loss averaged over each batch's unmasked time steps: its counts made sums over the replicas where the step
divides by them (parallax/tf2/masked_means.py), and named at WARNING where the job cannot make it the union
batch's (parallax/tf2/part_loss.py)."""

from __future__ import annotations

import numpy as np
import pytest

from parallax.tf2.part_loss import warn_masked_loss


def _tagger(keras, mask_zero: bool, loss):
    ids = keras.Input((5,), dtype="int32")
    states = keras.layers.LSTM(3, return_sequences=True)(keras.layers.Embedding(10, 4, mask_zero=mask_zero)(ids))
    model = keras.Model(ids, keras.layers.Dense(2)(states))
    model.compile(optimizer="sgd", loss=loss)
    return model


def _loss(keras, mask_zero: bool, loss):
    if loss == "ignore":
        loss = keras.losses.SparseCategoricalCrossentropy(from_logits=True, ignore_class=0)
    return _tagger(keras, mask_zero, loss)


CASES = [(True, "sparse_categorical_crossentropy", "output 0 is masked"),
         (False, "ignore", "SparseCategoricalCrossentropy(ignore_class=0)"),
         (False, "sparse_categorical_crossentropy", None)]


@pytest.mark.parametrize("mask_zero, loss, said", CASES)
def test_a_loss_over_the_unmasked_steps_the_job_cannot_sum_is_named(parallax_warnings, mask_zero, loss, said):
    import keras

    model = _loss(keras, mask_zero, loss)
    warn_masked_loss(model, 1, summed=False)
    warn_masked_loss(model, 2, summed=True)  # trained and logged as one device
    assert parallax_warnings == []
    warn_masked_loss(model, 2, summed=False)
    if said is None:
        assert parallax_warnings == []
    else:
        assert len(parallax_warnings) == 1 and said in parallax_warnings[0]
        assert "each of the 2 replicas divides by its part's count" in parallax_warnings[0]


def test_tf_keras_whose_loss_metrics_the_step_updates_is_not_told_of_its_logged_loss(parallax_warnings):
    """tf_keras's compiled loss updates its loss metric in the step, on the division the job sums: as one device."""
    import tf_keras

    warn_masked_loss(_tagger(tf_keras, True, "sparse_categorical_crossentropy"), 2, summed=True)
    assert parallax_warnings == []


def _traced(keras, mask_zero: bool, loss):
    """The traced step of a tagger's compiled loss and SGD (the counts' division found and summed)."""
    import tensorflow as tf

    from parallax.tf2.trace import trace_step

    model = _loss(keras, mask_zero, loss)
    optimizer = model.optimizer

    @tf.function(input_signature=[tf.TensorSpec([None, 5], tf.int32), tf.TensorSpec([None, 5], tf.int32)])
    def step(x, y):
        with tf.GradientTape() as tape:
            if hasattr(model, "compute_loss"):
                loss_value = model.compute_loss(x, y, model(x, training=True))
            else:
                loss_value = model.compiled_loss(y, model(x, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss_value, model.trainable_variables),
                                      model.trainable_variables))
        return loss_value

    return trace_step(step)


@pytest.mark.parametrize("module, mask_zero, loss", [("keras", True, "sparse_categorical_crossentropy"),
                                                     ("keras", False, "ignore"),
                                                     ("tf_keras", True, "sparse_categorical_crossentropy")])
def test_the_counts_a_masked_loss_divides_by_are_summed_over_the_replicas(module, mask_zero, loss):
    """The division ``total / valid`` (Keras 3's ``divide_no_nan``, tf_keras's ``truediv``) reads an ``IdentityN``
    of the counts, named among the graph's sums over the replicas; one replica computes the loss as before."""
    import importlib

    import tensorflow as tf

    from parallax.analysis.batch_statistics import replica_sums_of
    from parallax.tf2.masked_means import is_masked_count

    keras = importlib.import_module(module)
    traced = _traced(keras, mask_zero, loss)
    sums = replica_sums_of(traced.graph)
    assert len(sums) == 1 and is_masked_count(sums[0])
    counts = traced.graph.get_operation_by_name(sums[0])
    assert counts.type == "IdentityN" and [c.type for c in counts.outputs[0].consumers()] in (["DivNoNan"],
                                                                                                  ["RealDiv"])
    ids = np.array([[1, 2, 0, 0, 0], [3, 0, 0, 0, 0]], np.int32)  # 3 of 10 unmasked (mask_zero); tags 0: ignored
    tags = np.array([[1, 1, 0, 0, 0], [1, 0, 0, 0, 0]], np.int32)
    with tf.compat.v1.Session(graph=traced.graph) as session:
        session.run(tf.compat.v1.global_variables_initializer())
        total, valid = session.run(counts.outputs[:2], {traced.inputs[0]: ids, traced.inputs[1]: tags})
    assert (float(total), float(valid)) == (10.0, 3.0)


def test_a_loss_without_a_mask_has_no_counts_to_sum():
    import keras

    from parallax.analysis.batch_statistics import replica_sums_of

    assert replica_sums_of(_traced(keras, False, "sparse_categorical_crossentropy").graph) == ()


@pytest.mark.parametrize("module", ["keras", "tf_keras"])
def test_a_loss_compiled_to_sum_over_the_batch_is_found_only_where_every_loss_sums(module):
    import importlib

    from parallax.tf2.part_loss import sums_over_batch

    keras = importlib.import_module(module)

    def compiled(loss):
        inputs = keras.Input((3,))
        model = keras.Model(inputs, {"a": keras.layers.Dense(1, name="a")(inputs),
                                     "b": keras.layers.Dense(1, name="b")(inputs)})
        model.compile(optimizer="sgd", loss=loss)
        return model

    summed = keras.losses.MeanSquaredError(reduction="sum")
    assert sums_over_batch(compiled({"a": summed, "b": keras.losses.MeanAbsoluteError(reduction="sum")}))
    assert not sums_over_batch(compiled({"a": summed, "b": "mse"}))  # the first step's check names the other
    assert not sums_over_batch(compiled("mse"))
    assert not sums_over_batch(compiled(keras.losses.MeanSquaredError()))


def test_a_summed_loss_on_a_part_is_its_share_of_the_batch_and_the_mean_of_its_halves():
    """The replicas' mean of the parts' weighed losses is one device's sum over the batch, and the first step's
    check, which feeds a part's halves as the part, finds their mean equal to the part's."""
    import keras
    import tensorflow as tf

    from parallax.tf2.part_loss import counts, part_loss, summed_weights

    loss = keras.losses.MeanSquaredError(reduction="sum")
    rng = np.random.RandomState(0)
    y, p = rng.randn(8, 1).astype(np.float32), rng.randn(8, 1).astype(np.float32)
    examples, share = tf.constant(8.0), tf.constant(4.0)

    def weighed(rows: slice, real: int) -> float:
        w = summed_weights(tf.ones([len(y[rows])]), examples, y[rows])
        return float(part_loss(loss(y[rows], p[rows], w), tf.constant(real), share))

    parts = [weighed(slice(0, 4), 4), weighed(slice(4, 8), 4)]
    np.testing.assert_allclose(np.mean(parts), float(loss(y, p)), rtol=1e-6)  # one device's sum
    halves = [weighed(slice(0, 2), 4), weighed(slice(2, 4), 4)]  # the check: the part's feeds, half its rows
    np.testing.assert_allclose(np.mean(halves), parts[0], rtol=1e-6)
    assert float(counts(tf.constant(4), share)) == 1.0


def _adding(keras, per_example: bool, own_compute_loss: bool = False):
    """A model whose layer adds a loss with ``add_loss``: one value per example (keras-io's CTC layer), or their
    mean; its class computes its loss its own way where ``own_compute_loss``."""

    class Adds(keras.layers.Layer):
        def call(self, x):
            values = keras.ops.sum(keras.ops.square(x), axis=-1, keepdims=True)  # (batch, 1)
            self.add_loss(values if per_example else keras.ops.mean(values))
            return x

    class Own(keras.Model):
        def compute_loss(self, x=None, y=None, y_pred=None, sample_weight=None, training=True):
            return keras.ops.mean(y_pred)

    inputs = keras.Input((3,))
    model = (Own if own_compute_loss else keras.Model)(inputs, Adds()(keras.layers.Dense(2)(inputs)))
    model.compile(optimizer="sgd")
    return model


@pytest.mark.parametrize("per_example, own, found", [(True, False, True), (False, False, False), (True, True, False)],
                         ids=["per-example", "a-mean", "own-compute-loss"])
def test_a_loss_a_layer_adds_per_example_is_found_where_keras_sums_it(per_example, own, found):
    import keras
    import tensorflow as tf

    from parallax.tf2.keras_flavor import flavor_of

    model = _adding(keras, per_example, own)
    flavor = flavor_of(model, "test")
    assert flavor.adds_per_example(model, np.ones((5, 3), np.float32)) is found  # eager: parallax.evaluate's look
    traced = []
    tf.function(lambda x: (model(x), traced.extend(flavor.added_per_example(model)))[0],
                input_signature=[tf.TensorSpec([None, 3], tf.float32)]).get_concrete_function()
    assert len(traced) == found  # in fit's step, where the batch's size is unknown


def test_what_a_layer_adds_per_example_on_a_part_is_its_share_of_the_batch_and_the_mean_of_its_halves():
    """As a compiled loss that sums: the replicas' mean of the parts' weighed losses is one device's loss (the
    compiled mean plus the added sum over the batch), and the mean of a part's halves is the part's."""
    import tensorflow as tf

    from parallax.tf2.part_loss import part_loss, with_added_sums

    rng = np.random.RandomState(1)
    added, mean = rng.rand(8, 1).astype(np.float32), rng.rand(8).astype(np.float32)  # per example; a compiled loss
    examples, share = tf.constant(8.0), tf.constant(4.0)

    def weighed(rows: slice, real: int) -> float:
        loss = tf.constant(mean[rows].mean() + added[rows].sum())  # Keras 3's: the added values summed in
        return float(part_loss(with_added_sums(loss, [tf.constant(added[rows])], examples, added[rows]),
                               tf.constant(real), share))

    parts = [weighed(slice(0, 4), 4), weighed(slice(4, 8), 4)]
    np.testing.assert_allclose(np.mean(parts), mean.mean() + added.sum(), rtol=1e-6)  # one device's loss
    np.testing.assert_allclose(np.mean([weighed(slice(0, 2), 4), weighed(slice(2, 4), 4)]), parts[0], rtol=1e-6)
