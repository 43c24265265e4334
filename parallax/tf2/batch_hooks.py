"""What ``parallax.fit``'s callbacks hook into between batches, and the batch logs they are given.

A callback with batch hooks of its own (not Keras's ``History`` and progress bar, which set nothing) may stop
training after a batch or set the learning rate between batches (:func:`batch_hooks`): ``parallax.fit`` then
agrees on the stop after every batch and reads the rate before each. The batch logs (the compiled metrics so
far, read eagerly from the model: about a millisecond a step) are computed for such a callback after every batch,
and for the progress bar alone only as often as it draws (:class:`BatchLogs`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from parallax.tf2.evaluate import numbers
from parallax.tf2.keras_flavor import Flavor

__all__ = ["BEGINS", "ENDS", "batch_hooks", "BatchLogs"]

BEGINS = ("on_train_batch_begin", "on_batch_begin")
ENDS = ("on_train_batch_end", "on_batch_end")


def batch_hooks(callbacks: list, flavor: Flavor, hooks: tuple[str, ...]) -> bool:
    """Whether a callback has batch ``hooks`` of its own (Keras's ``History`` and progress bar aside, which set
    nothing): one that may set ``model.stop_training`` after a batch (``TerminateOnNaN``; ``model.fit`` then stops
    after that batch, and the workers agree after every batch whether to), or the learning rate between batches
    (else it is read once an epoch)."""
    base, quiet = flavor.callbacks.Callback, (flavor.callbacks.History, flavor.callbacks.ProgbarLogger)
    return any(not isinstance(c, quiet) and any(_own(c, h) is not getattr(base, h) for h in hooks) for c in callbacks)


def _own(callback: Any, hook: str) -> Any:
    """The function ``callback`` runs at ``hook``: its class's, or one set on the instance (a ``LambdaCallback``'s)."""
    found = getattr(callback, hook, None)
    return getattr(found, "__func__", found)


class BatchLogs:
    """The logs ``on_train_batch_end`` gets after batch ``index`` of an epoch of ``steps`` (``None``: unknown).

    Every batch's own where a callback's batch hooks read them (``every_batch``). Where only the progress bar
    does (``bar``), as often as it draws them (Keras's ``Progbar`` redraws at most every ``interval`` seconds and
    shows the values of the update that draws): after ``interval`` seconds since the last, and at an epoch's last
    batch (the one it finalises with); between those the last ones, which the bar does not draw. Else none.

    Where the steps keep what they add to the metrics on each worker (:meth:`DistributedStep.defer_sums`),
    ``flush`` sums it over the workers into the metrics. One worker: just before the logs are read. Several: the
    sum is a collective, made at batches every worker knows alike: after every batch where worker 0 may read the
    logs (``read_alike``: a progress bar is shown or a callback of the program's has batch hooks, which the
    program's arguments say on every worker), else only at the epoch's end (:func:`parallax.keras_fit.fit`).
    """

    def __init__(self, model: Any, every_batch: bool, bar: bool, steps: int | None, interval: float = 0.05,
                 flush: Callable[[], Any] | None = None, workers: int = 1, read_alike: bool = False) -> None:
        self._model, self._every, self._bar, self._steps, self._interval = model, every_batch, bar, steps, interval
        self._flush, self._workers, self._read_alike = flush, workers, read_alike
        self._logs: dict = {}
        self._at = -float("inf")

    def after(self, index: int) -> dict:
        now = time.monotonic()
        if self._flush is not None and self._workers > 1 and self._read_alike:
            self._flush()  # on every worker, after every batch: worker 0 may read them now
        if self._every or (self._bar and (now - self._at >= self._interval or index + 1 == self._steps)):
            if self._flush is not None and self._workers == 1:
                self._flush()
            self._logs, self._at = numbers(self._model.get_metrics_result()), now
        return self._logs
