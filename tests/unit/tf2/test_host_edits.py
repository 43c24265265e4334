"""A callback that changes the model's weights while parallax.fit trains is refused, naming the weights and the
hook (parallax/tf2/host_edits.py): the job trains its own copies and would not see the change."""

from __future__ import annotations

import numpy as np
import pytest

import parallax
from parallax.tf2.host_edits import HostEdits


def _model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(2, name="first"), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    return model


def test_weights_set_where_the_model_and_the_job_agree_pass_and_a_change_is_named():
    model = _model()
    edits = HostEdits(model)
    edits.check("on_train_begin")
    model.layers[0].kernel.assign(model.layers[0].kernel.numpy() * 0.5)
    with pytest.raises(ValueError, match=r"changed the model's weights \(sequential\w*/first/kernel\) in on_epoch_end"):
        edits.check("on_epoch_end")
    edits.agree()  # written back from the job
    edits.check("on_epoch_begin")


@pytest.mark.parametrize("hook", ["on_train_begin", "on_epoch_end"])
def test_parallax_fit_refuses_a_callback_that_sets_weights(tmp_path, hook):
    import keras

    class Halves(keras.callbacks.Callback):
        def halve(self, *_):
            self.model.set_weights([w * 0.5 for w in self.model.get_weights()])

    callback = Halves()
    setattr(callback, hook, callback.halve)
    model = _model()
    rng = np.random.RandomState(0)
    (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
    with pytest.raises(ValueError, match=f"a callback changed the model's weights .* in {hook}"):
        parallax.fit(model, rng.randn(16, 4).astype("float32"), rng.randn(16, 1).astype("float32"), batch_size=8,
                     epochs=2, verbose=0, callbacks=[callback], resource_info=str(tmp_path / "resource_info"))
