"""``parallax.fit`` on one worker trains what ``model.fit`` trains, to the bit.

``model.fit`` traces its step with the batch size its iterator states where every batch has it (arrays that split
into whole batches, a dataset batched with ``drop_remainder=True``), and TensorFlow's gradients then divide by
constants where a size is known: ``GlobalAveragePooling1D``'s mean by the sequence's length, which TensorFlow's graph
optimizer turns into a product by its reciprocal (``x * 0.2`` is not ``x / 5`` in the last bit). ``parallax.fit``
traced every step with an open batch dimension and divided for real: the table and its Adam moments were a few
ulps off ``model.fit``'s after one step (2026-12-06: 2,065 of the elements below differed; not the Dense kernels,
nor anything of a ``Flatten`` model). On one replica it now traces with that batch size too; where the size is not
stated (a short last batch) both divide for real.

Keras 3's epoch logs too: the job's copy of a metric's state (the loss tracker's total) is reset with the model's at
each epoch's start, so each step adds to zero as ``model.fit``'s does (the copy ran on over the epochs, and a step's
sum taken as its difference from that running total lost the last bits: 0.67193049 against 0.67193055 in the
second epoch below)."""

import numpy as np
import pytest
import tensorflow as tf

from tests.models import averaged_embedding_model


@pytest.mark.parametrize("flavor, examples, form", [
    ("keras", 96, "arrays"),  # whole batches: a static batch size, shuffled as fit shuffles
    ("keras", 100, "arrays"),  # a short last batch: no static size
    ("keras", 100, "drop_remainder"),
    ("tf_keras", 96, "arrays"),
    ("tf_keras", 100, "drop_remainder"),
])
def test_one_worker_trains_the_bits_model_fit_trains(tmp_path, flavor, examples, form):
    import importlib

    import parallax

    module = importlib.import_module(flavor)
    rng = np.random.RandomState(4)
    x, y = rng.randint(0, 300, (examples, 5)), rng.randint(0, 2, (examples, 1)).astype(np.float32)

    def data():
        if form == "arrays":
            return {"x": x, "y": y, "batch_size": 16}
        return {"x": tf.data.Dataset.from_tensor_slices((x, y)).batch(16, drop_remainder=True)}

    def metrics():  # a metric of its own state (AUC's thresholds' counts) beside a mean
        return ["accuracy", module.metrics.AUC(name="auc")]

    reference = averaged_embedding_model(module, metrics())
    expected = reference.fit(**data(), epochs=2, verbose=0)
    (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
    model = averaged_embedding_model(module, metrics())
    got = parallax.fit(model, **data(), epochs=2, verbose=0, resource_info=str(tmp_path / "resource_info"))
    assert got.history == expected.history
    for mine, theirs in zip(model.weights + model.optimizer.variables,
                            reference.weights + reference.optimizer.variables, strict=True):
        np.testing.assert_array_equal(np.asarray(mine), np.asarray(theirs), err_msg=mine.name)
