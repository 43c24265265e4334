"""The ``horovod`` backend: Horovod's allreduce/allgather ops (when horovod imports).

Ops added: ``HorovodAllreduce`` (sum) per dense gradient and
``HorovodAllgather`` of the values and of the indices per sparse gradient.
Horovod matches collectives across workers by op name, and the names come
from the plan, so every worker agrees. Each worker process calls
``horovod.tensorflow.init()`` before running the graph (see
:func:`prepare_process`).
"""

from __future__ import annotations

from parallax.comm.base import Backend

__all__ = ["HorovodBackend", "prepare_process"]


class HorovodBackend(Backend):
    """Horovod's TensorFlow ops (see the module docstring)."""

    name = "horovod"

    def allreduce_sum(self, tensors):
        import horovod.tensorflow as hvd

        return [hvd.allreduce(t, op=hvd.Sum, name=f"allreduce_{i}") for i, t in enumerate(tensors)]

    def allgather(self, pairs):
        import horovod.tensorflow as hvd

        return [(hvd.allgather(v, name=f"allgather_values_{i}"), hvd.allgather(ix, name=f"allgather_indices_{i}"))
                for i, (v, ix) in enumerate(pairs)]


def prepare_process() -> None:
    """Initialise Horovod in this worker process."""
    import horovod.tensorflow as hvd

    hvd.init()
