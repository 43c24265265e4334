"""Waiting for MPI requests without holding a core (parallax.comm.arrival), with fake requests."""

from __future__ import annotations

import time

import pytest

from parallax.comm import arrival
from parallax.comm.arrival import arrive, wait_asleep


class Request:
    """Done at the ``after``-th test."""

    def __init__(self, after: int):
        self.after = after
        self.tests = 0

    def Test(self) -> bool:  # noqa: N802 - mpi4py's name
        self.tests += 1
        return self.tests >= self.after


@pytest.fixture
def naps(monkeypatch):
    slept: list[float] = []
    monkeypatch.setattr(time, "sleep", slept.append)
    return slept


def test_without_a_spin_it_sleeps_between_tests_each_nap_twice_the_last_up_to_the_bound(naps):
    request = Request(after=8)
    wait_asleep(request, first_nap=1e-5, longest_nap=8e-5)
    assert request.tests == 8
    assert naps == [1e-5, 2e-5, 4e-5, 8e-5, 8e-5, 8e-5, 8e-5]


def test_a_request_done_while_spinning_never_sleeps(naps):
    request = Request(after=50)
    wait_asleep(request, spin=10.0)
    assert request.tests == 50 and naps == []


def test_after_the_spin_it_sleeps(naps, monkeypatch):
    clock = iter([0.0, 0.0, 0.5, 2.0, 2.0, 2.0, 2.0])  # the spin (1 s) is over at the third look
    monkeypatch.setattr(time, "perf_counter", lambda: next(clock))
    request = Request(after=5)
    wait_asleep(request, spin=1.0)
    assert request.tests == 5
    assert naps == [arrival.FIRST_NAP_SECONDS, arrival.FIRST_NAP_SECONDS * 2]


def test_on_waiting_is_called_before_each_nap(naps):
    seen = []
    wait_asleep(Request(after=3), on_waiting=lambda: seen.append(len(naps)))
    assert seen == [0, 1] and len(naps) == 2


class Comm:
    def __init__(self):
        self.calls = []

    def Ibarrier(self):  # noqa: N802 - mpi4py's name
        self.calls.append("Ibarrier")
        return Request(after=1)


def test_arrive_makes_no_call_without_a_spin_and_an_ibarrier_with_one(naps):
    comm = Comm()
    arrive(comm, None)
    assert comm.calls == []
    arrive(comm, 0.0)
    assert comm.calls == ["Ibarrier"] and naps == []
