"""The watch on a manager-started task's peers: a peer gone before the job finished ends this task."""

from __future__ import annotations

import socket
import threading

from parallax.member.joined import PeerWatch


def watch(up: dict[str, bool], finished=lambda: False, grace: float = 2.0) -> PeerWatch:
    peers = [(name, "h", port) for port, name in enumerate(up)]
    names = {port: name for port, name in enumerate(up)}
    return PeerWatch(peers, "chief 0", finished=finished, grace=grace, probe=lambda host, port: up[names[port]],
                     end=lambda message: None)


def test_a_peer_gone_for_the_grace_is_named():
    up = {"worker 0": True, "ps 0": True}
    w = watch(up)
    assert w.check(0.0) is None
    up["ps 0"] = False
    assert w.check(1.0) is None  # within the grace
    assert w.check(3.5) == "ps 0 (h:1)"  # lost since 1.0


def test_a_peer_back_within_the_grace_is_not_named():
    up = {"worker 0": True}
    w = watch(up)
    w.check(0.0)
    up["worker 0"] = False
    w.check(1.0)
    up["worker 0"] = True
    w.check(1.5)
    up["worker 0"] = False
    assert w.check(3.0) is None  # lost again at 3.0, not since 1.0


def test_a_peer_never_seen_is_left_to_the_session():
    w = watch({"worker 1": False})
    assert w.check(0.0) is None and w.check(100.0) is None


def test_a_peer_gone_after_the_job_finished_is_a_normal_end():
    up = {"worker 0": True}
    w = watch(up, finished=lambda: True)
    w.check(0.0)
    up["worker 0"] = False
    assert w.check(10.0) is None


def test_the_thread_ends_the_task_naming_the_peer_over_real_sockets():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        server.listen()
        port = server.getsockname()[1]
        ended: list[str] = []
        done = threading.Event()

        def end(message: str) -> None:
            ended.append(message)
            done.set()

        w = PeerWatch([("worker 1", "127.0.0.1", port)], "chief 0", finished=lambda: False, grace=0.3, end=end,
                      interval=0.05)
        w.start()
        while "worker 1" not in w.seen:
            done.wait(0.05)
    # the listening socket is closed: connections are refused from now on
    assert done.wait(5), "the watch did not end the task"
    assert ended == [f"Parallax job failed: task worker 1 (127.0.0.1:{port}) has ended or cannot be reached; "
                     "ending task chief 0"]


def test_the_training_loop_probes_when_the_thread_has_not():
    """The watch thread can be held up while TensorFlow starts; a step's end then probes (at most every interval)
    so a peer that is up now is watched, and one that dies later is named (the gap a kill 0.1 s into
    training fell through)."""
    up = {"worker 1": True}
    ended: list[str] = []
    peers = [("worker 1", "h", 0)]
    w = PeerWatch(peers, "chief 0", finished=lambda: False, grace=1.0, probe=lambda host, port: up["worker 1"],
                  end=ended.append, interval=0.5)
    w._last_round = 9.9  # the thread's last round, just before worker 1 was up
    w.poll(10.0)  # a step's first end probes whatever the thread did
    assert w.seen == {"worker 1"}
    up["worker 1"] = False
    w.poll(10.2)  # within the interval: no round
    assert "worker 1" not in w.lost
    w.poll(10.6)
    w.poll(11.7)
    assert ended == ["Parallax job failed: task worker 1 (h:0) has ended or cannot be reached; ending task chief 0"]
    w.poll(13.0)
    assert len(ended) == 1 and w.failed()


