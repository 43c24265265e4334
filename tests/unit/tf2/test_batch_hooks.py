"""parallax.tf2.batch_hooks: where parallax.fit reads the batch logs and sums the metrics over the workers."""

from __future__ import annotations

import time

import numpy as np
import pytest
import tensorflow as tf

from parallax.tf2.batch_hooks import BatchLogs


class _Model:
    """A model whose metrics count how often they were summed (``flushes``) when they are read."""

    def __init__(self) -> None:
        self.flushes = 0
        self.reads: list[int] = []

    def flush(self) -> None:
        self.flushes += 1

    def get_metrics_result(self) -> dict:
        self.reads.append(self.flushes)
        return {"loss": float(self.flushes)}


@pytest.mark.parametrize("every_batch, bar, interval", [(True, True, 3600.0), (False, True, 3600.0),
                                                        (False, True, 0.0), (False, False, 0.0)])
def test_one_worker_sums_just_before_each_read_and_only_then(every_batch, bar, interval):
    model = _Model()
    logs = BatchLogs(model, every_batch, bar, steps=10, interval=interval, flush=model.flush, workers=1)
    for index in range(10):
        logs.after(index)
    assert model.reads == list(range(1, len(model.reads) + 1))  # every read sees a sum made just before it
    assert model.flushes == len(model.reads)  # and no sum is made that nothing reads


@pytest.mark.parametrize("chief", [True, False])
def test_several_workers_sum_after_every_batch_where_worker_0_may_read_the_logs(chief):
    """The sums are collectives: worker 0, which draws the bar (here when it may, at its interval), and a worker
    that draws nothing sum after the same batches: every one."""
    model = _Model()
    logs = BatchLogs(model, False, chief, steps=20, interval=3600.0, flush=model.flush, workers=2, read_alike=True)
    got = [logs.after(index) for index in range(20)]
    assert model.flushes == 20
    assert model.reads == ([1, 20] if chief else [])  # the bar's first draw and the epoch's last batch
    if chief:
        assert got[0] == {"loss": 1.0} and got[-1] == {"loss": 20.0}


def test_several_workers_that_nothing_reads_within_an_epoch_sum_at_its_end_only():
    model = _Model()
    logs = BatchLogs(model, False, False, steps=None, flush=model.flush, workers=3, read_alike=False)
    assert [logs.after(index) for index in range(5)] == [{}] * 5
    assert model.flushes == 0 and model.reads == []  # parallax.fit sums once, after the epoch's last batch


@pytest.mark.parametrize("module", ["keras", "tf_keras"])
def test_a_lambda_callbacks_batch_hook_is_its_own(module):
    """A ``LambdaCallback`` sets its hooks on the instance: one given ``on_train_batch_begin`` has a batch hook
    (it may set a loss's weight or the rate before each batch), one given only epoch hooks has none."""
    import importlib

    from parallax.tf2.batch_hooks import BEGINS, ENDS, batch_hooks
    from parallax.tf2.keras_flavor import flavor_of

    keras = importlib.import_module(module)
    flavor = flavor_of(keras.Sequential(), "parallax.fit", compiled=False)
    weight = tf.Variable(1.0)
    batch = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: weight.assign(0.5))
    epoch = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: weight.assign(0.5))
    quiet = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: None)  # touches nothing
    assert batch_hooks([epoch, batch], flavor, BEGINS + ENDS)
    assert not batch_hooks([epoch, quiet, keras.callbacks.History()], flavor, BEGINS + ENDS)


@pytest.mark.parametrize("module", ["keras", "tf_keras"])
def test_a_hook_that_reads_neither_its_logs_nor_the_model_is_seen_so_and_every_other_is_taken_to_read(module):
    """The batch logs are read from the model's metrics on the host (about a millisecond a batch): a timer's hook
    that counts batches is seen to read neither them nor the model, so parallax.fit skips them; a hook that uses its
    logs, the model, another method of its own, or takes ``**kwargs`` is taken to read them, as are Keras's own."""
    import importlib

    from parallax.tf2.batch_hooks import ENDS, reads_logs
    from parallax.tf2.keras_flavor import flavor_of

    keras = importlib.import_module(module)
    flavor = flavor_of(keras.Sequential(), "parallax.fit", compiled=False)
    base = keras.callbacks.Callback

    class Timer(base):
        steps = 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            self.last = [time.perf_counter() for _ in range(1)]

    class Logger(base):
        def on_train_batch_end(self, batch, logs=None):
            self.seen = {k: v for k, v in (logs or {}).items()}

    class Closure(base):
        def on_train_batch_end(self, batch, logs=None):
            self.later = lambda: logs

    class Metrics(base):
        def on_train_batch_end(self, batch, logs=None):
            self.accuracy = self.model.metrics[-1].result()

    class Helper(base):
        def on_train_batch_end(self, batch, logs=None):
            self.keep()

        def keep(self):
            self.kept = self.model.get_metrics_result()

    class Anything(base):
        def on_train_batch_end(self, batch, **kwargs):
            self.kwargs = kwargs

    def readers(*callbacks):
        return reads_logs(list(callbacks), flavor, ENDS)

    assert not readers(Timer(), keras.callbacks.History(), keras.callbacks.EarlyStopping())
    assert not readers(keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: None))
    for reader in (Logger(), Closure(), Metrics(), Helper(), Anything(), keras.callbacks.TerminateOnNaN(),
                   keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: print(logs["loss"]))):
        assert readers(Timer(), reader), type(reader).__name__


