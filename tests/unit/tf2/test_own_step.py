"""parallax/tf2/own_step.py: a model's own train_step, its logs as model.fit makes them."""

from __future__ import annotations

import numpy as np
import pytest

import parallax


def _tracked(k):
    """keras-io's VAE, as its tf_keras version keeps its losses: Mean trackers held as the model's attributes
    (``total_loss`` logged as ``loss``: the logs name other than the metrics, so model.fit's epoch logs are its
    last step's), a metrics property, no compiled loss."""
    import tensorflow as tf

    class Tracked(k.Model):
        def __init__(self):
            super().__init__()
            self.dense = k.layers.Dense(1)
            self.total_loss_tracker = k.metrics.Mean(name="total_loss")
            self.kl_loss_tracker = k.metrics.Mean(name="kl_loss")

        @property
        def metrics(self):
            return [self.total_loss_tracker, self.kl_loss_tracker]

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(self(x, training=True) - y))
                kl = tf.reduce_mean(tf.square(self.dense.kernel))
                total = loss + kl
            self.optimizer.apply_gradients(zip(tape.gradient(total, self.trainable_weights), self.trainable_weights))
            self.total_loss_tracker.update_state(total)
            self.kl_loss_tracker.update_state(kl)
            return {"loss": self.total_loss_tracker.result(), "kl_loss": self.kl_loss_tracker.result()}

    k.utils.set_random_seed(4)
    model = Tracked()
    model.compile(optimizer=k.optimizers.SGD(0.05))
    return model


@pytest.mark.parametrize("flavor", ["keras", "tf_keras"])
def test_trackers_of_an_own_train_step_start_each_epoch_again_as_in_model_fit(flavor, tmp_path):
    """The epoch's logs of each epoch, equal to model.fit's: tf_keras's trackers were not found as the logs'
    sources (its variable's ``value`` is a method), the logs came from the job's copies, never reset, and the
    second epoch's were the mean of both (the probe of 2026-12-05: kl_loss 42 % off, said nowhere)."""
    import importlib

    k = importlib.import_module(flavor)
    rng = np.random.RandomState(0)
    x, y = rng.randn(32, 3).astype("float32"), rng.randn(32, 1).astype("float32")
    reference = _tracked(k).fit(x, y, batch_size=8, epochs=3, shuffle=False, verbose=0).history
    (tmp_path / "resource_info").write_text("localhost: cpu:0,cpu:1\n")
    history = parallax.fit(_tracked(k), x, y, batch_size=8, epochs=3, shuffle=False, verbose=0,
                           resource_info=str(tmp_path / "resource_info"),
                           parallax_config=parallax.Config(run_option="PS")).history  # 2 replicas here
    assert sorted(history) == sorted(reference) == ["kl_loss", "loss"]
    for key in reference:
        np.testing.assert_allclose(history[key], reference[key], rtol=1e-5)


def test_a_sum_tracker_of_an_own_train_step_is_said_to_count_every_replica(monkeypatch):
    """keras.metrics.Sum given the batch's loss in the model's own train_step sums the replicas' values of their
    parts: N times one device's (the probe's guide program logged loss_sum x2, silently); a Mean divides it out."""
    import keras

    from parallax.tf2 import own_step

    said: list[str] = []
    monkeypatch.setattr(own_step.log, "warning", lambda message, *args: said.append(message % args))
    model = type("Guide", (), {"metrics": [keras.metrics.Sum(name="loss_sum"), keras.metrics.Mean(name="loss")]})()
    own_step.warn_summed_trackers(model, 1)
    assert not said
    own_step.warn_summed_trackers(model, 4)
    assert len(said) == 1 and "updates loss_sum, a Sum" in said[0] and "4 times one device's" in said[0]
