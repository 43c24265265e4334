"""parallax/member/joined.py: how a task a cluster manager started ends."""

from __future__ import annotations

import pytest
import tensorflow as tf

from parallax.errors import PeerLost
from parallax.member import joined, peer_watch


@pytest.mark.parametrize("error, code, said", [
    (PeerLost("Parallax: a peer of worker 1 ended or started again"), 143, "a peer of worker 1 ended"),
    (tf.errors.UnavailableError(None, None, "Collective ops is aborted by: recvmsg:Connection reset by peer\nmore"),
     143, "a call to a peer task failed (UnavailableError: Collective ops is aborted by: recvmsg:Connection reset"),
    (tf.errors.AbortedError(None, None, "the peer restarted"), 143, "(AbortedError: the peer restarted)"),
    (ValueError("the program's own"), 1, "this task ended with an exception"),
], ids=["peer-lost", "unavailable", "aborted", "the-programs-own"])
def test_a_task_ends_with_143_where_a_peer_left_it_unable_to_go_on_else_with_1(monkeypatch, error, code, said):
    """A manager restarts 128-255 (the job resumes from its checkpoint) and fails the job on 1: a task that a
    peer's end or restart stopped must not end with 1, or the manager leaves it down while the others wait."""
    ended: list[tuple[str, int]] = []
    for module in (joined, peer_watch):  # _end: print, then os._exit
        monkeypatch.setattr(module, "_end", lambda message, code=1: ended.append((message, code)))
    joined._end_after(error, None)
    assert len(ended) == 1 and ended[0][1] == code and said in ended[0][0], ended


def test_a_task_whose_session_failed_for_a_peer_names_the_peer_its_watch_sees_gone(monkeypatch):
    """The session fails at once when a peer's collectives abort; the watch names the peer that ended once it
    has been unreachable for its grace: the task waits that long for the name before it ends unnamed."""
    ended: list[tuple[str, int]] = []
    for module in (joined, peer_watch):
        monkeypatch.setattr(module, "_end", lambda message, code=1: ended.append((message, code)))
    clock = [0.0]
    monkeypatch.setattr(peer_watch.time, "monotonic", lambda: clock[0])
    up = {"chief 0": True, "worker 1": False}
    watch = peer_watch.PeerWatch([(name, "localhost", port) for port, name in enumerate(up)], "worker 0",
                                 finished=lambda: False, grace=3.0,
                                 probe=lambda host, port: up[list(up)[port]])
    watch.seen.update(up)  # both were up before
    monkeypatch.setattr(watch, "settle", lambda within: peer_watch.PeerWatch.settle(
        watch, within, sleep=lambda seconds: clock.__setitem__(0, clock[0] + seconds)))
    joined._end_after(PeerLost("Parallax: a peer of worker 1 ended or started again"), watch)
    assert ended[0][1] == 143 and "task worker 1 (localhost:1) has ended or cannot be reached" in ended[0][0], ended
