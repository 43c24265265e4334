"""All-reduce backends behind one small interface (:class:`parallax.comm.base.Backend`).

``mpi``: mpi4py called from the graph (``numpy_function``), fused buffers,
one deterministic call order. ``collective``: TF's CollectiveReduceV2 /
CollectiveGatherV2 (NCCL on GPUs). ``horovod``: Horovod's ops, when horovod
imports. :mod:`parallax.comm.registry` finds them by name.
"""

from parallax.comm.base import Backend, Prepared, ProcessComms
from parallax.comm.registry import backend_class, backend_for, backends_in_use, horovod_available

__all__ = ["Backend", "Prepared", "ProcessComms", "backend_class", "backend_for", "backends_in_use",
           "horovod_available"]
