"""The stall check's decisions (pure) and a heartbeat reaching a monitor over loopback UDP."""

from __future__ import annotations

import io
import time

from parallax.launch.monitor import Heartbeat, RankState, StallMonitor, stall_report

NAMES = {0: "rank 0 (worker 0 on host a)", 1: "rank 1 (worker 1 on host b)", 2: "rank 2 (ps 0 on host a)"}


def state(rank, kind, steps, seconds, where="", received=100.0):
    return RankState(rank, kind, steps, seconds, where, received)


def test_a_rank_in_a_step_past_the_stall_time_names_the_ranks_behind_it_and_not_the_servers():
    states = {0: state(0, "run", 3, 31.0, "in the all-reduce"), 1: state(1, "user", 3, 31.0),
              2: state(2, "serve", 0, 50.0)}
    lines = stall_report(states, NAMES, 100.0, 30.0, {})
    assert lines == ["Parallax stall: rank 0 (worker 0 on host a) has waited 31 s in sess.run call #4, in the "
                     "all-reduce, for rank 1 (worker 1 on host b), which has finished 3 sess.run calls and is in "
                     "the program's own code (between sess.run calls) for 31 s"]


def test_nothing_is_reported_before_the_stall_time_and_a_report_repeats_only_after_it():
    reported: dict[int, float] = {}
    states = {0: state(0, "run", 0, 10.0), 1: state(1, "user", 0, 10.0)}
    assert stall_report(states, NAMES, 100.0, 30.0, reported) == []
    states = {0: state(0, "run", 0, 30.0), 1: state(1, "user", 0, 30.0)}
    assert len(stall_report(states, NAMES, 100.0, 30.0, reported)) == 1
    later = {0: state(0, "run", 0, 40.0, received=110.0), 1: state(1, "user", 0, 40.0, received=110.0)}
    assert stall_report(later, NAMES, 110.0, 30.0, reported) == []
    later = {0: state(0, "run", 0, 61.0, received=131.0), 1: state(1, "user", 0, 61.0, received=131.0)}
    assert len(stall_report(later, NAMES, 131.0, 30.0, reported)) == 1


def test_waiting_for_the_chief_to_initialise_is_reported_with_where():
    states = {0: state(0, "user", 0, 40.0), 1: state(1, "start", 0, 40.0, "waiting for the chief")}
    (line,) = stall_report(states, NAMES, 100.0, 30.0, {})
    assert line.startswith("Parallax stall: rank 1 (worker 1 on host b) has waited 40 s while starting its "
                           "session, waiting for the chief, for rank 0 (worker 0 on host a)")


def test_a_rank_not_heard_from_is_reported_silent_unless_it_finished():
    states = {0: state(0, "run", 2, 1.0, received=100.0), 1: state(1, "run", 2, 0.0, received=60.0),
              2: state(2, "done", 0, 0.0, received=10.0)}
    lines = stall_report(states, NAMES, 100.0, 30.0, {})
    assert lines == ["Parallax stall: no news from rank 1 (worker 1 on host b) for 40 s (its process or host is "
                     "not responding)"]


def test_a_heartbeat_reaches_the_monitor_and_a_stall_is_printed():
    sink = io.StringIO()
    monitor = StallMonitor({0: "rank 0", 1: "rank 1"}, timeout=1.0, sink=sink).start()
    try:
        beats = [Heartbeat(monitor.address("127.0.0.1"), r) for r in (0, 1)]
        beats[0].set("run", "in the all-reduce")
        beats[1].set("user")
        deadline = time.monotonic() + 10
        while "Parallax stall: rank 0 has waited" not in sink.getvalue() and time.monotonic() < deadline:
            time.sleep(0.1)
        for beat in beats:
            beat.close()
    finally:
        monitor.stop()
    assert "in the all-reduce, for rank 1, which has finished 0 sess.run calls" in sink.getvalue()


# --------------------------------------------------------------------------- across machines
def _wait_for(condition, timeout=10.0):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not met in time"
        time.sleep(0.05)


_RANK = """
import sys, time
sys.path.insert(0, {root!r})
from parallax.launch.monitor import Heartbeat
beat = Heartbeat({address!r}, {rank}, orphan_after={orphan})
beat.set("run")
print("ready", flush=True)
time.sleep(60)
"""


