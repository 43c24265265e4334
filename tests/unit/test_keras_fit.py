"""parallax.fit, evaluate and predict: their checks, batches, parts and gather order (parallax/keras_fit.py and
evaluate.py), without processes."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.keras_fit import split_validation
from parallax.tf2.batch_parts import parts
from parallax.tf2.batches import FitBatches
from parallax.tf2.evaluate import global_batches, in_order, worker_part


def test_a_model_that_is_not_compiled_is_refused_saying_what_to_do():
    import keras

    model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)])
    with pytest.raises(ValueError, match=r"^parallax.fit: the model is not compiled; call model.compile\("):
        parallax.fit(model, np.zeros((4, 2)), np.zeros((4, 1)), resource_info="unused")


def test_something_other_than_a_keras_model_is_refused():
    with pytest.raises(TypeError, match=r"^parallax.fit: model must be a Keras 3 model \(keras.Model\) or a tf_keras "
                                        r"one \(tf_keras.Model\), got str"):
        parallax.fit("model", np.zeros((4, 2)), np.zeros((4, 1)), resource_info="unused")


def test_each_replica_takes_its_equal_part_of_each_global_batch():
    batch = {"ids": np.arange(12).reshape(6, 2), "mask": np.arange(6)}
    mine = parts(batch, 3, 1, 1)  # worker 1 of 3
    np.testing.assert_array_equal(mine[0]["mask"], [2, 3])
    two = parts(np.arange(8), 2, 1, 2)  # worker 1 of 2, 2 replicas each: parts 2 and 3 of 4
    np.testing.assert_array_equal(two[0], [4, 5])
    np.testing.assert_array_equal(two[1], [6, 7])


def _keras_batches(x, y, batch_size, shuffle, epochs=2, **more):
    """What Keras 3's own ``model.fit`` would train on: the batches its trainer draws (recorded by a model whose
    step only records them), after ``keras.utils.set_random_seed(5)``."""
    import keras
    import tensorflow as tf

    seen = []

    class Recorder(keras.Model):
        def train_step(self, data):
            seen.append(data[0])
            return {"n": 0.0}

    keras.utils.set_random_seed(5)
    model = Recorder()
    model.compile(optimizer="sgd", run_eagerly=True)
    model.fit(x, y, batch_size=batch_size, epochs=epochs, shuffle=shuffle, verbose=0, **more)
    return [tf.nest.map_structure(np.asarray, b) for b in seen]


def _parallax_batches(x, y, batch_size, shuffle, epochs=2, steps_per_epoch=None):
    import keras

    keras.utils.set_random_seed(5)
    model = keras.Sequential([keras.layers.Input((1,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse")
    batches = FitBatches("keras", model, x, y, None, batch_size, steps_per_epoch, shuffle, None, 0, epochs, 0)
    return [b[0][0] for _, epoch in batches.epochs(0, epochs) for b in epoch], batches


@pytest.mark.parametrize("shuffle", [False, True], ids=["in-order", "shuffled"])
def test_the_epochs_are_the_batches_keras_fit_draws_in_its_order(shuffle):
    x, y = np.arange(10.0)[:, None], np.arange(10.0)[:, None]
    mine, batches = _parallax_batches(x, y, 4, shuffle)
    assert batches.steps == 3
    expected = _keras_batches(x, y, 4, shuffle)
    assert [b[:, 0].tolist() for b in mine] == [b[:, 0].tolist() for b in expected]
    if not shuffle:
        assert [b[:, 0].tolist() for b in mine[:3]] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_a_reshuffling_dataset_is_not_iterated_outside_the_epochs():
    import keras
    import tensorflow as tf

    def dataset():  # made under the same global seed both times (Dataset.shuffle's seed combines with it)
        keras.utils.set_random_seed(5)
        pairs = tf.data.Dataset.from_tensor_slices((np.arange(8.0)[:, None], np.arange(8.0)[:, None]))
        return pairs.shuffle(8, seed=1).batch(4)

    mine, batches = _parallax_batches(dataset(), None, None, False)
    expected = _keras_batches(dataset(), None, None, False)
    assert [b[:, 0].tolist() for b in mine] == [b[:, 0].tolist() for b in expected]
    assert len({tuple(b[:, 0]) for b in mine}) == 4  # reshuffled: the second epoch is another order
    assert batches.signature[0].shape.as_list() == [None, 1]


def test_a_batch_that_does_not_split_evenly_is_padded_with_examples_of_weight_zero():
    from parallax.tf2.batch_parts import even_parts
    from parallax.tf2.part_loss import part_loss

    x, y, w = np.arange(5.0)[:, None], np.arange(5.0), np.array([1, 1, 1, 1, 2], np.float32)
    (px, py, pw), size, examples = even_parts((x, y, w), 4)
    assert (size, examples) == (2, 5) and px[:, 0].tolist() == [0, 1, 2, 3, 4, 0, 0, 0]
    np.testing.assert_allclose(pw, [1, 1, 1, 1, 2, 0, 0, 0])
    # each part trains on its real examples (the step cuts the padding off), its whole loss (a weighted mean over
    # them, plus a term counted once and an activity term, a mean over them too) weighed by them against its share:
    # the replicas' mean is the batch's loss on one device
    loss, activity = (px[:, 0] - 10.0) ** 2, px[:, 0] * 0.1
    share, total = examples / 4, []
    for k in range(4):
        real = min(max(examples - k * size, 0), size)
        rows = slice(k * size, k * size + max(real, 1))
        part = np.sum(loss[rows] * pw[rows]) / max(real, 1) + 0.5 + np.mean(activity[rows])
        total.append(float(part_loss(tf.constant(part, tf.float32), tf.constant(real), tf.constant(share))))
    one_device = np.sum(((x[:, 0] - 10.0) ** 2) * w) / 5 + 0.5 + np.mean(x[:, 0] * 0.1)
    np.testing.assert_allclose(np.mean(total), one_device, rtol=1e-6)
    (fed_x, _, fed_w), size, _ = even_parts((x[:4], y[:4], None), 2)  # even: as it is, weights of one
    assert size == 2 and fed_x.shape == (4, 1) and fed_w.tolist() == [1, 1, 1, 1]


def test_weights_per_output_are_padded_each_and_ones_are_shaped_for_each_outputs_rank():
    from parallax.tf2.batch_parts import even_parts
    from parallax.tf2.part_loss import per_example

    weights = {"score": np.array([1, 2, 3], np.float32), "tags": np.ones((3, 4), np.float32)}
    (_, _, fed), size, _ = even_parts((np.arange(3.0), np.arange(3.0), weights), 2)
    assert size == 2 and fed["score"].tolist() == [1, 2, 3, 0] and fed["tags"].shape == (4, 4)
    assert fed["tags"][3].tolist() == [0] * 4
    ones = tf.ones([2])
    shaped = per_example(ones, [tf.zeros([2, 1]), tf.zeros([2, 4, 3])])  # a score, and a tag per time step
    assert shaped[0].shape == (2,) and shaped[1].shape == (2, 1)
    assert per_example(ones, {"a": tf.zeros([2, 1]), "b": tf.zeros([2, 3])}).shape == (2,)  # alike: one for all


@pytest.mark.parametrize("examples, workers", [(10, 2), (7, 3), (2, 3), (0, 2), (5, 1)],
                         ids=["even", "uneven", "fewer-than-workers", "empty", "one-worker"])
def test_the_workers_parts_of_a_batch_hold_every_example_once_in_order(examples, workers):
    batch = (np.arange(examples), {"w": np.arange(examples) * 10})
    mine = [worker_part(batch, workers, w) for w in range(workers)]
    assert np.concatenate([m[0] for m in mine]).tolist() == list(range(examples))
    assert [len(m[0]) for m in mine] == [len(p) for p in np.array_split(np.arange(examples), workers)]
    np.testing.assert_array_equal(np.concatenate([m[1]["w"] for m in mine]), np.arange(examples) * 10)


def test_a_missing_target_or_weight_stays_missing_in_each_part():
    assert worker_part((np.arange(4), None, None), 2, 1)[1:] == (None, None)


def test_the_gathered_predictions_come_back_in_the_original_order():
    examples, workers, batch = 11, 3, 4  # batches of 4, 4, 3: parts [2,1,1], [2,1,1], [1,1,1]
    x = np.arange(examples)
    per_worker = [[None] * 3 for _ in range(workers)]
    for i, start in enumerate(range(0, examples, batch)):
        for w in range(workers):
            part = worker_part(x[start:start + batch], workers, w)
            per_worker[w][i] = {"y": part * 2, "z": part[:, None]} if len(part) else None
    got = in_order(per_worker)
    np.testing.assert_array_equal(got["y"], x * 2)
    np.testing.assert_array_equal(got["z"][:, 0], x)


def test_a_batch_smaller_than_the_workers_leaves_empty_parts_out_of_the_gather():
    per_worker = [[np.array([0]), np.array([2])], [np.array([1]), None], [None, None]]
    np.testing.assert_array_equal(in_order(per_worker), [0, 1, 2])


def test_arrays_are_evaluated_in_global_batches_in_order_the_last_as_short_as_it_is():
    x, y = np.arange(10)[:, None], np.arange(10)
    count, batches = global_batches(x, y, None, 4, None, "test")
    cut = list(batches)
    assert count == len(cut) == 3
    assert [b[1].tolist() for b in cut] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]
    assert all(b[2] is None for b in cut)
    count, batches = global_batches(x, y, None, 4, 2, "test")
    assert count == 2 and [b[1].tolist() for b in batches] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def test_a_dataset_is_evaluated_as_it_yields_its_batches():
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((np.arange(5), np.arange(5) * 2)).batch(2)
    count, batches = global_batches(dataset, None, None, None, None, "test")
    cut = list(batches)
    assert count is None
    assert [b[1].tolist() for b in cut] == [[0, 2], [4, 6], [8]] and cut[0][2] is None


def test_evaluate_and_predict_with_no_job_run_alone_saying_so_at_warning(parallax_warnings, monkeypatch):
    import keras

    from parallax.tf2 import evaluate

    # a job an earlier test of this process ran (parallel_run of a tf.function step) would be this process's job
    monkeypatch.setattr(evaluate, "_JOB", [])

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.layers.Input((2,)), keras.layers.Dense(1)])
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    x, y = np.random.RandomState(0).randn(7, 2), np.random.RandomState(1).randn(7, 1)
    got = parallax.evaluate(model, x, y, batch_size=3, verbose=0)
    np.testing.assert_allclose(got, model.evaluate(x, y, batch_size=3, verbose=0), rtol=1e-6)
    np.testing.assert_allclose(parallax.predict(model, x, batch_size=3, verbose=0),
                               model.predict(x, batch_size=3, verbose=0), rtol=1e-6)
    said = "\n".join(parallax_warnings)
    assert "parallax.evaluate: no job has started in this process (parallax.fit, or parallel_run of a" in said
    assert "parallax.predict: no job has started in this process" in said


def _tiny(keras_module=None):
    import keras

    k = keras_module or keras
    k.utils.set_random_seed(0)
    model = k.Sequential([k.layers.Input((2,)), k.layers.Dense(3, activation="softmax")])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model


def test_tf_keras_backup_and_restore_is_refused_saying_how_to_restore(tmp_path):
    import tf_keras

    callback = tf_keras.callbacks.BackupAndRestore(str(tmp_path))
    with pytest.raises(ValueError, match=r"^parallax.fit: tf_keras's BackupAndRestore keeps its state through "
                                         r"tf.distribute's .* \(model.load_weights\) and pass initial_epoch"):
        parallax.fit(_tiny(tf_keras), np.zeros((4, 2)), np.zeros((4,)), callbacks=[callback], resource_info="unused")


@pytest.mark.parametrize("arguments, message", [
    (dict(class_weight={0: 1.0}, sample_weight=np.ones(4)), "class_weight goes with arrays x, y and no sample_weight"),
    (dict(validation_split=0.5, validation_data=(np.zeros((2, 2)), np.zeros(2))), "validation_split cuts arrays"),
    (dict(validation_split=1.5), r"validation_split must be a number in \[0, 1\), got 1.5"),
], ids=["class-and-sample-weights", "split-and-validation-data", "split-out-of-range"])
def test_weights_and_splits_that_model_fit_does_not_take_are_refused(arguments, message):
    with pytest.raises(ValueError, match=rf"^parallax.fit: {message}"):
        parallax.fit(_tiny(), np.zeros((4, 2)), np.zeros((4,)), resource_info="unused", **arguments)


def test_class_weights_are_the_sample_weights_model_fit_makes_of_them():
    import keras

    y = np.array([0, 1, 2, 1, 0, 2, 2, 1])
    model = keras.Sequential([keras.layers.Input((1,)), keras.layers.Dense(3)])
    model.compile(optimizer="sgd", loss="sparse_categorical_crossentropy")
    batches = FitBatches("keras", model, np.zeros((8, 1)), y, None, 4, None, False, {0: 0.5, 2: 3.0}, 0, 1, 0)
    weights = [b[2].tolist() for _, epoch in batches.epochs(0, 1) for b, _ in epoch]
    assert weights == [[0.5, 1, 3, 1], [0.5, 3, 3, 1]]  # class 1 weighs 1, as in model.fit


def test_validation_split_holds_out_the_last_examples_and_their_weights():
    train, held = split_validation((np.arange(10), np.arange(10) * 2, None), 0.2)
    assert [a.tolist() for a in train[:2]] == [list(range(8)), [2 * i for i in range(8)]] and train[2] is None
    assert [a.tolist() for a in held[:2]] == [[8, 9], [16, 18]]


def test_tf_keras_models_evaluate_and_predict_as_tf_keras_does_alone():
    import tf_keras

    model = _tiny(tf_keras)
    x, y = np.random.RandomState(0).randn(7, 2), np.array([0, 1, 2, 1, 0, 2, 2])
    np.testing.assert_allclose(parallax.evaluate(model, x, y, batch_size=3, verbose=0),
                               model.evaluate(x, y, batch_size=3, verbose=0), rtol=1e-6)
    np.testing.assert_allclose(parallax.predict(model, x, batch_size=3, verbose=0),
                               model.predict(x, batch_size=3, verbose=0), rtol=1e-6)


def _custom_model(k):
    import tensorflow as tf

    class Custom(k.Model):  # Keras's guide "Customizing what happens in fit()", its first example
        def __init__(self):
            super().__init__()
            self.dense = k.layers.Dense(1)

        def call(self, x):
            return self.dense(x)

        def train_step(self, data):
            x, y = data
            with tf.GradientTape() as tape:
                y_pred = self(x, training=True)
                loss = self.compiled_loss(y, y_pred) if hasattr(self, "compiled_loss") and not hasattr(
                    self, "compute_loss") else self.compute_loss(y=y, y_pred=y_pred)
            gradients = tape.gradient(loss, self.trainable_variables)
            self.optimizer.apply_gradients(zip(gradients, self.trainable_variables))
            for metric in self.metrics:
                if metric.name == "loss":
                    metric.update_state(loss)
                else:
                    metric.update_state(y, y_pred)
            return {m.name: m.result() for m in self.metrics}

    k.utils.set_random_seed(2)
    model = Custom()
    model.compile(optimizer="sgd", loss="mse", metrics=["mae"])
    return model


@pytest.mark.parametrize("flavor", ["keras", "tf_keras"])
def test_a_model_with_its_own_train_step_trains_with_it_as_model_fit_does(flavor, tmp_path):
    import importlib

    k = importlib.import_module(flavor)
    rng = np.random.RandomState(0)
    x, y = rng.randn(16, 2).astype(np.float32), rng.randn(16, 1).astype(np.float32)
    reference = _custom_model(k)
    expected = reference.fit(x, y, batch_size=4, epochs=2, verbose=0).history
    model = _custom_model(k)
    (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
    got = parallax.fit(model, x, y, batch_size=4, epochs=2, verbose=0, resource_info=str(tmp_path / "resource_info"))
    assert sorted(got.history) == sorted(expected)
    for key, values in expected.items():
        np.testing.assert_allclose(got.history[key], values, rtol=1e-5, err_msg=key)
    for a, b in zip(model.trainable_variables, reference.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5)


def test_callbacks_that_write_files_run_on_worker_0_alone_subclasses_too(tmp_path):
    import keras

    from parallax.tf2.evaluate import chief_or_shared
    from parallax.tf2.keras_flavor import flavor_of

    class Checkpoints(keras.callbacks.ModelCheckpoint):
        pass

    writers = [Checkpoints(str(tmp_path / "m.weights.h5"), save_weights_only=True),
               keras.callbacks.CSVLogger(str(tmp_path / "log.csv")), keras.callbacks.TensorBoard(str(tmp_path))]
    stopping = keras.callbacks.EarlyStopping(monitor="loss", patience=1)
    flavor = flavor_of(_tiny(), "parallax.fit")
    assert chief_or_shared([*writers, stopping], flavor, chief=True) == [*writers, stopping]
    assert chief_or_shared([*writers, stopping], flavor, chief=False) == [stopping]


def test_the_workers_batches_are_compared_by_their_values_strings_too():
    from parallax.tf2.batches import check_same

    class Two:  # a group of two workers whose second holds other batches when ``differ``
        def __init__(self, differ):
            self.differ = differ

        def gather(self, value):
            return [value, value + 1 if self.differ else value]

    batch = ({"city": np.array(["a", "b"], dtype=object), "n": np.arange(2)}, np.zeros(2), None)
    copy = ({"city": np.array(["a", "b"], dtype=object), "n": np.arange(2)}, np.zeros(2), None)
    digests = []

    class Record:
        def gather(self, value):
            digests.append(value)
            return [value]

    check_same(Record(), batch, 0)
    check_same(Record(), copy, 0)
    assert digests[0] == digests[1]  # the same strings in another object array: the same batch
    check_same(Two(False), batch, 0)
    with pytest.raises(ValueError, match=r"^parallax.fit: the workers' data gave different global batches at the "
                                         r"start of epoch 3"):
        check_same(Two(True), batch, 3)


def test_batches_drawn_ahead_come_in_order_and_an_error_comes_at_its_batch():
    from parallax.tf2.batches import Ahead

    def draws():
        yield from range(3)
        raise OSError("file 4 unreadable")

    got = []
    with pytest.raises(OSError, match="file 4 unreadable"):
        for item in Ahead(draws()):
            got.append(item)
    assert got == [0, 1, 2]


def test_a_consumer_that_stops_early_stops_the_drawing_thread_and_closes_the_batches():
    import threading

    from parallax.tf2.batches import Ahead

    closed = []

    def draws():
        try:
            yield from range(100)
        finally:
            closed.append(True)

    items = Ahead(draws(), depth=2)
    assert [next(items), next(items)] == [0, 1]
    items.close()
    assert closed == [True]
    assert not [t for t in threading.enumerate() if t.name == "parallax-batches"]


@pytest.mark.parametrize("flavor", ["keras", "tf_keras"])
def test_a_callback_with_batch_hooks_of_its_own_may_stop_within_an_epoch_keras_own_do_not(flavor):
    import importlib

    from parallax.tf2.batch_hooks import BEGINS, ENDS, batch_hooks
    from parallax.tf2.keras_flavor import Flavor, TfKerasFlavor

    module = importlib.import_module(flavor)
    callbacks = module.callbacks

    class Timer(callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            pass

    own = (Flavor if flavor == "keras" else TfKerasFlavor)(module)
    assert not batch_hooks([callbacks.History(), callbacks.ProgbarLogger(), Timer(), callbacks.EarlyStopping()],
                           own, BEGINS + ENDS)
    assert batch_hooks([callbacks.TerminateOnNaN()], own, ENDS)


def test_a_model_whose_class_overrides_fit_is_said_at_warning(parallax_warnings):
    """keras-hub's task models prepare the data in their own ``fit`` (arrays into an unshuffled dataset, then
    their preprocessor), which ``parallax.fit`` does not run: said, with what to pass for the same batches."""
    import keras

    from parallax.tf2.own_step import warn_own_fit

    class Prepared(keras.Sequential):
        def fit(self, x=None, y=None, **kwargs):
            return super().fit(x, y, shuffle=False, **kwargs)

    class Trained(Prepared):  # the override found where it is, in a base class
        pass

    warn_own_fit(_tiny(), keras)
    assert parallax_warnings == []
    warn_own_fit(Trained([keras.layers.Input((2,)), keras.layers.Dense(1)]), keras)
    (said,) = parallax_warnings
    assert said.startswith("parallax.fit: Trained overrides model.fit (tests.unit.test_keras_fit.Prepared.fit), "
                           "which parallax.fit does not run")
    assert "pass shuffle=False, or the prepared tf.data.Dataset" in said


@pytest.mark.parametrize("every_batch, bar, interval, computed", [
    (True, True, 3600.0, [0, 1, 2, 3]),   # a callback's own batch hooks read them: every batch's
    (False, True, 3600.0, [0, 3]),        # the progress bar alone: when it may draw, and at the epoch's last batch
    (False, True, 0.0, [0, 1, 2, 3]),     # ... which, drawing at every update, is every batch
    (False, False, 0.0, []),              # nothing reads them
])
def test_the_batch_logs_are_computed_where_something_reads_them(every_batch, bar, interval, computed):
    from parallax.tf2.batch_hooks import BatchLogs

    class Model:
        calls: list = []

        def get_metrics_result(self):
            self.calls.append(len(self.calls))
            return {"loss": float(len(self.calls))}

    model = Model()
    logs = BatchLogs(model, every_batch, bar, steps=4, interval=interval)
    got = [logs.after(index) for index in range(4)]
    assert model.calls == list(range(len(computed)))
    assert [g.get("loss") for g in got] == ([None] * 4 if not computed else
                                            [float(computed.index(max(c for c in computed if c <= i)) + 1)
                                             for i in range(4)])


def test_only_keras_3_data_of_unknown_length_is_counted_and_what_parallax_fit_cannot_write_there_is_said(monkeypatch):
    """Keras 3 runs the writes of the step that wait for no batch at each epoch's end only where the data's length is
    unknown (not a dataset of known cardinality, not arrays); those parallax.fit does not make (a dropout's seed
    state) are said, by name."""
    import keras

    from parallax.tf2 import exhausted

    said: list[str] = []
    monkeypatch.setattr(exhausted.log, "warning", lambda message, *args: said.append(message % args))
    keras.utils.set_random_seed(1)
    model = keras.Sequential([keras.Input((1,)), keras.layers.Dense(1), keras.layers.Dropout(0.5)])
    model.compile(keras.optimizers.SGD(0.1), "mse")
    x, y = np.zeros((8, 1), np.float32), np.zeros((8, 1), np.float32)
    dataset = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(4)
    assert FitBatches("keras", model, dataset, None, None, None, None, False, None, 0, 2, 0).exhausts
    known = dataset.apply(tf.data.experimental.assert_cardinality(2))
    assert not FitBatches("keras", model, known, None, None, None, None, False, None, 0, 2, 0).exhausts
    assert not FitBatches("keras", model, x, y, None, 4, None, False, None, 0, 2, 0).exhausts

    @tf.function(input_signature=[tf.TensorSpec([None, 1]), tf.TensorSpec([None, 1])])
    def step(a, b):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean((model(a, training=True) - b) ** 2)
        model.optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    assert exhausted.exhausted_step(model, step, False) == exhausted.ExhaustedStep()
    found = exhausted.exhausted_step(model, step, True)
    assert found.counted == (model.optimizer.iterations,)
    seed_state = model.layers[-1].seed_generator.state.path  # "seed_generator_N/...": Keras numbers the names it gives
    assert found.others == (seed_state,)
    exhausted.warn_uncounted(exhausted.ExhaustedStep(counted=found.counted))
    assert not said
    exhausted.warn_uncounted(found)
    assert len(said) == 1 and seed_state in said[0] and "assert_cardinality" in said[0] \
        and "steps_per_epoch" in said[0]


def _counted_fit(fit, model, data) -> tuple[list, int]:
    """``fit`` of ``model`` on ``data`` for 3 epochs, Adam's count at each epoch's end and after."""
    seen: list[int] = []
    import keras

    counts = keras.callbacks.LambdaCallback(on_epoch_end=lambda *_: seen.append(int(model.optimizer.iterations)))
    fit(model, data, epochs=3, verbose=0, callbacks=[counts])
    return seen, int(model.optimizer.iterations)


@pytest.mark.parametrize("own", [False, True], ids=["compiled-step", "own-train-step"])
@pytest.mark.parametrize("replicas", [1, 2])
def test_data_of_unknown_length_counts_the_step_that_finds_it_exhausted_as_keras_does(tmp_path, own, replicas):
    """Keras 3's model.fit on data of unknown length (a dataset after filter()) counts one optimizer step more than
    it trains at each epoch's end (15 after 3 epochs of 4 batches, 5 in the first on_epoch_end), which Adam's bias
    correction reads from the second epoch on: parallax.fit counts it too, for the compiled step and a model's own
    train_step, with one replica and two; the weights equal model.fit's."""
    import keras

    def build():
        keras.utils.set_random_seed(3)
        if own:
            model = _custom_model(keras)
            model.compile(optimizer=keras.optimizers.Adam(0.1), loss="mse", metrics=["mae"])
            return model
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.1), "mse")
        return model

    rng = np.random.RandomState(0)
    x, y = rng.randn(16, 2).astype(np.float32), rng.randn(16, 1).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(4)
    reference = build()
    expected = _counted_fit(lambda m, d, **kw: m.fit(d, **kw), reference, data)
    assert expected == ([5, 10, 15], 15)  # Keras's own count: if it changes, so must parallax.fit
    (tmp_path / "resource_info").write_text(f"localhost: {','.join(f'cpu:{i}' for i in range(replicas))}\n")
    model = build()
    got = _counted_fit(lambda m, d, **kw: parallax.fit(m, d, resource_info=str(tmp_path / "resource_info"),
                                                       parallax_config=parallax.Config(run_option="PS"), **kw),
                       model, data)  # PS: the replicas in this process
    assert got == expected
    for a, b in zip(model.trainable_variables, reference.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def _gan_model(k):
    """A GAN of Keras's "Customizing what happens in fit()" shape, its two optimizers its own (no compiled one), both
    gradients taken before either update (parallax.fit refuses a step that differentiates through an update), its
    noise a function of the batch (random draws per replica cannot equal one device's)."""

    class GAN(k.Model):
        def __init__(self):
            super().__init__()
            self.discriminator = k.Sequential([k.Input((2,)), k.layers.Dense(1)])
            self.generator = k.Sequential([k.Input((2,)), k.layers.Dense(2)])

        def compile(self, d_optimizer, g_optimizer):
            super().compile()
            self.d_optimizer, self.g_optimizer = d_optimizer, g_optimizer

        def train_step(self, data):
            real, _ = data
            noise = 0.5 * real + 1.0  # drawn per example, alike on any number of replicas
            with tf.GradientTape(persistent=True) as tape:
                fake = self.discriminator(self.generator(noise))
                d_loss = tf.reduce_mean(fake) - tf.reduce_mean(self.discriminator(real))
                g_loss = -tf.reduce_mean(fake)
            d_grads = tape.gradient(d_loss, self.discriminator.trainable_weights)
            g_grads = tape.gradient(g_loss, self.generator.trainable_weights)
            self.d_optimizer.apply_gradients(zip(d_grads, self.discriminator.trainable_weights))
            self.g_optimizer.apply_gradients(zip(g_grads, self.generator.trainable_weights))
            return {"d_loss": d_loss}

    return GAN()


@pytest.mark.parametrize("kind", ["loss-scale", "accumulating", "gan"])
def test_data_of_unknown_length_counts_the_exhausted_step_in_the_optimizers_keras_counts_it_in(tmp_path, kind):
    """Keras 3 counts the exhausted step in an optimizer whose count does not wait for the batch: not a
    LossScaleOptimizer's (12 after 3 epochs of 4 batches) nor gradient accumulation's (6), but each of a GAN's own
    two (15): parallax.fit counts as model.fit does, on 2 replicas; the weights equal model.fit's."""
    import keras

    def build():
        keras.utils.set_random_seed(3)
        if kind == "gan":
            model = _gan_model(keras)
            model.compile(keras.optimizers.Adam(0.1), keras.optimizers.Adam(0.05))
            return model
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
        model.compile(keras.optimizers.LossScaleOptimizer(keras.optimizers.Adam(0.1)) if kind == "loss-scale"
                      else keras.optimizers.Adam(0.1, gradient_accumulation_steps=2), "mse")
        return model

    def counted(fit, model) -> list:
        optimizers = (model.d_optimizer, model.g_optimizer) if kind == "gan" else (model.optimizer,)
        seen: list = []
        counts = keras.callbacks.LambdaCallback(
            on_epoch_end=lambda *_: seen.append([int(o.iterations) for o in optimizers]))
        fit(model, epochs=3, verbose=0, callbacks=[counts])
        return seen

    rng = np.random.RandomState(0)
    x, y = rng.randn(16, 2).astype(np.float32), rng.randn(16, 1).astype(np.float32)
    data = tf.data.Dataset.from_tensor_slices((x, y)).filter(lambda a, b: True).batch(4)
    reference = build()
    expected = counted(lambda m, **kw: m.fit(data, **kw), reference)
    assert expected == {"loss-scale": [[4], [8], [12]], "accumulating": [[2], [4], [6]],
                        "gan": [[5, 5], [10, 10], [15, 15]]}[kind]  # Keras's own: if it changes, so must parallax.fit
    (tmp_path / "resource_info").write_text("localhost: cpu:0,cpu:1\n")
    model = build()
    got = counted(lambda m, **kw: parallax.fit(m, data, resource_info=str(tmp_path / "resource_info"),
                                               parallax_config=parallax.Config(run_option="PS"), **kw), model)
    assert got == expected
    for a, b in zip(model.trainable_variables, reference.trainable_variables):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6)


