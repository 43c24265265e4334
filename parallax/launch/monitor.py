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

Across machines two more things matter, and the same channel carries them:

* **A host that vanishes** (its network goes down, it powers off) sends no
  error: its ranks' peers wait in TCP for minutes. A rank not heard from for
  the stall time ends the job (the monitor's ``on_lost``), naming it. The
  monitor answers each heartbeat (``ok``); a rank that hears no answer for the
  stall time is cut off from the launcher, so it ends itself and the Open MPI
  daemon that started it: nothing is left on a host the job lost.
* **Who died first.** When a rank is killed, its peers fail a moment later
  ("peer disconnected"), and ``mpirun`` may name one of them. Each rank also
  holds a TCP connection to the monitor, which the kernel closes the instant
  the process ends, however it ends: the first connection to close (of a rank
  that had not finished) is the rank that died first (:meth:`StallMonitor.first_gone`).
"""

from __future__ import annotations

import json
import selectors
import socket
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

__all__ = ["Heartbeat", "StallMonitor", "RankState", "stall_report", "end_orphan"]

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
        orphan_after: seconds without an answer from the monitor (after a first
            one) after which this process is cut off from its job and ends itself
            (:func:`end_orphan`); ``None``: never.
        lifeline: hold the TCP connection that tells the monitor when this process ends (``False``: the
            monitor's port is another server's over TCP: a task's in a job a cluster manager started).
    """

    def __init__(self, address: str, rank: int, orphan_after: float | None = None, lifeline: bool = True) -> None:
        host, _, port = address.rpartition(":")
        self._target = (host, int(port))
        self._rank = rank
        self._orphan_after = orphan_after
        self._answered: float | None = None  # when the monitor last answered (monotonic)
        self._lock = threading.Lock()
        self._state, self._steps, self._where, self._since = "start", 0, "", time.monotonic()
        self._preempt = False
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        self._socket = socket.socket(family, socket.SOCK_DGRAM)
        self._socket.setblocking(False)
        self._lifeline = socket.socket(family, socket.SOCK_STREAM)  # closed by the kernel when we end
        try:
            if lifeline:
                self._lifeline.settimeout(5)
                self._lifeline.connect(self._target)
                self._lifeline.sendall(f"{rank}\n".encode())
        except OSError:
            pass  # an older or absent monitor: heartbeats still go
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

    def preempt(self) -> None:
        """Ask the launcher to end the job with a checkpoint (this process got SIGTERM): every heartbeat from
        now on says so, and one goes now."""
        self._preempt = True
        self._send()

    def close(self) -> None:
        """The process ends. A server keeps saying ``serve``: it serves until the workers are done.
        The thread goes on until the process is gone: a process cut off from the launcher while it
        ends (in ``MPI_Abort``, a last barrier) must still end itself (:func:`end_orphan`)."""
        if self._state == "serve":
            return
        self.set("done")
        self._send()

    def _send(self) -> None:
        with self._lock:
            data = {"rank": self._rank, "state": self._state, "steps": self._steps, "where": self._where,
                    "seconds": round(time.monotonic() - self._since, 3)}
            if self._preempt:
                data["preempt"] = True
        try:
            self._socket.sendto(json.dumps(data).encode(), self._target)
        except OSError:
            pass  # the monitor is gone or unreachable: nothing to tell

    def _loop(self) -> None:
        while True:  # until the process ends (a daemon thread), whatever goes wrong in one round
            time.sleep(_INTERVAL)
            try:
                self._beat()
            except Exception:  # noqa: BLE001 - the thread that ends a cut-off process must not die
                pass

    def _beat(self) -> None:
        self._send()
        now = time.monotonic()
        try:
            while self._socket.recv(16):
                self._answered = now
        except OSError:  # nothing (more) to read
            pass
        if self._orphan_after and self._answered is not None and now - self._answered > self._orphan_after:
            end_orphan(self._rank, now - self._answered)


def end_orphan(rank: int, silent: float) -> None:
    """This rank lost its launcher (its host's network, or the launching machine, is gone): say so,
    end the Open MPI daemon that started it (nobody else can reach it now), and exit."""
    import os
    import signal

    try:  # stderr may be a pipe to a daemon that is gone already (BrokenPipeError): end all the same
        sys.stderr.write(f"Parallax: rank {rank} on host {socket.gethostname()} has heard nothing from the "
                         f"launcher for {silent:.0f} s (the network to it is gone); this process ends\n")
        sys.stderr.flush()
    except Exception:  # noqa: BLE001
        pass
    parent = os.getppid()
    try:
        with open(f"/proc/{parent}/comm", encoding="utf-8") as f:
            if f.read().strip() in ("prted", "orted"):  # our job's daemon, unreachable from its mpirun now
                os.kill(parent, signal.SIGKILL)
    except OSError:
        pass
    os._exit(1)


class StallMonitor:
    """The launcher's side: receives heartbeats and prints stall reports.

    Args:
        names: how to call each rank in a message.
        timeout: the stall time in seconds.
        bind_host: the address to listen on (loopback when every rank is on this machine).
        sink: where reports go (default ``sys.stderr``).
        on_lost: told of a rank not heard from for the stall time (its rank, the seconds).
        on_preempt: told of a rank that asks for the job to end with a checkpoint (it got SIGTERM), with
            every heartbeat it sends from then on, while no rank has ended unfinished: ``mpirun`` sends SIGTERM
            to the ranks left when one fails, which is no preemption.
        port: take heartbeats on this UDP port of ``bind_host``, without lifelines (raises ``OSError`` when
            it is taken); ``None``: a free port, with lifelines on its TCP side.
        shutdown: seconds a rank may wait (in ``start`` or ``run``) before ``on_stalled`` is told, once, with
            the rank and its stall report (``Config.stall_shutdown``); ``None``: never.
        on_stalled: told of the first rank that has waited ``shutdown`` seconds.
    """

    def __init__(self, names: dict[int, str], timeout: float, bind_host: str = "127.0.0.1", sink=None,
                 on_lost: Callable[[int, float], None] | None = None,
                 on_preempt: Callable[[int], None] | None = None, port: int | None = None,
                 shutdown: float | None = None, on_stalled: Callable[[int, str], None] | None = None) -> None:
        self._names = names
        self._shutdown = shutdown
        self._on_stalled = on_stalled
        self._ended = False
        self._on_preempt = on_preempt
        self._asking: set[int] = set()  # ranks whose heartbeats of this round ask to preempt
        self._timeout = timeout
        self._sink = sink or sys.stderr
        self._on_lost = on_lost
        self._states: dict[int, RankState] = {}
        self._reported: dict[int, float] = {}
        self._lost: set[int] = set()
        self._closed: dict[int, float] = {}  # rank -> when its lifeline closed (monotonic)
        self._selector = selectors.DefaultSelector()
        if port is None:
            self._socket, listener = _bind_pair(bind_host)
            self._selector.register(listener, selectors.EVENT_READ, "accept")
        else:  # heartbeats only, on a given UDP port (its TCP side is another server's): no lifelines
            self._socket = socket.socket(socket.AF_INET6 if ":" in bind_host else socket.AF_INET, socket.SOCK_DGRAM)
            self._socket.bind((bind_host, port))
            self._socket.setblocking(False)
        self._selector.register(self._socket, selectors.EVENT_READ, "beat")
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
        for key in list(self._selector.get_map().values()):
            key.fileobj.close()
        self._selector.close()

    def first_gone(self) -> int | None:
        """The rank whose process ended first without finishing (its lifeline closed first), or ``None``."""
        unfinished = {r: t for r, t in self._closed.items()
                      if r not in self._states or self._states[r].state != "done"}
        return min(unfinished, key=unfinished.get) if unfinished else None

    def culprit(self) -> tuple[str, int, float] | None:
        """After a failed job, the rank to blame: ``("gone", rank, 0)``, the first to end unfinished;
        else ``("lost", rank, seconds)``, one still unheard-of whose lifeline never closed (its host
        vanished: no FIN came), silent for ``seconds``; else ``None``."""
        gone = self.first_gone()
        if gone is not None:
            return "gone", gone, 0.0
        now = time.monotonic()
        silent = {r: now - st.received for r, st in self._states.items()
                  if st.state != "done" and r not in self._closed}
        if not silent:
            return None
        rank = max(silent, key=silent.get)
        return "lost", rank, silent[rank]

    def _loop(self) -> None:
        last_check = time.monotonic()
        while not self._stop.is_set():
            for key, _ in self._selector.select(timeout=_INTERVAL):
                try:
                    self._handle(key)
                except (ValueError, KeyError, OSError):
                    pass
            # after the round: a lifeline closed in it says a rank died first (mpirun then SIGTERMs the rest)
            asking, self._asking = self._asking, set()
            if asking and self._on_preempt is not None and self.first_gone() is None:
                for rank in sorted(asking):
                    self._on_preempt(rank)
            now = time.monotonic()
            if now - last_check >= 1.0:
                last_check = now
                for line in stall_report(self._states, self._names, now, self._timeout, self._reported):
                    self._sink.write(line + "\n")
                    self._sink.flush()
                self._check_stalled(now)
                self._check_lost(now)

    def _handle(self, key: selectors.SelectorKey) -> None:
        if key.data == "beat":
            data, sender = self._socket.recvfrom(4096)
            beat = json.loads(data)
            self._states[int(beat["rank"])] = RankState(int(beat["rank"]), str(beat["state"]), int(beat["steps"]),
                                                        float(beat["seconds"]), str(beat.get("where", "")),
                                                        time.monotonic())
            self._socket.sendto(b"ok", sender)
            if beat.get("preempt"):
                self._asking.add(int(beat["rank"]))
        elif key.data == "accept":
            conn, _ = key.fileobj.accept()
            conn.setblocking(False)
            self._selector.register(conn, selectors.EVENT_READ, [b"", None])
        else:  # a lifeline: its rank number, then nothing until it closes
            conn, state = key.fileobj, key.data
            try:
                chunk = conn.recv(64)
            except BlockingIOError:
                return
            except OSError:
                chunk = b""
            if chunk:
                state[0] += chunk
                if state[1] is None and b"\n" in state[0]:
                    state[1] = int(state[0].split(b"\n")[0])
                return
            self._selector.unregister(conn)
            conn.close()
            if state[1] is not None:
                self._closed.setdefault(state[1], time.monotonic())

    def _check_stalled(self, now: float) -> None:
        """A rank that has waited ``shutdown`` seconds ends the job: tell ``on_stalled`` once, with its report."""
        if self._shutdown is None or self._on_stalled is None or self._ended:
            return
        for rank, st in sorted(self._states.items()):
            if st.state in ("start", "run") and st.age(now) >= self._shutdown:
                report = stall_report(self._states, self._names, now, self._shutdown, {})
                mine = next((line for line in report if f"{self._names.get(rank, f'rank {rank}')} has waited" in line),
                            f"Parallax stall: rank {rank} has waited {st.age(now):.0f} s")
                self._ended = True
                self._on_stalled(rank, mine)
                return

    def _check_lost(self, now: float) -> None:
        """A rank not heard from for the stall time (and not finished) is lost: tell ``on_lost`` once."""
        for rank, st in self._states.items():
            silent = now - st.received
            if rank not in self._lost and rank not in self._closed and st.state != "done" \
                    and silent >= self._timeout and self._on_lost is not None:
                self._lost.add(rank)
                self._on_lost(rank, silent)


def _bind_pair(host: str) -> tuple[socket.socket, socket.socket]:
    """A UDP socket (heartbeats) and a listening TCP socket (lifelines) on the same free port of ``host``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    for _ in range(20):
        udp = socket.socket(family, socket.SOCK_DGRAM)
        udp.bind((host, 0))
        tcp = socket.socket(family, socket.SOCK_STREAM)
        try:
            tcp.bind((host, udp.getsockname()[1]))
        except OSError:  # that port's TCP side is taken: another
            udp.close()
            tcp.close()
            continue
        tcp.listen(256)
        udp.setblocking(False)
        tcp.setblocking(False)
        return udp, tcp
    raise OSError(f"no port on {host} is free for both UDP and TCP")
