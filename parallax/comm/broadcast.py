"""How the workers start from worker 0's values of the variables they hold themselves.

Every worker of an all-reduce job (and every HYBRID worker) initialises its own
copy of the variables; before training, each takes worker 0's values, so that
they start equal whatever the program's seeds. Two ways, one interface:

* :class:`MPIBroadcast`: over an mpi4py communicator (processes mpirun started);
* :class:`CollectiveBroadcast`: TensorFlow's collective broadcast ops over the
  workers' servers (processes a cluster manager started: no MPI among them).

:meth:`Broadcast.build` adds the ops to the graph before the session is made
(the session finalises its graph); :meth:`Broadcast.run` runs them once.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import tensorflow as tf

from parallax.graph.names import ZERO_PREFIX

__all__ = ["Broadcast", "MPIBroadcast", "CollectiveBroadcast", "worker_variables"]


#: Each worker's own part of a sharded variable (ZeRO, :mod:`parallax.rewrite.zero`): never broadcast.
_OWN_PARTS = ZERO_PREFIX + "/"


def worker_variables(graph: tf.Graph) -> list:
    """The variables of ``graph`` the worker holds itself (not on a parameter server, not its own
    part of a sharded variable), by name."""
    found = [v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
             + graph.get_collection(tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
             if "/job:ps" not in v.device and not v.name.startswith(_OWN_PARTS)]
    return sorted({v.name: v for v in found}.values(), key=lambda v: v.name)


class Broadcast(ABC):
    """Worker 0's values of the worker-held variables, to every worker."""

    @abstractmethod
    def build(self, graph: tf.Graph) -> None:
        """Add the broadcast's ops to ``graph`` (its default graph while this runs)."""

    @abstractmethod
    def run(self, session: Any) -> None:
        """Run the broadcast once, in every worker together."""


class MPIBroadcast(Broadcast):
    """Over an mpi4py communicator (``None``: ``MPI.COMM_WORLD``): worker 0 reads its values, MPI
    broadcasts them, the others assign them."""

    def __init__(self, comm: Any = None) -> None:
        self._comm = comm
        self._assigns: list = []

    def build(self, graph: tf.Graph) -> None:
        with tf.name_scope("parallax_broadcast/"):
            for v in worker_variables(graph):
                ph = tf.compat.v1.placeholder(v.dtype.base_dtype, v.shape)
                assign = tf.compat.v1.assign(v, ph, validate_shape=False)
                self._assigns.append((v, ph, assign.op if isinstance(assign, tf.Tensor) else assign))

    def run(self, session: Any) -> None:
        from mpi4py import MPI

        comm = self._comm if self._comm is not None else MPI.COMM_WORLD
        values = session.run([v for v, _, _ in self._assigns])
        feeds = {}
        for (_, ph, _), value in zip(self._assigns, values):
            value = np.array(value, order="C", copy=True)
            if value.dtype == object:
                value = comm.bcast(value, root=0)
            else:
                comm.Bcast(value, root=0)
            feeds[ph] = value
        if comm.rank != 0:
            session.run([op for _, _, op in self._assigns], feed_dict=feeds)
        comm.Barrier()


class CollectiveBroadcast(Broadcast):
    """Over TensorFlow's collective ops among the workers' servers: worker 0 sends each variable
    (``CollectiveBcastSendV2``), the others receive and assign it, variables in name order.

    Args:
        num_workers: the workers of the job.
        root: this is worker 0.
        group_key: the collective group (its own: the gradients' group numbers its instances itself).
        timeout: seconds a collective waits for the other workers.
    """

    def __init__(self, num_workers: int, root: bool, group_key: int, timeout: float) -> None:
        self._num_workers = num_workers
        self._root = root
        self._group_key = group_key
        self._timeout = timeout
        self._op: Any = None

    def build(self, graph: tf.Graph) -> None:
        ops = []
        with tf.name_scope("parallax_broadcast/"):
            for key, v in enumerate(worker_variables(graph), start=1):
                common = dict(group_size=self._num_workers, group_key=self._group_key, instance_key=key,
                              communication_hint="auto", timeout_seconds=self._timeout)
                with tf.device(v.device):
                    if self._root:
                        ops.append(tf.raw_ops.CollectiveBcastSendV2(input=tf.convert_to_tensor(v), **common))
                    else:
                        value = tf.raw_ops.CollectiveBcastRecvV2(T=v.dtype.base_dtype, shape=v.shape.as_list(),
                                                                 **common)
                        ops.append(tf.compat.v1.assign(v, value, validate_shape=False))
            self._op = tf.group(ops) if ops else None

    def run(self, session: Any) -> None:
        if self._op is not None:
            session.run(self._op)
