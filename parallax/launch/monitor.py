"""The stall check: every rank tells the launcher where it is; the launcher says who waits for whom.

A synchronous job moves at the pace of its slowest process. When one rank
stops moving (a slow input pipeline, a debugger, a sleep, a hung host), the
others wait inside ``sess.run``: in the PS protocol's accumulator or token
queue, in an all-reduce, or for the chief to initialise the variables. TF
and MPI wait silently. Like Horovod's stall check, Parallax then prints, per
waiting rank: how long it has waited, where (the protocol step), and which
ranks it waits for and what they are doing.

Protocol: the launcher opens a UDP socket and passes its address to every
rank (``PARALLAX_MONITOR=host:port``). Each rank's :class:`Heartbeat` sends a
small JSON datagram twice a second from a daemon thread: its rank, state
(``start``, ``run``, ``user``, ``serve``, ``done``), the number of steps it has
finished (``sess.run`` calls), the seconds spent in the state, and where it waits. The launcher's
:class:`StallMonitor` keeps the latest of each and, once a second, prints
what :func:`stall_report` finds: a rank in ``start`` or ``run`` for longer
than the stall time (``Config.stall_timeout``, default 30 s), again every
stall time while it lasts; and a rank not heard from for that long.

Datagrams are fire-and-forget: a lost one changes nothing, and a monitor
that is not there costs the ranks nothing.
"""

from __future__ import annotations

import json
import socket
import sys
import threading
import time
from dataclasses import dataclass

__all__ = ["MONITOR_ENV", "STALL_ENV", "Heartbeat", "StallMonitor", "RankState", "stall_report"]

MONITOR_ENV = "PARALLAX_MONITOR"
STALL_ENV = "PARALLAX_STALL_TIMEOUT"
_INTERVAL = 0.5

_STATES = {
    "start": "is starting its session",
    "run": "is in sess.run",
    "user": "is in the program's own code (between sess.run calls)",
    "serve": "is serving variables",
    "done": "has finished",
}


@dataclass(frozen=True)
class RankState:
    """What the launcher knows of one rank: its latest heartbeat, as of ``received`` (monotonic)."""

    rank: int
    state: str
    steps: int
    seconds: float
    where: str
    received: float

    def age(self, now: float) -> float:
        """Seconds in the current state, as of ``now``."""
        return self.seconds + (now - self.received)


def stall_report(states: dict[int, RankState], names: dict[int, str], now: float, timeout: float,
                 reported: dict[int, float]) -> list[str]:
    """The stall messages due at ``now`` (pure; ``reported`` is updated in place).

    A rank is stalled when it has been in ``start`` or ``run`` for ``timeout``
    seconds; it waits for the other workers that have finished fewer steps
    than the one it is in, or are not in a step. A rank not heard from for
    ``timeout`` seconds is reported as silent. Each is reported again every
    ``timeout`` seconds while it lasts.

    Args:
        states: the latest heartbeat of each rank.
        names: how to call each rank in a message, e.g. ``"rank 1 (worker 1 on host a)"``.
        now: the monotonic time.
        timeout: the stall time in seconds.
        reported: when each rank was last reported (key ``-1 - rank`` for silence).

    Returns:
        One line per message.

    >>> s = {0: RankState(0, "run", 4, 40.0, "in an all-reduce", 0.0), 1: RankState(1, "user", 4, 41.0, "", 0.0)}
    >>> import textwrap
    >>> print(textwrap.fill(stall_report(s, {0: "rank 0", 1: "rank 1"}, 1.0, 30.0, {})[0], 100))
    Parallax stall: rank 0 has waited 41 s in sess.run call #5, in an all-reduce, for rank 1, which has
    finished 4 sess.run calls and is in the program's own code (between sess.run calls) for 42 s
    """
    lines = []
    for rank, st in sorted(states.items()):
        silent = now - st.received
        if st.state != "done" and silent >= timeout and now - reported.get(-1 - rank, -1e9) >= timeout:
            reported[-1 - rank] = now
            lines.append(f"Parallax stall: no news from {names.get(rank, f'rank {rank}')} for {silent:.0f} s "
                         "(its process or host is not responding)")
            continue
        if st.state not in ("start", "run") or st.age(now) < timeout:
            reported.pop(rank, None)
            continue
        if now - reported.get(rank, -1e9) < timeout:
            continue
        reported[rank] = now
        step = "while starting its session" if st.state == "start" else f"in sess.run call #{st.steps + 1}"
        laggards = [other for r, other in sorted(states.items()) if r != rank and other.state != "serve"
                    and (other.state != st.state or other.steps < st.steps)]
        waits = "; ".join(
            f"{names.get(o.rank, f'rank {o.rank}')}, which has finished {o.steps} sess.run calls and "
            f"{_STATES.get(o.state, o.state)} for {o.age(now):.0f} s" for o in laggards) or \
            "ranks that are all in the same step (a peer may be slow inside it, or the network is)"
        where = f", {st.where}" if st.where else ""
        lines.append(f"Parallax stall: {names.get(rank, f'rank {rank}')} has waited {st.age(now):.0f} s {step}"
                     f"{where}, for {waits}")
    return lines