def test_arrays_whose_last_batch_a_models_own_train_step_cannot_split_are_refused_before_any_step(tmp_path):
    import keras

    rng = np.random.RandomState(0)
    x, y = rng.randn(9, 2).astype(np.float32), rng.randn(9, 1).astype(np.float32)
    model = _custom_model(keras)
    before = [v.numpy() for v in model.trainable_variables]
    (tmp_path / "resource_info").write_text("localhost: cpu:0,cpu:1\n")
    with pytest.raises(ValueError, match="a batch of 1 examples does not split into 2 equal parts"):
        parallax.fit(model, x, y, batch_size=4, epochs=2, verbose=0, resource_info=str(tmp_path / "resource_info"),
                     parallax_config=parallax.Config(run_option="PS"))  # two replicas in this process
    assert int(model.optimizer.iterations) == 0  # refused before the first step
    for a, b in zip(model.trainable_variables, before):
        np.testing.assert_array_equal(a.numpy(), b)


def test_batches_drawn_while_the_step_runs_come_one_a_step_in_order():
    """Once the consumer says when its step runs, the thread draws the next batch only then (its Python work does not
    hold the interpreter while the work between steps needs it), and every batch still comes, in order."""
    import time

    from parallax.tf2.batches import Ahead

    drawn = []

    def draws():
        for item in range(6):
            drawn.append(item)
            yield item

    items = Ahead(draws(), depth=2)
    got = [next(items)]
    items.running()
    time.sleep(0.2)
    before = len(drawn)  # the first ones ahead, then one for the step that runs
    time.sleep(0.2)
    assert len(drawn) == before  # no more until the next step runs
    for item in items:
        got.append(item)
        items.running()
    assert got == list(range(6))
    items.close()