def test_the_peer_that_went_first_is_named_not_one_that_ended_because_of_it():
    """The chief ends when worker 0 dies; a server that sees both gone names worker 0, though the chief
    comes first in its list; two peers first missed in the same round are named together."""
    up = {"chief 0": True, "worker 0": True}
    ended: list[str] = []
    w = PeerWatch([("chief 0", "h", 1), ("worker 0", "h", 2)], "ps 0", finished=lambda: False, grace=1.0,
                  probe=lambda host, port: up["chief 0" if port == 1 else "worker 0"], end=ended.append)
    w.poll(0.0)
    up["worker 0"] = False
    w.poll(1.0)
    up["chief 0"] = False  # it saw worker 0 go, and ended
    w.poll(1.6)
    w.poll(2.2)
    assert ended == ["Parallax job failed: task worker 0 (h:2) has ended or cannot be reached; ending task ps 0"]
    up.update({"chief 0": False, "worker 0": False})
    both = PeerWatch([("chief 0", "h", 1), ("worker 0", "h", 2)], "ps 0", finished=lambda: False, grace=1.0,
                     probe=lambda host, port: False, end=ended.append)
    both.seen = {"chief 0", "worker 0"}
    both.poll(5.0)
    both.poll(6.0)
    assert ended[-1] == ("Parallax job failed: task chief 0 (h:1) and worker 0 (h:2) have ended or cannot be "
                         "reached; ending task ps 0")


def test_the_heartbeat_of_a_joined_process_polls_its_watch():
    from parallax.managers.tf_config import read_tf_config
    from parallax.member.joined import JoinedProcess

    config = '{"cluster": {"worker": ["localhost:1", "localhost:2"]}, "task": {"type": "worker", "index": 1}}'
    process = JoinedProcess(read_tf_config({"TF_CONFIG": config}))
    beat = process.heartbeat("start")
    beat.set("run", "")
    beat.step_done()  # no watch yet (the server starts after the role's heartbeat): nothing to do
    polled: list[float] = []
    process._watch = type("W", (), {"poll": lambda self, now: polled.append(now)})()
    beat.step_done()
    assert len(polled) == 1


def test_a_peer_never_seen_up_is_named_when_another_goes():
    """A server whose probes were held up while worker 0 started and died sees only the chief go (it ended
    because of worker 0): both are named, worker 0 first, since either may have gone first."""
    up = {"chief 0": True, "worker 0": False}
    ended: list[str] = []
    w = PeerWatch([("chief 0", "h", 1), ("worker 0", "h", 2)], "ps 0", finished=lambda: False, grace=1.0,
                  probe=lambda host, port: up["chief 0" if port == 1 else "worker 0"], end=ended.append)
    w.poll(0.0)
    up["chief 0"] = False
    w.poll(1.0)
    w.poll(2.5)
    assert ended == ["Parallax job failed: task worker 0 (h:2) and chief 0 (h:1) have ended or cannot be reached; "
                     "ending task ps 0"]


def test_the_exit_barrier_asks_worker_0_nothing_before_its_port_takes_connections(monkeypatch):
    """A parameter server arrives at the barrier at once; its TensorFlow runtime must not try worker 0's
    server before it listens (a gRPC channel that failed backs off, and worker 0's first steps, which make
    the server receive from it over the same channel, would fail: ExitBarrier.wait)."""
    from parallax.member import joined

    barrier = joined.ExitBarrier("grpc://localhost:1", identity=1, total=2, chief=False, timeout_ms=1000,
                                 chief_address=("localhost", 2))
    listening = iter([False, False, True])
    probes, asked = [], []
    monkeypatch.setattr(joined, "_reachable", lambda host, port: probes.append(port) or next(listening, True))
    monkeypatch.setattr(joined.time, "sleep", lambda seconds: None)
    monkeypatch.setattr(barrier, "_run", lambda fetch: asked.append((len(probes), fetch)) or 2)
    assert barrier.wait(bound=None) is None
    assert asked[0] == (3, barrier._arrive)  # the first call after the third probe, the first that connected


def test_a_task_started_again_arrives_at_the_exit_barrier_once():
    """A parameter server that arrived, ended (its watch saw a worker gone) and was started again by its manager
    while worker 0 went on, arrives again: the barrier still waits for worker 0 and the other worker (a count
    of arrivals let the server leave with 0, and worker 0 then waited for it without end)."""
    from parallax.member.joined import ExitBarrier
    from tests.unit.comm.local_servers import worker_servers

    server = worker_servers(1)[0]

    def arrive(identity: int) -> ExitBarrier:
        barrier = ExitBarrier(server.target, identity, total=3, chief=identity == 0, timeout_ms=5000)
        barrier._run(barrier._arrive)
        return barrier

    arrive(2)
    again = arrive(2)  # the server started again
    assert not again.complete()
    arrive(1)
    assert not again.complete()
    assert arrive(0).complete() and again.complete()
