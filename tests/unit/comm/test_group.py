"""The job's workers as a group (parallax/comm/group.py), without processes: a process alone, and the MPI
group's gather over a hand-written communicator of two workers (its sum is MPI's own, tested in the jobs)."""

from __future__ import annotations

import numpy as np

from parallax.comm.group import Alone, MPIWorkers


class TwoWorkers:
    """A communicator as worker 1 of 2 sees it; the other worker holds ``other``."""

    def __init__(self, other):
        self.other = other

    def Get_size(self):
        return 2

    def Get_rank(self):
        return 1

    def allgather(self, value):
        return [self.other, value]



def test_a_process_alone_is_a_group_of_one_that_gathers_and_sums_its_own_values():
    alone = Alone()
    assert (alone.size, alone.index) == (1, 0)
    assert alone.gather({"a": 1}) == [{"a": 1}]
    np.testing.assert_array_equal(alone.sum(np.array([1, 2])), [1.0, 2.0])
    assert alone.any(True) and not alone.any(False)


def test_the_mpi_group_gathers_every_workers_value_in_worker_order():
    group = MPIWorkers(TwoWorkers(other=([3, 4], None)))
    assert (group.size, group.index) == (2, 1)
    gathered = group.gather(([5], "mine"))
    assert gathered == [([3, 4], None), ([5], "mine")]