@pytest.mark.parametrize("between, syncs", [("timer", 1), ("validation", 2), ("reads-weights", 3)])
def test_the_model_gets_the_trained_weights_between_epochs_where_something_may_read_them(tmp_path, monkeypatch,
                                                                                          between, syncs):
    """Bringing the trained weights (and the optimizer's slots) into the model takes about 5 % of an epoch of model
    A of benchmarks/tf2.py: parallax.fit does it at an epoch's end where something may read them then (a callback
    whose epoch hooks reach past its own data, a validation that epoch), and else once, when training ends. Every
    way, each epoch's end sees what model.fit's sees and the trained weights equal model.fit's."""
    import keras

    from parallax.tf2.step import DistributedStep

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seen.append((logs or {}).get("loss"))

    class Reader(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.seen.append([w.copy() for w in self.model.get_weights()])

    def build():
        keras.utils.set_random_seed(3)
        model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(3), keras.layers.Dense(1)])
        model.compile(keras.optimizers.Adam(0.05), "mse")
        return model

    def run(train, model):
        callback = (Reader if between == "reads-weights" else Timer)()
        callback.seen = []
        more = {"validation_data": (x[:8], y[:8]), "validation_freq": 2} if between == "validation" else {}
        history = train(model, x, y, batch_size=4, epochs=3, verbose=0, callbacks=[callback], **more).history
        return history, callback.seen

    rng = np.random.RandomState(0)
    x, y = rng.randn(16, 2).astype(np.float32), rng.randn(16, 1).astype(np.float32)
    reference = build()
    expected, expected_seen = run(lambda m, *a, **kw: m.fit(*a, **kw), reference)
    calls = []
    sync = DistributedStep.sync_variables
    monkeypatch.setattr(DistributedStep, "sync_variables", lambda self, *a, **kw: calls.append(1) or
                        sync(self, *a, **kw))
    (tmp_path / "resource_info").write_text("localhost: cpu:0,cpu:1\n")
    model = build()
    got, got_seen = run(lambda m, *a, **kw: parallax.fit(m, *a, resource_info=str(tmp_path / "resource_info"),
                                                         parallax_config=parallax.Config(run_option="PS"), **kw),
                        model)  # PS: the replicas in this process
    assert len(calls) == syncs
    assert sorted(got) == sorted(expected)
    for key, values in expected.items():
        np.testing.assert_allclose(got[key], values, rtol=1e-5, err_msg=key)
    for mine, theirs in zip(got_seen, expected_seen, strict=True):
        for a, b in zip(tf.nest.flatten(mine), tf.nest.flatten(theirs), strict=True):
            np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6)
    for a, b in zip(model.weights + model.optimizer.variables, reference.weights + reference.optimizer.variables,
                    strict=True):
        np.testing.assert_allclose(a.numpy(), b.numpy(), rtol=1e-5, atol=1e-6, err_msg=a.path)


