"""The workers of a job a cluster manager started, over queues on worker 0's server (parallax/comm/chief_queues.py):
three TensorFlow servers of one cluster in this process (loopback, fresh ports), a thread as each worker."""

from __future__ import annotations

import threading

import numpy as np

from parallax.comm.chief_queues import ChiefQueues
from tests.unit.comm.local_servers import worker_servers

CHIEF = "/job:worker/replica:0/task:0/device:CPU:0"


def _workers(size: int) -> list[ChiefQueues]:
    return [ChiefQueues(server.target, i, size, CHIEF, timeout_ms=60_000)
            for i, server in enumerate(worker_servers(size))]


def test_each_call_gives_every_worker_every_value_in_worker_order_however_far_ahead_one_runs():
    groups = _workers(3)
    got: dict[int, list] = {}

    def work(index: int) -> None:
        group = groups[index]
        calls = [group.gather({"worker": index, "call": call}) for call in range(4)]  # worker 2 starts late below
        calls.append(group.sum(np.array([1.0, 0.5]) * (index + 1)))
        calls.append(group.any(index == 1))
        got[index] = calls

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    threads[0].join(0.5)  # workers 0 and 1 wait in their first call for worker 2
    assert not got
    threads.append(threading.Thread(target=work, args=(2,)))
    threads[-1].start()
    for thread in threads:
        thread.join(60)
    assert sorted(got) == [0, 1, 2]
    for index, calls in got.items():
        assert (groups[index].size, groups[index].index) == (3, index)
        for call in range(4):
            assert calls[call] == [{"worker": w, "call": call} for w in range(3)], (index, call)
        np.testing.assert_array_equal(calls[4], [6.0, 3.0])
        assert calls[5] is True