def _rank_process(address, rank, orphan=None):
    import os
    import subprocess
    import sys

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    proc = subprocess.Popen([sys.executable, "-c", _RANK.format(root=root, address=address, rank=rank,
                                                                orphan=orphan)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    return proc


def test_the_rank_whose_process_ended_first_is_the_culprit():
    monitor = StallMonitor({0: "rank 0", 1: "rank 1"}, 30.0, sink=io.StringIO()).start()
    try:
        first, second = (_rank_process(monitor.address("127.0.0.1"), r) for r in (1, 0))
        _wait_for(lambda: len(monitor._states) == 2)
        first.kill()  # SIGKILL: no word from it, but its kernel closes its lifeline
        first.wait()
        time.sleep(0.2)
        second.kill()
        second.wait()
        _wait_for(lambda: monitor.first_gone() is not None and len(monitor._closed) == 2)
        assert monitor.culprit() == ("gone", 1, 0.0)
    finally:
        monitor.stop()


def test_a_rank_silent_for_the_stall_time_is_lost_once():
    import socket

    lost = []
    monitor = StallMonitor({3: "rank 3"}, 1.0, sink=io.StringIO(), on_lost=lambda r, s: lost.append((r, s))).start()
    try:
        host, port = monitor.address("127.0.0.1").rsplit(":", 1)
        beat = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)  # one heartbeat, no lifeline, then nothing
        beat.sendto(b'{"rank": 3, "state": "run", "steps": 2, "seconds": 0.1}', (host, int(port)))
        beat.settimeout(5)
        assert beat.recv(16) == b"ok"  # the monitor answers every heartbeat
        _wait_for(lambda: lost, timeout=5)
        time.sleep(1.5)
        assert [r for r, _ in lost] == [3] and lost[0][1] >= 1.0
        kind, rank, silent = monitor.culprit()
        assert (kind, rank) == ("lost", 3) and silent >= 1.0
    finally:
        monitor.stop()


def test_a_rank_cut_off_from_the_launcher_ends_itself():
    monitor = StallMonitor({0: "rank 0"}, 30.0, sink=io.StringIO()).start()
    proc = _rank_process(monitor.address("127.0.0.1"), 0, orphan=1.0)
    _wait_for(lambda: 0 in monitor._states)
    time.sleep(0.6)  # an answer heard
    monitor.stop()  # the launcher is gone: no more answers
    try:
        assert proc.wait(timeout=10) == 1
    finally:
        proc.kill()
    assert "has heard nothing from the launcher" in proc.stderr.read()


def test_a_cut_off_rank_ends_itself_even_when_its_stderr_is_gone():
    # on a vanished host the rank's Open MPI daemon may end first (its ssh session timed out):
    # writing the farewell then raises BrokenPipeError, which must not stop the process ending
    monitor = StallMonitor({0: "rank 0"}, 30.0, sink=io.StringIO()).start()
    proc = _rank_process(monitor.address("127.0.0.1"), 0, orphan=1.0)
    _wait_for(lambda: 0 in monitor._states)
    time.sleep(0.6)
    proc.stderr.close()  # the daemon reading its stderr is gone
    monitor.stop()
    try:
        assert proc.wait(timeout=10) == 1
    finally:
        proc.kill()


# --------------------------------------------------------------------------- preemption
def test_a_rank_that_got_sigterm_asks_to_preempt_unless_a_rank_died_first():
    """A rank's SIGTERM asks the launcher to end the job with a checkpoint; but when a rank has ended unfinished
    first, the SIGTERMs the others get are mpirun's teardown, which asks nothing."""
    asked = []
    monitor = StallMonitor({0: "rank 0", 1: "rank 1"}, 30.0, sink=io.StringIO(), on_preempt=asked.append).start()
    try:
        beat = Heartbeat(monitor.address("127.0.0.1"), 0)
        beat.set("run")
        _wait_for(lambda: 0 in monitor._states)
        beat.preempt()
        _wait_for(lambda: asked)
        assert set(asked) == {0}
        dying = _rank_process(monitor.address("127.0.0.1"), 1)
        _wait_for(lambda: 1 in monitor._states)
        dying.kill()
        dying.wait()
        _wait_for(lambda: monitor.first_gone() == 1)
        asked.clear()
        beat.preempt()
        time.sleep(1.5)  # three rounds of heartbeats
        assert asked == []
    finally:
        monitor.stop()


def test_a_monitor_on_a_given_udp_port_takes_heartbeats_without_lifelines():
    """Worker 0 of a job a cluster manager started listens on the UDP side of its server's port number; the
    tasks' heartbeats hold no TCP lifeline there (that port is the TensorFlow server's)."""
    import socket

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as server:  # the task's TF server, over TCP
        server.bind(("127.0.0.1", 0))
        server.listen(4)
        server.settimeout(0.5)
        port = server.getsockname()[1]
        sink = io.StringIO()
        monitor = StallMonitor({0: "task chief 0", 1: "task worker 0"}, 1.0, sink=sink, port=port).start()
        try:
            beats = [Heartbeat(f"127.0.0.1:{port}", r, lifeline=False) for r in (0, 1)]
            beats[0].set("run", "in the PS protocol")
            beats[1].set("user")
            _wait_for(lambda: "Parallax stall: task chief 0 has waited" in sink.getvalue())
            try:
                server.accept()
                raise AssertionError("a heartbeat connected to the server's TCP port")
            except TimeoutError:
                pass
        finally:
            monitor.stop()
    assert "for task worker 0, which has finished 0 sess.run calls" in sink.getvalue()
