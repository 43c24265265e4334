"""The interface every all-reduce backend implements.

A backend is used twice:

1. at rewrite time, inside a scratch graph, to build the ops that sum dense
   gradients (:meth:`Backend.allreduce_sum`) and gather sparse ones
   (:meth:`Backend.allgather`) across worker processes. It gets every gradient
   at once, sorted by variable name, so it can fuse them and must issue its
   communication in that order on every worker;
2. at run time, in each worker process, to prepare what its ops need
   (:meth:`Backend.prepare_graph_def` for the graph, :meth:`Backend.session_target`
   for a server).
"""

from __future__ import annotations

import importlib.util
from abc import ABC, abstractmethod
from typing import Any

import tensorflow as tf

from parallax.errors import PlanError
from parallax.plan.model import BACKENDS, CommSpec

__all__ = ["Backend", "backend_for", "horovod_available"]


class Backend(ABC):
    """Cross-worker communication for one rewrite.

    Args:
        spec: the plan's communication settings.
        num_workers: how many worker processes take part.
    """

    name = "base"

    def __init__(self, spec: CommSpec, num_workers: int) -> None:
        self.spec = spec
        self.num_workers = num_workers
        self._last: tf.Operation | None = None

    # -- rewrite time (inside a scratch graph) ---------------------------- #
    @abstractmethod
    def allreduce_sum(self, tensors: list[tf.Tensor]) -> list[tf.Tensor]:
        """Sum each tensor over the workers; outputs in input order."""

    @abstractmethod
    def allgather(self, pairs: list[tuple[tf.Tensor, tf.Tensor]]) -> list[tuple[tf.Tensor, tf.Tensor]]:
        """Concatenate each ``(values, indices)`` pair over the workers, worker 0 first."""

    def finalize_nodes(self, nodes: list) -> None:  # noqa: B027 - optional hook
        """Adjust the NodeDefs built in the scratch graph (default: nothing)."""

    def follow(self, other: Backend) -> None:
        """Issue this backend's communication after ``other``'s (one order of calls per process)."""
        self._last = other._last

    def _chained(self, build):
        """Build ops that run after the previous communication op of this backend."""
        deps = [self._last] if self._last is not None else []
        with tf.control_dependencies(deps):
            outputs = build()
        first = outputs[0] if isinstance(outputs, (list, tuple)) else outputs
        self._last = first.op
        return outputs


def horovod_available() -> bool:
    """Whether ``horovod.tensorflow`` can be imported (without importing it)."""
    return importlib.util.find_spec("horovod") is not None


def backend_for(spec: CommSpec, num_workers: int, group: str = "") -> Any:
    """The backend object ``spec.backend`` names.

    ``group``: a named subset of the workers (``"host"``); only the mpi
    backend supports one.

    Raises:
        PlanError: the backend is unknown, or horovod is asked for but not installed.
    """
    if spec.backend == "mpi":
        from parallax.comm.mpi import MPIBackend

        return MPIBackend(spec, num_workers, group)
    if group:
        raise PlanError(f"the {spec.backend} backend cannot communicate within a group of workers")
    if spec.backend == "collective":
        from parallax.comm.collective import CollectiveBackend

        return CollectiveBackend(spec, num_workers)
    if spec.backend == "horovod":
        if not horovod_available():
            raise PlanError("all-reduce backend 'horovod' was asked for, but horovod is not installed "
                            "(it builds only against TensorFlow <= 2.15; see docs/api.md). Use "
                            "MPIConfig(backend='mpi') or 'collective'")
        from parallax.comm.horovod import HorovodBackend

        return HorovodBackend(spec, num_workers)
    raise PlanError(f"unknown all-reduce backend {spec.backend!r}; known: {', '.join(BACKENDS)}")
