"""A step that differentiates with variables it has already updated (parallax/analysis/update_order.py): Keras's guide's
GAN trains its discriminator, then its generator through the updated discriminator. Parallax aggregates every
gradient of a step before any update, so it refuses that step, naming both, before anything starts."""

from __future__ import annotations

import pytest
import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.analysis.update_order import refuse_gradients_after_updates
from parallax.errors import AnalysisError
from parallax.tf2.trace import trace_step


def _gan_step(sequential: bool):
    import keras

    keras.utils.set_random_seed(0)
    discriminator = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1)], name="discriminator")
    generator = keras.Sequential([keras.Input((2,)), keras.layers.Dense(4)], name="generator")
    d_optimizer, g_optimizer = keras.optimizers.Adam(), keras.optimizers.Adam()
    loss_fn = keras.losses.BinaryCrossentropy(from_logits=True)

    @tf.function(input_signature=[tf.TensorSpec([None, 4]), tf.TensorSpec([None, 2])])
    def step(real, noise):
        with tf.GradientTape() as tape:
            fake = generator(noise)
            d_loss = loss_fn(tf.ones_like(real[:, :1]), discriminator(real)) + \
                loss_fn(tf.zeros_like(real[:, :1]), discriminator(fake))
        d_grads = tape.gradient(d_loss, discriminator.trainable_weights)
        if sequential:  # the guide: the discriminator updated before the generator's loss reads it
            d_optimizer.apply_gradients(zip(d_grads, discriminator.trainable_weights))
        with tf.GradientTape() as tape:
            g_loss = loss_fn(tf.ones_like(real[:, :1]), discriminator(generator(noise)))
        g_grads = tape.gradient(g_loss, generator.trainable_weights)
        if not sequential:
            d_optimizer.apply_gradients(zip(d_grads, discriminator.trainable_weights))
        g_optimizer.apply_gradients(zip(g_grads, generator.trainable_weights))
        return d_loss, g_loss

    return step


def test_a_step_that_differentiates_through_a_variable_it_has_updated_is_refused_naming_both():
    graph = trace_step(_gan_step(sequential=True)).graph
    analysis = analyse_graph(graph)
    refuse_gradients_after_updates(analysis.after_updates, sync=False)  # asynchronous PS: each worker its own
    with pytest.raises(AnalysisError, match=r'^the gradient of "generator[^"]*" \([^)]*\) is computed after the '
                                            r'update of "discriminator[^"]*" \("[^"]*"\) in the same step: '
                                            r"Parallax aggregates every gradient of a step across the replicas "
                                            r"before it applies the updates"):
        refuse_gradients_after_updates(analysis.after_updates, sync=True)


def test_a_step_that_computes_every_gradient_before_its_updates_is_taken():
    analysis = analyse_graph(trace_step(_gan_step(sequential=False)).graph)
    assert len(analysis.gradients) == 4 and analysis.after_updates == ""
