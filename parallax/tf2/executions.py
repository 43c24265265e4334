"""Keras's ``steps_per_execution`` in ``parallax.fit``: at which batches ``model.fit`` calls the callbacks' batch
hooks, and with which index.

A model compiled with ``steps_per_execution=N`` trains N batches in each call of ``model.fit``'s function and calls
the batch hooks around that call only: ``on_train_batch_begin`` with the first batch's index before it,
``on_train_batch_end`` with its last batch's index after it (a callback's ``stop_training`` is seen there only).
``parallax.fit`` trains batch by batch and calls the hooks where ``model.fit`` does (:class:`Executions`), so a
callback that counts batches, saves every ``save_freq`` of them or sets a rate before a batch acts at the same
batches.

The last execution of an epoch may find fewer than N batches. Keras 3 names its end ``first + N - 1`` whatever it
trained (its epoch iterator counts in whole executions). tf_keras names the last batch it trained where it knows the
epoch's length (its data handler shortens the last execution), ``first + N - 1`` where it does not. Where Keras 3
does not know the data's length before an epoch (a generator, a ``tf.data`` pipeline after ``filter()``), it calls
``on_train_batch_begin`` once more after the last batch, for the execution that finds the data exhausted
(:meth:`Executions.after`); of one step, that step also counts an optimizer step (:mod:`parallax.tf2.exhausted`),
of several, it does not.
"""

from __future__ import annotations

from typing import Any

__all__ = ["Executions"]


class Executions:
    """The executions of ``size`` batches each that ``model.fit`` splits an epoch into (``legacy``: tf_keras's)."""

    def __init__(self, size: int, legacy: bool) -> None:
        if size < 1:
            raise ValueError(f"parallax.fit: the model's steps_per_execution must be 1 or more, got {size}")
        self.size, self._legacy = size, legacy

    @classmethod
    def of(cls, model: Any, legacy: bool) -> Executions:
        """The executions of ``model``'s compiled ``steps_per_execution`` (tf_keras keeps it in a variable)."""
        if legacy:
            held = getattr(model, "_steps_per_execution", None)
            return cls(1 if held is None else int(held.numpy()), legacy)
        return cls(int(getattr(model, "steps_per_execution", 1) or 1), legacy)

    def begins(self, index: int) -> bool:
        """Whether batch ``index`` of an epoch (from 0) is the first of an execution."""
        return index % self.size == 0

    def ends(self, index: int, steps: int | None) -> bool:
        """Whether batch ``index`` ends its execution, in an epoch of ``steps`` batches (``None``: not known yet;
        an execution the data ends within ends where the data does, which the caller sees)."""
        return index % self.size == self.size - 1 or (steps is not None and index + 1 == steps)

    def after(self, trained: int) -> int:
        """The first batch of the execution after ``trained`` batches of an epoch: where Keras 3's ``model.fit``,
        not knowing the data's length, calls ``on_train_batch_begin`` once more and finds the data exhausted."""
        return -(-trained // self.size) * self.size

    def end_index(self, index: int, steps: int | None) -> int:
        """The index ``on_train_batch_end`` gets after batch ``index``, the last its execution trained."""
        named = index - index % self.size + self.size - 1
        return min(named, steps - 1) if self._legacy and steps is not None else named
