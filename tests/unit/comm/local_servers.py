"""TensorFlow servers of one cluster in this process (loopback, fresh ports): what the unit tests of the pieces that
talk over worker 0's server (parallax/comm/chief_queues.py, the exit barrier of parallax/member/joined.py) run on."""

from __future__ import annotations

import socket

import tensorflow as tf


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def worker_servers(size: int) -> list[tf.distribute.Server]:
    """The started servers of a cluster of ``size`` workers, in task order."""
    spec = tf.train.ClusterSpec({"worker": [f"localhost:{_free_port()}" for _ in range(size)]})
    return [tf.distribute.Server(spec, job_name="worker", task_index=i, start=True) for i in range(size)]
