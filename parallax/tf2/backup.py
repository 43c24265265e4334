"""Keras 3's ``BackupAndRestore`` in ``parallax.fit``: the restore before the job is made, the backups on worker 0.

``model.fit`` with ``keras.callbacks.BackupAndRestore(backup_dir)`` restores, when training begins, the weights
and the optimizer's variables (its step count and slots too) of the last backup in ``backup_dir`` and the epoch
to go on from (``model._initial_epoch``, which ``model.fit`` reads after ``on_train_begin``); it backs up at each
epoch's end (or every ``save_freq`` batches) and deletes the backup when training ends. A job that was stopped
(preempted, killed) and is started again with the same command goes on from its last backup.

``parallax.fit`` makes the job's variables from the model's when the step is traced, before any callback runs, so
the restore runs first (:func:`restore_backups`): every worker runs the callback's own ``on_train_begin`` on its
model before the trace (the weights file of the callback's own format, read as Keras reads it), and the workers
then check that they restored alike (:func:`check_restored_alike`: ``backup_dir`` must be a directory every
worker reads, as ``tf.distribute`` asks of it). The backups are written by worker 0 alone, as other callbacks that
write files (:data:`parallax.tf2.evaluate.CHIEF_ONLY`), with the trained weights and the optimizer's whole slots
in the model (``parallax.fit`` brings them in at each epoch's end, and after the batches a ``save_freq`` of
batches saves at: :func:`parallax.tf2.batch_hooks.saves_after`).

``tf_keras``'s ``BackupAndRestore`` keeps its state through ``tf.distribute``'s worker training state, which a
Parallax job has not: refused, naming the way round.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf

from parallax.tf2.digest import digest

__all__ = ["NAME", "restore_backups", "check_restored_alike"]

#: The class name of Keras's callback (Keras 3's and ``tf_keras``'s alike).
NAME = "BackupAndRestore"


def restore_backups(model: Any, callbacks: list | None, legacy: bool) -> list:
    """Run the ``on_train_begin`` of each ``BackupAndRestore`` of ``callbacks`` on ``model`` (on every worker,
    before the job's variables are made from the model's): the last backup's weights, optimizer variables and epoch
    (``model._initial_epoch``) restored as ``model.fit`` restores them. Returns those callbacks.

    Raises:
        ValueError: a ``tf_keras`` model (``legacy``) with a ``BackupAndRestore``.
    """
    found = [c for c in callbacks or [] if type(c).__name__ == NAME]
    if found and legacy:
        raise ValueError("parallax.fit: tf_keras's BackupAndRestore keeps its state through tf.distribute's worker "
                         "training state, which a Parallax job has not; restore before parallax.fit on every worker "
                         "(model.load_weights) and pass initial_epoch, and save with ModelCheckpoint (Keras 3's "
                         "BackupAndRestore is taken)")
    for callback in found:
        callback.set_model(model)
        callback.on_train_begin()
    return found


def restored_state(model: Any, found: list) -> tuple[bool, int | None, int]:
    """What a worker restored from the backups of ``found``: whether it found one, the epoch to go on from
    (``model._initial_epoch``) and a digest of the model's and its optimizer's variables (0 where none was found:
    the workers' own initial values may differ, the job starts from worker 0's)."""
    if not any(tf.io.gfile.exists(c._weights_path) for c in found):
        return False, None, 0
    optimizer = getattr(model, "optimizer", None)
    return True, getattr(model, "_initial_epoch", None), digest([*model.weights,
                                                                 *(getattr(optimizer, "variables", None) or [])])


def check_restored_alike(group: Any, model: Any, found: list) -> None:
    """Every worker restored the same backup (the same variables and epoch), or none: else a ``ValueError`` on every
    worker alike, naming the workers that differ from worker 0 and the directory."""
    if not found:
        return
    every = group.gather(restored_state(model, found))
    differ = [i for i, state in enumerate(every) if state != every[0]]
    if differ:
        raise ValueError(f"parallax.fit: BackupAndRestore restored another backup from {found[0].backup_dir!r} on "
                         f"worker {', '.join(map(str, differ))} than on worker 0 ({_said(every[0])} there, "
                         f"{_said(every[differ[0]])} on worker {differ[0]}): the backup directory must be one that "
                         "every worker reads (a shared file system), as worker 0 writes it")


def _said(state: tuple[bool, int | None, int]) -> str:
    found, epoch, _ = state
    return f"a backup of epoch {epoch or 0}" if found else "none"
