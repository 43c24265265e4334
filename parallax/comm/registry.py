"""Backends by name: the one place that maps a backend's name to its class.

Each backend module is imported only when its backend is asked for (horovod
may not be installed). The backend modules import :mod:`parallax.comm.base`,
never this module, so there is no import circle.
"""

from __future__ import annotations

import importlib
import importlib.util

from parallax.comm.base import Backend
from parallax.config import BACKENDS
from parallax.errors import PlanError
from parallax.plan.model import CommSpec, Plan, Sync

__all__ = ["backend_class", "backend_for", "backends_in_use", "choose_backend", "backend_without_mpirun",
           "horovod_available", "wire_formats"]

#: Each backend's module and class, in the order of :data:`parallax.config.BACKENDS`.
_CLASSES = dict(zip(BACKENDS, (("parallax.comm.mpi", "MPIBackend"), ("parallax.comm.collective", "CollectiveBackend"),
                               ("parallax.comm.horovod", "HorovodBackend")), strict=True))


#: What ``MPIConfig.backend='auto'`` means, by where the replicas are: NCCL without leaving the GPU, MPI on CPUs.
_AUTO = {True: "collective", False: "mpi"}
#: The backends that work beside parameter servers: TF collectives and a shared PS in one step abort
#: (``AbortedError ... Cleanup``, docs/modes.md), so HYBRID all-reduces over MPI (or Horovod) instead.
_BESIDE_SERVERS = frozenset({"mpi", "horovod"})


def choose_backend(asked: str, gpu: bool, beside_servers: bool = False) -> tuple[str, str | None]:
    """The backend a job uses when ``MPIConfig.backend`` is ``asked`` (``"auto"`` or a name), and why
    it is another one, if it is (``None`` otherwise).

    >>> choose_backend("auto", gpu=True), choose_backend("auto", gpu=False)
    (('collective', None), ('mpi', None))
    >>> choose_backend("collective", gpu=True, beside_servers=True)[0]
    'mpi'
    """
    name = _AUTO[gpu] if asked == "auto" else asked
    if beside_servers and name not in _BESIDE_SERVERS:
        why = (f"beside parameter servers the gradients are all-reduced over MPI, not with MPIConfig.backend="
               f"{asked!r} (TF collectives abort beside a shared parameter server)")
        return "mpi", None if asked == "auto" else why
    return name, None


#: The one backend of workers that share no MPI: TensorFlow's collectives over their servers.
_WITHOUT_MPIRUN = "collective"


def backend_without_mpirun(asked: str) -> str | None:
    """The backend of workers that share no MPI (tasks a cluster manager started) when
    ``MPIConfig.backend`` is ``asked``, or ``None`` when the one asked for needs mpirun.

    >>> backend_without_mpirun("auto"), backend_without_mpirun("mpi")
    ('collective', None)
    """
    return _WITHOUT_MPIRUN if asked in ("auto", _WITHOUT_MPIRUN) else None


def horovod_available() -> bool:
    """Whether ``horovod.tensorflow`` can be imported (without importing it)."""
    return importlib.util.find_spec("horovod") is not None


def backend_class(name: str) -> type[Backend]:
    """The class of backend ``name``.

    Raises:
        PlanError: the backend is unknown, or horovod is asked for but not installed.
    """
    if name not in _CLASSES:
        raise PlanError(f"unknown all-reduce backend {name!r}; known: {', '.join(BACKENDS)}")
    if name == "horovod" and not horovod_available():
        raise PlanError("all-reduce backend 'horovod' was asked for, but horovod is not installed "
                        "(it builds only against TensorFlow <= 2.15; see docs/api.md). Use "
                        "MPIConfig(backend='mpi') or 'collective'")
    module, cls = _CLASSES[name]
    return getattr(importlib.import_module(module), cls)


def wire_formats(name: str, use_allgatherv: bool = False) -> tuple[str, ...]:
    """The 16-bit formats (``CommunicationConfig.compression``) backend ``name`` carries, and with
    ``use_allgatherv`` the ``mpi`` backend that then all-gathers too (read without importing horovod).

    >>> wire_formats("mpi"), wire_formats("collective"), wire_formats("collective", use_allgatherv=True)
    (('fp16', 'bf16'), ('fp16',), ('fp16',))
    """
    def formats(backend: str) -> tuple[str, ...]:
        if backend not in _CLASSES:
            return ()
        module, cls = _CLASSES[backend]
        return getattr(importlib.import_module(module), cls).wire_formats

    mine = formats(name)
    return tuple(f for f in mine if f in formats("mpi")) if use_allgatherv else mine


def backend_for(spec: CommSpec, num_workers: int, name: str | None = None, group: str = "") -> Backend:
    """A backend object for one rewrite: ``name`` (default ``spec.backend``), for the
    workers or, with ``group`` (``"host"``), for a named subset of them.

    Raises:
        PlanError: as :func:`backend_class`, or the backend cannot serve a group.
    """
    cls = backend_class(name or spec.backend)
    if group and not cls.supports_groups:
        raise PlanError(f"the {cls.name} backend cannot communicate within a group of workers")
    return cls(spec, num_workers, group)


def backends_in_use(plan: Plan) -> tuple[type[Backend], ...]:
    """The backend classes the rewritten graph of ``plan`` has ops of, each once, in a fixed order."""
    names = []
    syncs = {(v.sync, v.sparse) for v in plan.variables if v.gradient is not None}
    if (Sync.ALLREDUCE, False) in syncs or (Sync.ALLREDUCE, True) in syncs or plan.sums_replicas_across_workers:
        names.append(plan.comm.backend)
    if (Sync.ALLGATHER, True) in syncs:
        names.append(plan.comm.gather_backend)
    if (Sync.PS, True) in syncs and plan.ps.host_aggregation:
        names.append(plan.comm.host_backend)
    return tuple(backend_class(n) for n in dict.fromkeys(names))
