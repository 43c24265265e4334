"""The ``horovod`` backend: Horovod's allreduce/allgather ops (when horovod imports).

Ops added: ``HorovodAllreduce`` (sum) per dense gradient and
``HorovodAllgather`` of the values and of the indices per sparse gradient.
Horovod matches collectives across workers by op name, and the names come
from the plan, so every worker agrees. Each worker process calls
``horovod.tensorflow.init()`` before running the graph (see
:meth:`HorovodBackend.prepare`).
"""

from __future__ import annotations

from tensorflow.core.framework import graph_pb2

from parallax.comm.base import Backend, Prepared, ProcessComms

__all__ = ["HorovodBackend"]


class HorovodBackend(Backend):
    """Horovod's TensorFlow ops (see the module docstring)."""

    name = "horovod"
    wire_formats = ("fp16",)  # what hvd.Compression offers

    def allreduce_sum(self, tensors):
        # The op itself, not ``hvd.allreduce``: that one asks the initialised Horovod for
        # its size, and the graph is rewritten before ``hvd.init`` runs (start_session).
        from horovod.tensorflow.mpi_ops import Sum, _allreduce

        return [_allreduce(t, op=Sum, name=f"allreduce_{i}") for i, t in enumerate(tensors)]

    def allgather(self, pairs):
        import horovod.tensorflow as hvd

        return [(hvd.allgather(v, name=f"allgather_values_{i}"), hvd.allgather(ix, name=f"allgather_indices_{i}"))
                for i, (v, ix) in enumerate(pairs)]

    @classmethod
    def prepare(cls, graph_def: graph_pb2.GraphDef, comms: ProcessComms) -> Prepared:
        """Initialise Horovod in this worker process, on the workers' communicator.

        In a HYBRID job the parameter servers are in ``COMM_WORLD`` but take no
        part in the all-reduce, so Horovod must run on the workers' one (it
        duplicates it, so its messages never meet Parallax's own).
        """
        import horovod.tensorflow as hvd

        if comms.workers is None:
            hvd.init()
        else:
            hvd.init(comm=comms.workers)
        return Prepared(graph_def)