class Heartbeat:
    """A rank's side: sends its state to the launcher's monitor from a daemon thread.

    Args:
        address: the monitor's ``host:port``.
        rank: this process's rank.
    """

    def __init__(self, address: str, rank: int) -> None:
        host, _, port = address.rpartition(":")
        self._target = (host, int(port))
        self._rank = rank
        self._lock = threading.Lock()
        self._state, self._steps, self._where, self._since = "start", 0, "", time.monotonic()
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="parallax-heartbeat", daemon=True)
        self._thread.start()

    def set(self, state: str, where: str = "", steps: int | None = None) -> None:
        """Enter ``state`` (see the module docstring); ``where`` says what it waits for there.
        Cheap: nothing is sent here (``sess.run`` calls it twice); the thread sends twice a second."""
        with self._lock:
            self._state, self._where, self._since = state, where, time.monotonic()
            if steps is not None:
                self._steps = steps

    def step_done(self) -> None:
        """A ``sess.run`` returned: one more step finished, back in the program's code."""
        with self._lock:
            self._steps += 1
        self.set("user")

    def close(self) -> None:
        """The process ends. A server keeps saying ``serve``: it serves until the workers are done."""
        if self._state == "serve":
            return
        self.set("done")
        self._stop.set()
        self._send()

    def _send(self) -> None:
        with self._lock:
            data = {"rank": self._rank, "state": self._state, "steps": self._steps, "where": self._where,
                    "seconds": round(time.monotonic() - self._since, 3)}
        try:
            self._socket.sendto(json.dumps(data).encode(), self._target)
        except OSError:
            pass  # the monitor is gone or unreachable: nothing to tell

    def _loop(self) -> None:
        while not self._stop.wait(_INTERVAL):
            self._send()


class StallMonitor:
    """The launcher's side: receives heartbeats and prints stall reports.

    Args:
        names: how to call each rank in a message.
        timeout: the stall time in seconds.
        bind_host: the address to listen on (loopback when every rank is on this machine).
        sink: where reports go (default ``sys.stderr``).
    """

    def __init__(self, names: dict[int, str], timeout: float, bind_host: str = "127.0.0.1", sink=None) -> None:
        self._names = names
        self._timeout = timeout
        self._sink = sink or sys.stderr
        self._states: dict[int, RankState] = {}
        self._reported: dict[int, float] = {}
        family = socket.AF_INET6 if ":" in bind_host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_DGRAM)
        self._socket.bind((bind_host, 0))
        self._socket.settimeout(_INTERVAL)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="parallax-stall-monitor", daemon=True)

    def address(self, host: str) -> str:
        """``host:port`` for the ranks, where ``host`` is how they reach this machine."""
        return f"{host}:{self._socket.getsockname()[1]}"

    def start(self) -> StallMonitor:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        self._socket.close()

    def _loop(self) -> None:
        last_check = time.monotonic()
        while not self._stop.is_set():
            try:
                data, _ = self._socket.recvfrom(4096)
                beat = json.loads(data)
                self._states[int(beat["rank"])] = RankState(int(beat["rank"]), str(beat["state"]),
                                                            int(beat["steps"]), float(beat["seconds"]),
                                                            str(beat.get("where", "")), time.monotonic())
            except (TimeoutError, ValueError, KeyError, OSError):
                pass
            now = time.monotonic()
            if now - last_check >= 1.0:
                last_check = now
                for line in stall_report(self._states, self._names, now, self._timeout, self._reported):
                    self._sink.write(line + "\n")
                    self._sink.flush()
