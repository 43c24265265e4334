"""A ``tf.function`` step as TensorFlow's tutorials write it, without an ``input_signature``
(parallax/tf2/deferred.py): traced at its first call from its arguments, the batch dimension open; a later call
that does not fit is refused naming the argument. One worker in this process: nothing is launched."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.tf2.deferred import signature_of


def test_the_signature_is_one_replicas_part_with_the_batch_dimension_open():
    specs = signature_of(([np.zeros((3, 4), np.float32), np.zeros((3, 4), np.float32)], {"ids": np.zeros(3, np.int32)}),
                         num_replicas=2)
    assert specs[0] == tf.TensorSpec([None, 4], tf.float32)
    # a structure of one replica, given as it is
    assert specs[1] == {"ids": tf.TensorSpec([None], tf.int32)}


def _program():
    import keras

    keras.utils.set_random_seed(3)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function  # no input_signature, returns nothing
    def train_step(x, y):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - y) ** 2)
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

    return train_step, model


def _alone_and_job(tmp_path, seed: int, steps: int) -> tuple:
    """``steps`` batches, the program trained on them eagerly, and ``parallel_run`` of a second copy of it on one
    worker in this process: ``(data, trained model, (step, numbers...), model of the job)``."""
    rng = np.random.RandomState(seed)
    data = [(rng.randn(6, 4).astype(np.float32), rng.randn(6, 2).astype(np.float32)) for _ in range(steps)]
    step_fn, reference = _program()
    for x, y in data:
        step_fn(x, y)
    train_step, model = _program()
    (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
    return data, reference, parallax.parallel_run(train_step, str(tmp_path / "resource_info")), model


def test_a_step_without_a_signature_is_traced_at_its_first_call_and_trains_as_on_one_device(tmp_path):
    data, reference, (step, num_workers, worker_id, num_replicas), model = _alone_and_job(tmp_path, 0, 3)
    assert (num_workers, worker_id, num_replicas) == (1, 0, 1)
    for x, y in data:
        assert step(x, y) is None
    with pytest.raises(ValueError, match=r"^the step's argument tensor 0 has shape \[6, 5\] on a replica, and its "
                                         r"signature takes \(None, 4\)"):
        step(np.zeros((6, 5), np.float32), data[0][1])
    step.close()
    for got, want in zip(model.trainable_variables, reference.trainable_variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


def _tutorial_vae_shape():
    """TensorFlow's VAE tutorial's way: the model and the optimizer are the step's arguments, beside the batch, and
    a Python flag says whether it trains."""
    import keras

    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(3, activation="relu"), keras.layers.Dense(4)])
    optimizer = keras.optimizers.SGD(0.1)

    @tf.function
    def train_step(model, x, optimizer, scaled=False):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(x, training=True) - x) ** 2) * (2.0 if scaled else 1.0)
        gradients = tape.gradient(loss, model.trainable_variables)
        optimizer.apply_gradients(zip(gradients, model.trainable_variables))

    return train_step, model, optimizer


def test_arguments_that_are_no_tensors_are_traced_as_the_values_they_are_and_must_stay_those(tmp_path):
    from parallax.tf2.deferred import static

    assert [static(v) for v in (np.zeros(2), 3, 2.5, [np.zeros(2)], {"a": 1}, True, "x", None, object())] == \
        [False] * 5 + [True] * 4
    rng = np.random.RandomState(1)
    data = [rng.randn(6, 4).astype(np.float32) for _ in range(3)]
    step_fn, reference, optimizer = _tutorial_vae_shape()
    for x in data:
        step_fn(reference, x, optimizer, True)
    train_step, model, optimizer = _tutorial_vae_shape()
    resources = tmp_path / "resource_info"
    resources.write_text("localhost: cpu:0\n")
    step, *_ = parallax.parallel_run(train_step, str(resources))
    for x in data:
        step(model, x, optimizer, True)
    for changed in [(reference, data[0], optimizer, True), (model, data[0], optimizer, False)]:
        with pytest.raises(ValueError, match=r"^the step takes arguments shaped as its input_signature .* and each "
                                             r"argument that is no tensor \(a model, a flag\) the value it was traced "
                                             r"with; got 4 argument\(s\) shaped otherwise"):
            step(*changed)
    step.close()
    for got, want in zip(model.trainable_variables, reference.trainable_variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)


def test_a_step_called_with_keywords_takes_them_as_its_parameters_bind_them(tmp_path):
    from parallax.tf2.deferred import positional

    data, reference, (step, *_), model = _alone_and_job(tmp_path, 2, 2)
    step(y=data[0][1], x=data[0][0])  # traced from keywords
    step(data[1][0], y=data[1][1])
    with pytest.raises(TypeError, match=r"^the step 'train_step' was called with arguments it does not take: "):
        step(data[1][0], z=data[1][1])
    step.close()
    for got, want in zip(model.trainable_variables, reference.trainable_variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)

    def keyword_only(x, *, training):
        return x

    with pytest.raises(TypeError, match=r"'keyword_only' takes training by keyword only; Parallax feeds a step's "
                                        r"arguments by position"):
        positional(keyword_only, (1,), {"training": True})


def test_a_step_that_needs_its_batchs_static_size_is_traced_with_the_first_calls_shapes(tmp_path):
    # TensorFlow's VAE tutorial draws tf.random.normal(shape=mean.shape): with the batch dimension open the trace
    # fails, so the step is traced as tf.function traces a first call, and a part of another size is refused
    import keras

    def program():
        keras.utils.set_random_seed(7)
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2)])
        optimizer = keras.optimizers.Adam(0.1)  # its slots are made in the step's first trace

        @tf.function
        def train_step(x):
            with tf.GradientTape() as tape:
                mean = model(x, training=True)
                loss = tf.reduce_mean((mean + tf.random.normal(shape=mean.shape) - 1.0) ** 2)
            optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))

        return train_step, model

    batches = [np.random.RandomState(i).randn(6, 4).astype(np.float32) for i in range(3)]
    step_fn, reference = program()
    for x in batches:
        step_fn(x)
    train_step, model = program()
    (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
    step, *_ = parallax.parallel_run(train_step, str(tmp_path / "resource_info"))
    for x in batches:
        step(x)
    with pytest.raises(ValueError, match=r"has shape \[5, 4\] on a replica, and its signature takes \(6, 4\)"):
        step(batches[0][:5])
    step.close()
    for got, want in zip(model.trainable_variables, reference.trainable_variables):
        np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-6)