@pytest.mark.parametrize("module", ["keras", "tf_keras"])
def test_a_checkpoint_that_saves_within_epochs_is_foreseen_at_the_batches_it_saves(module, tmp_path):
    """``parallax.fit`` brings the trained weights into the model (every worker, collectively) only before the batches
    after which a ``ModelCheckpoint(save_freq=<int>)`` saves: foreseen from the checkpoint's own count, batch by batch,
    as the checkpoint then decides, across epochs of 5 batches; one that saves at each epoch's end is none."""
    import importlib

    from parallax.tf2.batch_hooks import saves_after, saves_within_epochs

    keras = importlib.import_module(module)
    every_epoch = keras.callbacks.ModelCheckpoint(str(tmp_path / "e.weights.h5"), save_weights_only=True)
    checkpoint = keras.callbacks.ModelCheckpoint(str(tmp_path / "b.weights.h5"), save_weights_only=True, save_freq=3)
    assert not saves_within_epochs([every_epoch]) and saves_within_epochs([every_epoch, checkpoint])
    foreseen, decided = [], []
    for _ in range(3):
        for batch in range(5):
            foreseen.append(saves_after([every_epoch, checkpoint], batch))
            decided.append(checkpoint._should_save_on_batch(batch))
    assert foreseen == decided and sum(decided) == 5


def _helper_step():  # a function of the program's: may set anything
    pass


