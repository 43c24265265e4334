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

The state is the job's: each session ``start_worker`` makes gets a :class:`Preemption` of its own
(:func:`for_this_job`), which its :class:`PreemptionHook` and a ``tf.function`` step's
:class:`~parallax.tf2.step.DistributedStep` share. The hook (or the step) saves, then raises
:class:`~parallax.errors.Preempted`; the call of the program's it happened in (``ParallaxSession.run``, the
step's call) is the door that ends the process (:meth:`Preemption.end`). What stays process-wide is what a
signal handler is by nature: one registration (:func:`install`), which passes a signal to the job of the moment
and keeps it for a job begun later (the process is going away).
"""

from __future__ import annotations

import os
import signal
import sys
import threading
from collections.abc import Callable
from typing import Any, NoReturn

import tensorflow as tf

from parallax.errors import Preempted
from parallax.job.paths import CHECKPOINT_BASENAME
from parallax.launch.runner import PREEMPT_GRACE, PREEMPTED_EXIT_CODE
from parallax.logs import log as logger

__all__ = ["Preemption", "PreemptionHook", "for_this_job", "install"]


class Preemption:
    """One job's preemption state: whether the job was asked to end with a checkpoint (the signals reach it
    through :func:`install`'s registration), and whether its ``tf.function`` step saves that checkpoint itself.

    Args:
        requested: asked already (a signal came before the job began).
    """

    def __init__(self, requested: bool = False) -> None:
        self._requested = threading.Event()
        if requested:
            self._requested.set()
        self._step_saves = False

    def request(self) -> None:
        """Ask the job to end with a checkpoint (a signal handler's, in the main thread)."""
        self._requested.set()

    @property
    def requested(self) -> bool:
        """Whether the job was asked to end with a checkpoint."""
        return self._requested.is_set()

    def leave_to_the_step(self) -> None:
        """Worker 0 of a ``tf.function`` step's job saves the step's own checkpoint (``CheckPointConfig.checkpoint``)
        and ends after the step under way: :class:`PreemptionHook` leaves it to the step."""
        self._step_saves = True

    @property
    def step_saves(self) -> bool:
        """Whether the job leaves the preemption save to its ``tf.function`` step."""
        return self._step_saves

    def end(self, preempted: Preempted) -> NoReturn:
        """The door's exit (``ParallaxSession.run``, a ``tf.function`` step's call): worker 0 has done what it
        could (``preempted``): say so and end the process with the preempted exit code."""
        logger.warning("Parallax: preempted: the chief %s; exiting with code %d", preempted.said, PREEMPTED_EXIT_CODE)
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(PREEMPTED_EXIT_CODE)  # not SystemExit: the exit barriers would wait for ranks still in a step


class _Signals:
    """This process's one registration of SIGTERM and SIGUSR1 (a signal handler is process-wide by nature).

    A signal reaches the job of the moment (``job``, which :func:`for_this_job` replaces at each job); once one
    came (``asked``), every job begun later is asked too: the process is going away.

    Args:
        notify: tells the launcher of a SIGTERM to this process.
        give_up_after: seconds after a SIGTERM when this process ends itself if the job has not ended.
    """

    def __init__(self, notify: Callable[[], None], give_up_after: float = PREEMPT_GRACE + 10) -> None:
        self.notify = notify
        self.give_up_after = give_up_after
        self.asked = False
        self.job: Preemption | None = None
        self.timer: threading.Timer | None = None

    def ask(self) -> None:
        self.asked = True
        if self.job is not None:
            self.job.request()

    def on_term(self, signum: int, frame: Any) -> None:
        if not self.asked:
            self.ask()
            self.notify()
            # bounded: a job that is not ended by then (no launcher left to end it) ends this process
            self.timer = threading.Timer(self.give_up_after, self._give_up)
            self.timer.daemon = True
            self.timer.start()

    def on_usr1(self, signum: int, frame: Any) -> None:
        self.ask()

    def _give_up(self) -> None:
        logger.warning("Parallax: asked to end %.0f s ago (SIGTERM), and the job has not ended: this process ends",
                       self.give_up_after)
        os._exit(PREEMPTED_EXIT_CODE)  # the watchdog's: no step or hook is left to end the process


_SIGNALS: _Signals | None = None  # the registration, once per process (install)


def install(notify: Callable[[], None]) -> None:
    """Take SIGTERM (``notify`` tells the launcher) and SIGUSR1 (the launcher's request) in this process: both
    ask for the job to end with a checkpoint. Only from the main thread, once: the registration (:class:`_Signals`)
    is this module's one process-wide state; each job's own is made by :func:`for_this_job`."""
    global _SIGNALS
    if _SIGNALS is not None or threading.current_thread() is not threading.main_thread():
        return
    registration = _Signals(notify)
    signal.signal(signal.SIGTERM, registration.on_term)
    signal.signal(signal.SIGUSR1, registration.on_usr1)
    _SIGNALS = registration


def for_this_job() -> Preemption | None:
    """The preemption state of the job this process begins (its session's), which the signals reach from now on
    (no longer an earlier job's), asked already if a signal came before; ``None`` in a process that does not take
    SIGTERM (nothing :func:`install`\\ ed: a process that trains alone)."""
    if _SIGNALS is None:
        return None
    job = Preemption(requested=_SIGNALS.asked)
    _SIGNALS.job = job
    return job


class PreemptionHook(tf.compat.v1.train.SessionRunHook):
    """The chief's: once its job is asked to end, save a checkpoint after the ``run`` under way and raise
    :class:`~parallax.errors.Preempted` (the session's ``run``, the door, ends the process: :meth:`Preemption.end`).

    Args:
        preemption: the job's preemption state.
        saver: the chief's saver over the single-device names (``None``: nothing can be saved).
        ckpt_dir: ``CheckPointConfig.ckpt_dir``.
        why_not: when nothing can be saved, why (for the message).
    """

    def __init__(self, preemption: Preemption, saver: Any, ckpt_dir: str | None, why_not: str = "") -> None:
        self._preemption = preemption
        self._saver = saver
        self._ckpt_dir = ckpt_dir
        self._why_not = why_not
        self._step = None

    def begin(self) -> None:
        self._step = tf.compat.v1.train.get_global_step()

    def after_run(self, run_context, run_values) -> None:
        """Save once the job is asked to end (and its step does not save itself).

        Raises:
            Preempted: the job was asked to end, and the checkpoint is saved (or could not be: the message says why).
        """
        if not self._preemption.requested or self._preemption.step_saves:
            return
        # read after the run: one fetched with it may be read before its own increment
        step = int(run_context.session.run(self._step)) if self._step is not None else None
        if self._saver is not None and self._ckpt_dir:
            path = self._saver.save(run_context.session, os.path.join(self._ckpt_dir, CHECKPOINT_BASENAME),
                                    global_step=step, write_meta_graph=False)
            said = f"saved global step {step} to {path}"
        else:
            said = f"saved nothing ({self._why_not or 'no CheckPointConfig.ckpt_dir'})"
        raise Preempted(said)
