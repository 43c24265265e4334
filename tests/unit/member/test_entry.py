"""The rank's door (parallax/member/entry.py): a host's other ranks wait for its first one's registration."""

from __future__ import annotations

import threading
import time

from parallax.invocation import LaunchIdentity
from parallax.member.entry import before_on_host, wait_for_registration


def test_a_rank_waits_until_its_hosts_first_rank_registers(tmp_path):
    def register() -> None:
        time.sleep(0.3)
        (tmp_path / "rank_2.json").write_text("{}")

    threading.Thread(target=register).start()
    started = time.monotonic()
    assert wait_for_registration(str(tmp_path), 2, longest=10, poll=0.05)
    assert time.monotonic() - started >= 0.25


def test_a_rank_starts_anyway_after_the_longest_wait(tmp_path):
    assert not wait_for_registration(str(tmp_path), 0, longest=0.2, poll=0.05)


def test_nothing_to_wait_for_where_the_job_directory_is_not_on_this_host(tmp_path):
    assert wait_for_registration(str(tmp_path / "elsewhere"), 0, longest=60)


def test_each_rank_waits_for_the_one_before_it_on_its_host():
    hosts = ["a", "b", "a", "b", "b", "a"]
    assert [before_on_host(hosts, r) for r in range(6)] == [None, None, 0, 1, 3, 2]


def test_the_launcher_tells_every_rank_whether_to_stagger():
    identity = LaunchIdentity("[]", "MPI", "d", 0, None, True)
    assert LaunchIdentity.from_json(identity.to_json()).staggered
    assert not LaunchIdentity.from_json(LaunchIdentity("[]").to_json()).staggered