def test_a_hook_that_calls_past_its_own_plain_data_is_taken_to_reach_anything():
    """A hook is known to touch nothing else only where every call it makes is a container's or a string's method, a
    plain built-in or a function of a module that reaches no variable (time, math, numpy...), and every attribute of
    its callback it names holds plain data: a helper object's method, TensorFlow's ``set_value`` on a variable the
    callback keeps, a function of the program's or one kept in an attribute, a property's setter or a class's own
    ``__setattr__`` may set the learning rate."""
    import keras

    from parallax.tf2.hook_code import contained

    rate = tf.Variable(0.1)

    class Scheduler:
        def step(self):
            rate.assign(rate * 0.5)

    class Hooks(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.times, self.seen, self.scheduler, self.rate, self.later = [0.5], {"a": np.zeros(2)}, Scheduler(), \
                rate, _helper_step

        def timer(self, batch, logs=None):
            self.times.append(time.perf_counter() - self.times[0])
            self.seen.update(b=np.mean(self.seen["a"]))

        def helper(self, batch, logs=None):
            self.scheduler.step()

        def set_value(self, batch, logs=None):
            tf.identity(self.times)  # TensorFlow: may reach a variable (tf.keras.backend.set_value)

        def kept_variable(self, batch, logs=None):
            self.last = self.rate

        def program_function(self, batch, logs=None):
            _helper_step()

        def kept_function(self, batch, logs=None):
            self.later(batch)

        @property
        def warmup(self):
            return float(rate.numpy())

        @warmup.setter
        def warmup(self, value):
            rate.assign(value)

        def property_setter(self, batch, logs=None):
            self.warmup = 0.01 * (batch + 1)

    class Watched(keras.callbacks.Callback):
        steps = 0

        def __setattr__(self, name, value):
            super().__setattr__(name, value)
            rate.assign(0.5)

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1

    hooks = Hooks()
    assert contained(hooks, Hooks.timer)
    for reaching in (Hooks.helper, Hooks.set_value, Hooks.kept_variable, Hooks.program_function, Hooks.kept_function,
                     Hooks.property_setter):
        assert not contained(hooks, reaching), reaching.__name__
    assert not contained(Watched(), Watched.on_train_batch_end)


def test_an_attribute_a_callback_holds_only_later_is_as_plain_as_what_sets_it():
    """An attribute a hook names that the callback does not hold when ``fit`` reads the hooks (set in
    ``on_epoch_begin`` or ``on_train_begin``) is plain data where every method of the callback's class that sets it
    sets plain data (a timer's start and count); one set from the model (a kernel the hook then reads) may hold
    anything, and the hook then reads the model between steps."""
    import keras

    from parallax.tf2.hook_code import contained

    class EpochTimer(keras.callbacks.Callback):  # benchmarks/tf2_runs.py's, and the common timing callback's shape
        def on_epoch_begin(self, epoch, logs=None):
            self.start, self.steps = time.perf_counter(), 0

        def on_train_batch_end(self, batch, logs=None):
            self.steps += 1
            self.last = time.perf_counter() - self.start

    class KernelNorms(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.norms: list = []

        def on_train_begin(self, logs=None):
            self.kernel = self.model.trainable_weights[0]

        def on_train_batch_end(self, batch, logs=None):
            self.norms.append(float(np.linalg.norm(self.kernel)))

    class Stored(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.step = tf.Variable(0)  # TensorFlow: not plain

        def on_train_batch_end(self, batch, logs=None):
            self.count = self.step

    assert contained(EpochTimer(), EpochTimer.on_train_batch_end)
    assert not contained(KernelNorms(), KernelNorms.on_train_batch_end)
    assert not contained(Stored(), Stored.on_train_batch_end)


def _weights_norm(model):  # a function of the program's that reads the weights
    return float(np.linalg.norm(model.get_weights()[0]))


def test_a_batch_hook_that_may_read_the_weights_is_found_by_its_code():
    """A hook needs the weights trained so far where its code, a method of its callback's it calls, a function of the
    program's or a closure's it calls, or the code that set an attribute it reads names how a model's weights are
    read (``get_weights``, ``trainable_weights``, ``layers``, ``kernel``, ``predict``...); TensorBoard, a timer, and
    a callback that sets the learning rate each batch do not (the model is brought up to date only for the first)."""
    import keras

    from parallax.tf2.batch_hooks import weighs_within_epochs
    from parallax.tf2.hook_code import reads_weights
    from parallax.tf2.keras_flavor import flavor_of

    class Direct(keras.callbacks.Callback):
        def on_train_batch_end(self, batch, logs=None):
            self.last = self.model.get_weights()

    class Helper(keras.callbacks.Callback):
        def _log(self):
            return [layer.name for layer in self.model.layers]

        def on_train_batch_end(self, batch, logs=None):
            self._log()

    class Program(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.norm = _weights_norm(self.model)

    class Kept(keras.callbacks.Callback):
        def on_train_begin(self, logs=None):
            self.table = self.model.trainable_weights[0]

        def on_train_batch_end(self, batch, logs=None):
            self.last = float(np.sum(self.table))

    class Rate(keras.callbacks.Callback):
        def on_train_batch_begin(self, batch, logs=None):
            self.model.optimizer.learning_rate.assign(0.1 / (batch + 1))

    model = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
    seen = keras.callbacks.LambdaCallback(on_train_batch_end=lambda batch, logs: print(model.get_weights()))
    for reading in (Direct(), Helper(), Program(), Kept()):
        hook = "on_train_batch_begin" if isinstance(reading, Program) else "on_train_batch_end"
        assert reads_weights(reading, getattr(type(reading), hook)), type(reading).__name__
    assert reads_weights(seen, seen.on_train_batch_end)
    assert not reads_weights(Rate(), Rate.on_train_batch_begin)
    board = keras.callbacks.TensorBoard(update_freq="batch")
    assert not reads_weights(board, type(board).on_train_batch_end)
    flavor = flavor_of(model, "test", compiled=False)
    assert weighs_within_epochs([board, Rate(), Kept()], flavor)
    saving = keras.callbacks.ModelCheckpoint("m.weights.h5", save_weights_only=True)  # saves_after's
    assert not weighs_within_epochs([board, Rate(), keras.callbacks.TerminateOnNaN(), saving], flavor)


@pytest.mark.parametrize("module", ["keras", "tf_keras"])
def test_what_the_callbacks_may_do_between_epochs_is_read_from_their_epoch_hooks(module):
    """parallax.fit brings the trained weights into the model at an epoch's end only where something may read
    them then: an epoch hook that touches only its callback's own data (a timer) cannot, nor can Keras's History
    and progress bar; one that names the model, a LambdaCallback's, and Keras's other callbacks
    (EarlyStopping, ModelCheckpoint...) may."""
    import importlib

    from parallax.tf2.batch_hooks import CallbackReach
    from parallax.tf2.keras_flavor import flavor_of

    keras = importlib.import_module(module)
    flavor = flavor_of(keras.Sequential(), "parallax.fit", compiled=False)

    class Timer(keras.callbacks.Callback):
        def on_epoch_begin(self, epoch, logs=None):
            self.start = time.perf_counter()

        def on_epoch_end(self, epoch, logs=None):
            self.seconds = time.perf_counter() - self.start

    class Norm(keras.callbacks.Callback):
        def on_epoch_end(self, epoch, logs=None):
            self.norm = sum(float((w ** 2).sum()) for w in self.model.get_weights())

    quiet = [Timer(), keras.callbacks.History(), keras.callbacks.ProgbarLogger()]
    assert not CallbackReach.of(quiet, flavor).between_epochs
    assert not CallbackReach.of(quiet, flavor).sets
    for other in (Norm(), keras.callbacks.EarlyStopping(), keras.callbacks.LambdaCallback(on_epoch_end=print)):
        assert CallbackReach.of([*quiet, other], flavor).between_epochs, other
