"""The workers of a job a cluster manager started (``TF_CONFIG``), as a :class:`~parallax.comm.group.WorkerGroup`
over queues on worker 0's TensorFlow server.

The tasks of such a job share no MPI, only their servers (gRPC). What runs around the training steps still needs
every worker now and then: ``parallax.fit`` sums the metrics' states over the workers where the logs are read,
agrees on a stop, checks that the workers drew the same batches; a custom loop's metrics are summed the same way
(:mod:`parallax.tf2.summed`). :class:`ChiefQueues` does that with the smallest means the servers have, as the
tasks' exit barrier does (:class:`parallax.member.joined.ExitBarrier`): every call is a :meth:`gather`. Each worker
puts its value (pickled) with its index into one queue on worker 0's server; worker 0 takes them all, orders them by
worker, and puts the list into a queue of each other worker's own; each takes its copy from it. A worker that runs
ahead to the next call cannot take another's copy (each has its queue), and worker 0 takes a call's values only
once every worker has put one, so the calls line up as MPI's collectives do. A sum is the gathered arrays added in
worker order: the same numbers on every worker.

A worker that died leaves the others waiting in a call: its peers' watch (:mod:`parallax.member.peer_watch`) ends
them within seconds, naming it, as it does for a step; ``timeout_ms`` bounds a call in any case.
"""

from __future__ import annotations

import pickle
import threading
from typing import Any

import numpy as np

from parallax.comm.group import WorkerGroup

__all__ = ["ChiefQueues", "ChiefSession"]


class ChiefQueues(WorkerGroup):
    """The workers of a ``TF_CONFIG`` job over queues on worker 0's server (see the module docstring).

    Args:
        target: this worker's server (``server.target``), through which worker 0's is reached.
        index: this worker's index (0: worker 0).
        size: the job's workers.
        chief_device: worker 0's CPU, where the queues are.
        timeout_ms: how long one call may wait for the other workers.
    """

    def __init__(self, target: str, index: int, size: int, chief_device: str, timeout_ms: int) -> None:
        import tensorflow as tf

        self._index, self._size = index, size
        graph = tf.Graph()
        with graph.as_default(), tf.device(chief_device):
            values = tf.queue.FIFOQueue(size, [tf.int32, tf.string], shapes=[[], []],
                                        shared_name="parallax_group_values", name="values")
            copies = [tf.queue.FIFOQueue(1, [tf.string], shapes=[[]], shared_name=f"parallax_group_copy_{w}",
                                         name=f"copy_{w}") for w in range(size)]
            self._value = tf.compat.v1.placeholder(tf.string, [])
            self._put = values.enqueue((index, self._value))
            if index == 0:
                self._take_all = values.dequeue_many(size)
                self._give = [q.enqueue(self._value) for q in copies[1:]]
            else:
                self._take = copies[index].dequeue()
        device = chief_device.split("/device:")[0]
        config = tf.compat.v1.ConfigProto(device_filters=[device], operation_timeout_in_ms=timeout_ms)
        self._run = ChiefSession(target, graph, config).run

    @property
    def size(self) -> int:
        return self._size

    @property
    def index(self) -> int:
        return self._index

    def gather(self, value: Any) -> list:
        self._run(self._put, {self._value: pickle.dumps(value)})
        if self._index != 0:
            return pickle.loads(self._run(self._take))  # noqa: S301 - a worker of this job's own values
        indices, payloads = self._run(self._take_all)
        every: list = [None] * self._size
        for worker, payload in zip(indices, payloads):
            every[int(worker)] = pickle.loads(payload)  # noqa: S301 - as above
        if self._give:
            self._run(self._give, {self._value: pickle.dumps(every)})
        return every

    def sum(self, values: np.ndarray) -> np.ndarray:
        every = self.gather(np.ascontiguousarray(values, dtype=np.float64))
        total = every[0].copy()
        for other in every[1:]:
            total += other
        return total


class ChiefSession:
    """A session on ``graph`` through the server ``target``, made at its first use; one call at a time.

    ``lock_timeout``: how long a call waits for the one before it (:class:`TimeoutError`, "worker 0 does not
    answer", past it); ``None`` waits as long as that call takes.
    """

    def __init__(self, target: str, graph: Any, config: Any, lock_timeout: float | None = None) -> None:
        self._target, self._graph, self._config = target, graph, config
        self._session: Any = None
        self._lock = threading.Lock()
        self._lock_timeout = -1 if lock_timeout is None else lock_timeout

    def run(self, fetches: Any, feeds: dict | None = None) -> Any:
        import tensorflow as tf

        if not self._lock.acquire(timeout=self._lock_timeout):
            raise TimeoutError("worker 0 does not answer")
        try:
            if self._session is None:
                self._session = tf.compat.v1.Session(self._target, graph=self._graph, config=self._config)
            return self._session.run(fetches, feed_dict=feeds)
        finally:
            self._lock.release()
