"""All-reduce backends behind one small interface (:class:`parallax.comm.base.Backend`).

``mpi``: mpi4py called from the graph (``numpy_function``), fused buffers,
one deterministic call order. ``collective``: TF's CollectiveReduceV2 /
CollectiveGatherV2 (NCCL on GPUs). ``horovod``: Horovod's ops, when horovod
imports.
"""

from parallax.comm.base import Backend, backend_for, horovod_available

__all__ = ["Backend", "backend_for", "horovod_available"]
