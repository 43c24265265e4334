"""parallax.tf2.batch_hooks: where parallax.fit reads the batch logs and sums the metrics over the workers."""

from __future__ import annotations

import pytest

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
    batch = keras.callbacks.LambdaCallback(on_train_batch_begin=lambda batch, logs: None)
    epoch = keras.callbacks.LambdaCallback(on_epoch_begin=lambda epoch, logs: None)
    assert batch_hooks([epoch, batch], flavor, BEGINS + ENDS)
    assert not batch_hooks([epoch, keras.callbacks.History()], flavor, BEGINS + ENDS)
