"""A ``tf.function`` step's checkpoints in the program's own form (``CheckPointConfig.checkpoint``).

A TensorFlow 2 program saves its state as objects (``tf.train.Checkpoint(model=model,
optimizer=optimizer)``), not under graph names. With ``CheckPointConfig(ckpt_dir, save_ckpt_steps
or save_ckpt_secs, checkpoint=that Checkpoint)``, a traced step's job keeps checkpoints of that form
in ``ckpt_dir`` (a ``tf.train.CheckpointManager``'s ``ckpt-<step>`` files, the last five kept):

* **restore**: before the step is traced, every process restores the latest checkpoint of
  ``ckpt_dir`` into the program's objects, as the single-device program would before its loop
  (variables made later, an optimizer's slots made when the step is traced, take their saved values
  when they are made). The traced graph's variables start from those values, and the job's start-up
  makes every worker's equal to worker 0's. Once the step is traced, a checkpoint that does not fit
  the objects (one of their variables absent from it, or saved with another shape) is refused,
  naming the file;
* **save**: worker 0 writes the trained values into the program's variables
  (:meth:`DistributedStep.sync_variables`) and saves the checkpoint every ``save_ckpt_steps`` calls
  of the step (counted on from the step of the restored checkpoint) or ``save_ckpt_secs`` seconds,
  and when the step is closed; the other workers save nothing.

So a checkpoint restores into the plain single-device program with
``tf.train.Checkpoint(model=model, optimizer=optimizer).restore(path)``, and into a job of any
mode and worker count.
"""

from __future__ import annotations

import re
import time
from typing import Any

import tensorflow as tf

from parallax.errors import CheckpointError
from parallax.job.paths import CKPT_DIR, check_directory
from parallax.logs import log

__all__ = ["StepCheckpoints", "step_checkpoints"]

#: Checkpoints a job keeps (as ``tf.compat.v1.train.Saver`` keeps by default).
KEPT = 5


def step_checkpoints(config: Any) -> StepCheckpoints | None:
    """The checkpoints a traced step's job keeps under ``config`` (a ``parallax.Config``), or ``None``.

    Raises:
        ValueError: ``ckpt_dir`` is set without ``checkpoint`` (a traced step's variables have no names the
            program could restore), or with ``zero_stage`` (its slots in parts are not saved this way yet).
    """
    ckpt = config.ckpt_config
    if not ckpt.ckpt_dir:
        return None
    if ckpt.checkpoint is None:
        raise ValueError("CheckPointConfig: a tf.function step's checkpoints are saved in the program's own form: "
                         "pass checkpoint=tf.train.Checkpoint(model=model, optimizer=optimizer) (the objects whose "
                         "state the step trains) with ckpt_dir")
    if config.zero_stage:
        raise ValueError("CheckPointConfig.checkpoint with zero_stage: a tf.function step's optimizer slots that "
                         "ZeRO keeps in parts are not saved in the program's form yet; train without zero_stage, "
                         "or without checkpoints")
    return StepCheckpoints(ckpt)


class StepCheckpoints:
    """The checkpoints of a traced step's job (see the module docstring).

    Args:
        ckpt_config: the ``CheckPointConfig``, with ``ckpt_dir`` and ``checkpoint`` set.
    """

    def __init__(self, ckpt_config: Any) -> None:
        self._checkpoint = ckpt_config.checkpoint
        self._directory = ckpt_config.ckpt_dir
        self._every_steps = ckpt_config.save_ckpt_steps
        self._every_secs = ckpt_config.save_ckpt_secs
        self._restored: str | None = None
        self._status: Any = None
        self._manager: tf.train.CheckpointManager | None = None
        self.step = 0  # the steps trained, counted on from the restored checkpoint's
        self._saved = -1  # the step of the last save
        self._last_save = time.monotonic()

    @property
    def directory(self) -> str:
        """``CheckPointConfig.ckpt_dir``."""
        return self._directory

    @property
    def restored(self) -> str | None:
        """The checkpoint restored at start, or ``None``."""
        return self._restored

    def restore(self) -> None:
        """Restore the latest checkpoint of ``ckpt_dir`` into the program's objects (before the trace).

        Raises:
            CheckpointError: it cannot be read, or a variable it holds has another shape.
        """
        path = tf.train.latest_checkpoint(self._directory)
        if path is None:
            return
        try:
            self._status = self._checkpoint.restore(path)
        except (ValueError, tf.errors.OpError) as e:
            raise CheckpointError(f"{CKPT_DIR}: the checkpoint {path} does not restore into the step's objects "
                                  f"(CheckPointConfig.checkpoint): {_first_line(e)}") from None
        self._restored = path
        found = re.search(r"-(\d+)$", path)
        self.step = int(found.group(1)) if found else 0

    def check_restored(self) -> None:
        """After the trace (every variable made): refuse a checkpoint that leaves one of the objects' variables
        without a value, or gave one another shape.

        Raises:
            CheckpointError: naming the checkpoint file and what does not fit.
        """
        if self._status is None:
            return
        try:
            self._status.assert_existing_objects_matched()
        except (AssertionError, ValueError) as e:
            raise CheckpointError(f"{CKPT_DIR}: the checkpoint {self._restored} does not fit the step's objects "
                                  f"(CheckPointConfig.checkpoint), so training would not go on from it: "
                                  f"{_first_line(e)}. Name another ckpt_dir, or restore the objects it was saved "
                                  "from") from None

    def start(self, chief: bool) -> None:
        """The job has started: worker 0 (``chief``) keeps the checkpoints from now on."""
        if not chief:
            return
        check_directory(CKPT_DIR, self._directory, "to save the step's checkpoints in and restore the latest from")
        self._manager = tf.train.CheckpointManager(self._checkpoint, self._directory, max_to_keep=KEPT,
                                                   checkpoint_name="ckpt")
        self._last_save = time.monotonic()

    def after_step(self, step: Any) -> None:
        """One more step trained: worker 0 saves when one is due."""
        self.step += 1
        if self._manager is None:
            return
        due = (self._every_steps is not None and self.step % self._every_steps == 0) or \
            (self._every_secs is not None and time.monotonic() - self._last_save >= self._every_secs)
        if due:
            self.save(step)

    def save(self, step: Any) -> str | None:
        """Worker 0: the trained values into the program's variables, then a checkpoint of them."""
        if self._manager is None or self._saved == self.step:
            return None
        step.sync_variables()
        path = self._manager.save(checkpoint_number=self.step)
        self._last_save, self._saved = time.monotonic(), self.step
        log.info("parallax: saved the step's checkpoint %s (step %d)", path, self.step)
        return path


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__
