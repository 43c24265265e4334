"""What ``parallax.fit``'s callbacks hook into between batches, and the batch logs they are given.

A callback with batch hooks of its own (not Keras's ``History`` and progress bar, which set nothing) may stop
training after a batch or set the learning rate between batches (:func:`batch_hooks`): ``parallax.fit`` then
agrees on the stop after every batch and reads the rate before each. The batch logs (the compiled metrics so
far, read eagerly from the model: about a millisecond a step) are computed after every batch for such a callback
unless its code shows that it reads neither them nor the model (:func:`reads_logs`: a timer that counts batches),
and for the progress bar alone only as often as it draws (:class:`BatchLogs`).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from parallax.tf2.evaluate import numbers
from parallax.tf2.hook_code import contained, loads_logs, reads_weights
from parallax.tf2.keras_flavor import Flavor

__all__ = ["BEGINS", "ENDS", "EPOCHS", "CallbackReach", "batch_hooks", "reads_logs", "weighs_within_epochs",
           "saves_within_epochs", "saves_after", "BatchLogs"]

BEGINS = ("on_train_batch_begin", "on_batch_begin")
ENDS = ("on_train_batch_end", "on_batch_end")
#: the hooks run between epochs (their batch counterparts' analysis, :func:`batch_hooks`, applies to them alike)
EPOCHS = ("on_epoch_begin", "on_epoch_end")


@dataclass(frozen=True)
class CallbackReach:
    """What the program's callbacks may do between batches and between epochs, as their code shows: read once at
    ``parallax.fit``'s start from the program's list, alike on every worker.

    Attributes:
        stops: an end-of-batch hook may stop training (:func:`batch_hooks` of :data:`ENDS`).
        sets: a batch hook may set a variable of the step, or anything else (:func:`batch_hooks`).
        weighs: a batch hook may read the model's weights (:func:`weighs_within_epochs`).
        saves: a callback saves the weights after some batches (:func:`saves_within_epochs`).
        reads: an end-of-batch hook may read the batch logs (:func:`reads_logs`).
        between_epochs: an epoch hook (:data:`EPOCHS`) may reach past its own callback.
    """

    stops: bool
    sets: bool
    weighs: bool
    saves: bool
    reads: bool
    between_epochs: bool

    @classmethod
    def of(cls, callbacks: list, flavor: Flavor) -> CallbackReach:
        return cls(stops=batch_hooks(callbacks, flavor, ENDS), sets=batch_hooks(callbacks, flavor, BEGINS + ENDS),
                   weighs=weighs_within_epochs(callbacks, flavor), saves=saves_within_epochs(callbacks),
                   reads=reads_logs(callbacks, flavor, ENDS), between_epochs=batch_hooks(callbacks, flavor, EPOCHS))


def batch_hooks(callbacks: list, flavor: Flavor, hooks: tuple[str, ...]) -> bool:
    """Whether a callback has batch ``hooks`` of its own that may reach past the callback itself (Keras's ``History``
    and progress bar aside, which set nothing; a hook whose code shows that it touches only its own state, a timer
    counting batches, aside: :func:`parallax.tf2.hook_code.contained`): one that may set ``model.stop_training``
    after a batch (``TerminateOnNaN``; ``model.fit`` then stops after that batch, and the workers agree after every
    batch whether to), or the learning rate or another variable of the step between batches (else read once an
    epoch)."""
    return any(not contained(c, _own(c, h)) for c, h in _hooks(callbacks, flavor, hooks))


def reads_logs(callbacks: list, flavor: Flavor, hooks: tuple[str, ...]) -> bool:
    """Whether a callback's own batch ``hooks`` may read the batch logs or the model's metrics: those of
    :func:`batch_hooks`, and a contained one that loads its ``logs``. A hook that reads neither (a timer counting
    batches) leaves ``parallax.fit`` to skip the logs of its batches, which ``model.fit`` has for free from its
    compiled step and Parallax reads from the model's metrics on the host (about a millisecond a batch)."""
    return any(not contained(c, _own(c, h)) or loads_logs(_own(c, h)) for c, h in _hooks(callbacks, flavor, hooks))


def weighs_within_epochs(callbacks: list, flavor: Flavor) -> bool:
    """Whether a callback's own batch hooks may read the model's weights (a norm logged after every batch, a
    prediction made every few: :func:`parallax.tf2.hook_code.reads_weights`): the model's variables must then hold
    the trained values after every batch, as in ``model.fit``, not only at each epoch's end."""
    prefix = f"{flavor.module.__name__.split('.')[0]}."
    # Keras's own callbacks (but a LambdaCallback's functions) read none between batches, but a ModelCheckpoint
    # that saves within epochs, which saves_after foresees
    theirs = [c for c in callbacks if not type(c).__module__.startswith(prefix)
              or isinstance(c, flavor.callbacks.LambdaCallback)]
    return any(not contained(c, _own(c, h)) and reads_weights(c, _own(c, h))
               for c, h in _hooks(theirs, flavor, BEGINS + ENDS))


def saves_within_epochs(callbacks: list) -> bool:
    """Whether a callback saves the weights after some batches (``ModelCheckpoint(save_freq=<int>)``,
    ``BackupAndRestore(save_freq=<int>)``): the model's
    variables must then hold the trained values after those batches, not only at each epoch's end."""
    return any(_saves_in_batches(c) for c in callbacks)


def saves_after(callbacks: list, batch: int) -> bool:
    """Whether a ``ModelCheckpoint`` or ``BackupAndRestore`` of ``callbacks`` with ``save_freq=<int>`` saves at the
    end of ``batch`` (of an epoch, from 0), as its own count of batches since it last saved says (Keras 3's and
    tf_keras's alike); where that
    count cannot be read, it is taken to."""
    for callback in filter(_saves_in_batches, callbacks):
        seen = getattr(callback, "_batches_seen_since_last_saving", None)
        last = getattr(callback, "_last_batch_seen", 0)
        if not isinstance(seen, int) or not isinstance(last, (int, type(None))):
            return True
        added = batch + 1 if last is None or batch <= last else batch - last  # a new epoch counts from its start
        if seen + added >= callback.save_freq:
            return True
    return False


def _saves_in_batches(callback: Any) -> bool:
    return type(callback).__name__ in ("ModelCheckpoint", "BackupAndRestore") and \
        isinstance(getattr(callback, "save_freq", "epoch"), int)


def _hooks(callbacks: list, flavor: Flavor, hooks: tuple[str, ...]) -> list[tuple[Any, str]]:
    """The callbacks' own batch ``hooks``, ``(callback, hook)`` (Keras's ``History`` and progress bar aside)."""
    base, quiet = flavor.callbacks.Callback, (flavor.callbacks.History, flavor.callbacks.ProgbarLogger)
    return [(c, h) for c in callbacks if not isinstance(c, quiet) for h in hooks if _own(c, h) is not getattr(base, h)]


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
