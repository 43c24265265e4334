"""A launched rank's side of preemption: SIGTERM (or the launcher's SIGUSR1) ends the job with a checkpoint.

What Kubernetes, Slurm and spot machines send before they take a machine away is SIGTERM, to the launcher or to
the ranks. A rank that gets SIGTERM tells the launcher (its heartbeat, :meth:`~parallax.launch.monitor.Heartbeat.
preempt`), which passes the request to every rank as SIGUSR1 through mpirun (:class:`~parallax.launch.runner.
Preemption`); a SIGTERM to the launcher does the same. Every rank then knows; only the chief acts: after the
next ``sess.run`` it completes (a step boundary) it saves a checkpoint of the single-device graph's names in
``CheckPointConfig.ckpt_dir`` (with the global step in its name) and exits with
:data:`~parallax.launch.runner.PREEMPTED_EXIT_CODE`, which ends the job. The other ranks go on until then: a
synchronous step needs the chief, so none of them gets past the step the chief saved, and none stops before
the chief (which would leave the chief waiting inside a step). The checkpoint is therefore the state after
every step trained before the chief stopped, and a relaunch of the same command resumes from it.
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any

import tensorflow as tf

from parallax.launch.runner import PREEMPT_GRACE, PREEMPTED_EXIT_CODE
from parallax.logs import log as logger
from parallax.paths import CHECKPOINT_BASENAME

__all__ = ["install", "installed", "requested", "saved_by_the_step", "step_saves", "end", "PreemptionHook"]

_requested = threading.Event()
_installed = threading.Event()
_step_saves = threading.Event()  # a tf.function step's job saves its own checkpoints (parallax/tf2/step.py)


def install(notify: Callable[[], None]) -> None:
    """Take SIGTERM (``notify`` tells the launcher) and SIGUSR1 (the launcher's request) in this process: both
    ask for the job to end with a checkpoint. Only from the main thread, once."""
    if _installed.is_set() or threading.current_thread() is not threading.main_thread():
        return

    def on_term(signum, frame) -> None:
        if not _requested.is_set():
            _requested.set()
            notify()
            # bounded: a job that is not ended by then (no launcher left to end it) ends this process
            timer = threading.Timer(PREEMPT_GRACE + 10, _give_up)
            timer.daemon = True
            timer.start()

    def on_usr1(signum, frame) -> None:
        _requested.set()

    signal.signal(signal.SIGTERM, on_term)
    signal.signal(signal.SIGUSR1, on_usr1)
    _installed.set()


def _give_up() -> None:
    logger.warning("Parallax: asked to end %.0f s ago (SIGTERM), and the job has not ended: this process ends",
                   PREEMPT_GRACE + 10)
    os._exit(PREEMPTED_EXIT_CODE)


def installed() -> bool:
    """Whether this process takes SIGTERM as a request to end the job with a checkpoint."""
    return _installed.is_set()


def requested() -> bool:
    """Whether this process was asked to end the job with a checkpoint."""
    return _requested.is_set()


def step_saves() -> bool:
    """Whether the job of this process's current session leaves the preemption save to its ``tf.function`` step."""
    return _step_saves.is_set()


def saved_by_the_step() -> None:
    """Worker 0 of a ``tf.function`` step's job saves the step's own checkpoint (``CheckPointConfig.checkpoint``)
    and ends itself (:func:`end`) after the step under way: :class:`PreemptionHook` leaves it to the step."""
    _step_saves.set()


def end(said: str) -> None:
    """Worker 0 has done what it could (``said``): say so and end with the preempted exit code."""
    logger.warning("Parallax: preempted: the chief %s; exiting with code %d", said, PREEMPTED_EXIT_CODE)
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(PREEMPTED_EXIT_CODE)  # not SystemExit: the exit barriers would wait for ranks still in a step


class PreemptionHook(tf.compat.v1.train.SessionRunHook):
    """The chief's: once preemption is requested, save a checkpoint after the ``run`` under way and exit.

    Args:
        saver: the chief's saver over the single-device names (``None``: nothing can be saved).
        ckpt_dir: ``CheckPointConfig.ckpt_dir``.
        why_not: when nothing can be saved, why (for the message).
    """

    def __init__(self, saver: Any, ckpt_dir: str | None, why_not: str = "") -> None:
        self._saver = saver
        self._ckpt_dir = ckpt_dir
        self._why_not = why_not
        self._step = None
        _step_saves.clear()  # a new session: a tf.function step of an earlier job no longer saves for this one

    def begin(self) -> None:
        self._step = tf.compat.v1.train.get_global_step()

    def after_run(self, run_context, run_values) -> None:
        if not requested() or step_saves():
            return
        # read after the run: one fetched with it may be read before its own increment
        step = int(run_context.session.run(self._step)) if self._step is not None else None
        if self._saver is not None and self._ckpt_dir:
            path = self._saver.save(run_context.session, os.path.join(self._ckpt_dir, CHECKPOINT_BASENAME),
                                    global_step=step, write_meta_graph=False)
            said = f"saved global step {step} to {path}"
        else:
            said = f"saved nothing ({self._why_not or 'no CheckPointConfig.ckpt_dir'})"
        end(said)
