"""The watch on a manager-started task's peers: a peer gone before the job has finished ends this task.

A job a cluster manager started has no launcher to see a task die
(:mod:`parallax.member.joined`): each task watches the others' server ports
itself, and a task left unable to go on ends naming the one that went first,
with the exit code a manager's restart resumes it from
(:data:`~parallax.launch.runner.PREEMPTED_EXIT_CODE`).
"""

from __future__ import annotations

import os
import socket
import sys
import threading
import time
from collections.abc import Callable

from parallax.launch.runner import PREEMPTED_EXIT_CODE
from parallax.logs import log as logger

__all__ = ["PeerWatch"]


class PeerWatch(threading.Thread):
    """Ends this task when a peer task's server goes away before the job has finished.

    Every half second it connects to each peer's server port. A peer that was up
    and has not answered for ``grace`` seconds has ended (or its host is gone),
    unless every task has finished (``finished()``): this process then prints
    which task and exits with 143 (:func:`_end_for_restart`), so no task waits forever on a dead one.

    A peer is watched once a probe has seen it up. The thread's probes can be held
    up for seconds while TensorFlow builds and starts the session (it holds the
    GIL), long enough to miss a peer that starts and dies then; so the training
    loop probes too (:meth:`poll`, after each ``run``, at most every half second):
    a peer that dies after this task's first step is seen up before it dies.

    Args:
        peers: ``(name, host, port)`` of every other task.
        own: this task's name.
        finished: whether the job has finished (asked when a peer goes away).
        grace: seconds a peer may be unreachable.
        probe: how a peer is checked (default: a TCP connection to its port).
        end: what ends this process (default: print, then ``os._exit(143)``: a manager's restart resumes it).
    """

    def __init__(self, peers: list[tuple[str, str, int]], own: str, finished: Callable[[], bool], grace: float,
                 probe: Callable[[str, int], bool] | None = None, end: Callable[[str], None] | None = None,
                 interval: float = 0.5) -> None:
        super().__init__(name="parallax-peer-watch", daemon=True)
        self.peers, self.own, self.finished, self.grace = peers, own, finished, grace
        self._probe = probe or _reachable
        self._end = end or _end_for_restart
        self._interval = interval
        self._halt = threading.Event()  # not _stop: threading.Thread has a _stop of its own
        self._failed = threading.Event()
        self.seen: set[str] = set()
        self.lost: dict[str, float] = {}
        self._round = threading.Lock()
        self._last_round = float("-inf")
        self._polled = False  # the caller's first round runs whenever the thread's last one was

    def stop(self) -> None:
        self._halt.set()

    def failed(self) -> bool:
        return self._failed.is_set()

    def poll(self, now: float) -> None:
        """A round from the caller's thread on its first call and whenever the last round is ``interval``
        old (ends the process as :meth:`run` does when a peer has gone)."""
        due = not self._polled or now - self._last_round >= self._interval
        if due and self._round.acquire(blocking=False):
            try:
                self._polled = True
                self._last_round = now
                gone = self.check(now)
            finally:
                self._round.release()
            self._fail(gone)

    def settle(self, within: float, sleep: Callable[[float], None] = time.sleep) -> None:
        """Probe each ``interval`` for ``within`` seconds: a peer gone (unreachable for ``grace``) ends the
        process naming it, as :meth:`run` does. For a task whose session failed because of a peer, so that the
        peer that ended is named where it can be; returns when none has (a peer that restarted is back)."""
        end = time.monotonic() + within
        while time.monotonic() < end:
            self.poll(time.monotonic())
            sleep(self._interval)

    def check(self, now: float) -> str | None:
        """One round: probe every peer; the name and address of the one that went first, if one has
        been gone ``grace`` seconds. A task that ends because another did goes later, and is not named:
        peers first missed in the same round (a watch held up while both went) are named together, after
        any peer that cannot be reached and was never seen up (it may have started and died unseen)."""
        gone, unseen = {}, []
        for name, host, port in self.peers:
            if self._probe(host, port):
                if name not in self.seen:
                    logger.info("Parallax: %s sees task %s up at %s:%d", self.own, name, host, port)
                self.seen.add(name)
                self.lost.pop(name, None)
                continue
            if name not in self.seen:
                unseen.append(f"{name} ({host}:{port})")  # not started yet, or started and gone between probes
                continue  # starting is the session's business, not this watch's
            gone[name] = (self.lost.setdefault(name, now), f"{name} ({host}:{port})")
        if not gone:
            return None
        first = min(since for since, _ in gone.values())
        if now - first < self.grace or self.finished():
            return None
        # a peer this watch never saw up (its probes held up while it started and died) may be the one
        # that went first: the job is ending, so it is named too
        return " and ".join(unseen + [label for since, label in gone.values() if since == first])

    def run(self) -> None:
        while not self._halt.wait(self._interval) and not self._failed.is_set():
            with self._round:
                self._last_round = time.monotonic()
                gone = self.check(self._last_round)
            self._fail(gone)

    def _fail(self, gone: str | None) -> None:
        if gone is not None and not self._halt.is_set() and not self._failed.is_set():
            self._failed.set()
            verb = "have" if " and " in gone else "has"
            self._end(f"Parallax job failed: task {gone} {verb} ended or cannot be reached; ending task {self.own}")


def _reachable(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host.strip("[]"), port), timeout=1.0):
            return True
    except OSError:
        return False


def _end(message: str, code: int = 1) -> None:
    try:
        sys.stderr.write(message + "\n")
        sys.stderr.flush()
    except OSError:
        pass
    os._exit(code)


def _end_for_restart(message: str) -> None:
    """End a task that another task's end left unable to go on: with
    :data:`~parallax.launch.runner.PREEMPTED_EXIT_CODE`, which a TFJob's ``restartPolicy: ExitCode`` restarts
    (the job then resumes from its checkpoint); an exception's 1 fails the job."""
    _end(message + f" (exit code {PREEMPTED_EXIT_CODE}: restart the task to resume from the last checkpoint)",
         PREEMPTED_EXIT_CODE)