def test_pipelines_run_without_autotuning_unless_the_program_turned_it_on():
    """Keras makes a new iterator of its pipeline at each epoch's end, and an autotuned one's destructor waits for
    its autotuning thread's next wake-up (up to 0.6 s an epoch, docs/benchmarks.md): parallax.fit runs the pipeline
    Keras makes over arrays, and a dataset of the program's own whose options leave autotuning unset, without it
    (the batches stay model.fit's: the tests above); a dataset whose options turn it on keeps it, in Keras 3 and
    tf_keras alike."""
    x, y = np.arange(10.0)[:, None], np.arange(10.0)[:, None]
    _, batches = _parallax_batches(x, y, 4, True)
    assert batches._iterator._distributed_dataset.options().autotune.enabled is False
    import keras
    import tf_keras

    data = tf.data.Dataset.from_tensor_slices((x, y)).batch(4)
    tuned = tf.data.Options()
    tuned.autotune.enabled = True
    for flavor, module in (("keras", keras), ("tf_keras", tf_keras)):
        model = module.Sequential([module.layers.Input((1,)), module.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse")
        for dataset, expected in ((data, False), (data.with_options(tuned), True)):
            own = FitBatches(flavor, model, dataset, None, None, None, None, False, None, 0, 1, 0)
            iterated = own._handler._dataset if flavor == "tf_keras" else own._iterator._distributed_dataset
            assert iterated.options().autotune.enabled is expected, (flavor, expected)


def test_tf_keras_reading_a_sequence_on_workers_trains_as_its_model_fit(tmp_path):
    """tf_keras's ``model.fit`` takes ``workers``, ``use_multiprocessing`` and ``max_queue_size`` for a generator or a
    ``Sequence`` (threads that read it ahead, in order); ``parallax.fit`` takes them too (a TypeError until
    2026-12-07)."""
    import tf_keras

    class Batches(tf_keras.utils.Sequence):
        def __len__(self):
            return 5

        def __getitem__(self, index):
            rng = np.random.RandomState(index)
            return rng.randn(4, 2).astype("float32"), rng.randint(0, 3, 4)

    queue = dict(workers=2, use_multiprocessing=False, max_queue_size=3)
    expected = _tiny(tf_keras)
    history = expected.fit(Batches(), epochs=2, verbose=0, **queue)
    model = _tiny(tf_keras)
    (tmp_path / "resource_info").write_text("localhost: cpu:0\n")
    got = parallax.fit(model, Batches(), epochs=2, verbose=0, resource_info=str(tmp_path / "resource_info"), **queue)
    np.testing.assert_allclose(got.history["loss"], history.history["loss"], rtol=1e-5)
    for want, have in zip(expected.get_weights(), model.get_weights()):
        np.testing.assert_allclose(have, want, rtol=1e-5)


def test_the_reading_arguments_of_tf_keras_are_refused_for_a_keras_3_model_as_its_model_fit_does():
    with pytest.raises(TypeError, match=r"^parallax.fit: workers, use_multiprocessing is an argument of tf_keras's "
                                        r"model.fit, which Keras 3's does not take"):
        parallax.fit(_tiny(), np.zeros((4, 2)), np.zeros((4,)), workers=2, use_multiprocessing=True,
                     resource_info="unused")
    import tf_keras

    with pytest.raises(TypeError, match=r"^parallax.fit: workers must be an int or None, got str '2'"):
        parallax.fit(_tiny(tf_keras), np.zeros((4, 2)), np.zeros((4,)), workers="2", resource_info="unused")
