"""The job's workers as a group a program's own loop can talk to between steps (outside the graph).

What runs around the training steps sometimes needs every worker: summing the states of Keras
metrics over the workers' batches, agreeing to stop. :class:`WorkerGroup` is that, in the
smallest form: how many workers, which one this is, a sum of arrays, a gather of values, an
agreement. Processes
Parallax launches hold an MPI communicator of the workers (:class:`MPIWorkers`); a process that
trains alone is a group of one (:class:`Alone`). The processes a cluster manager started
(``TF_CONFIG``) have no MPI: they talk over worker 0's TensorFlow server
(:class:`parallax.comm.chief_queues.ChiefQueues`).

Every worker must make the same calls in the same order (they are collectives).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np

__all__ = ["WorkerGroup", "MPIWorkers", "Alone"]


class WorkerGroup(ABC):
    """The job's workers (see the module docstring)."""

    @property
    @abstractmethod
    def size(self) -> int:
        """How many workers the job has."""

    @property
    @abstractmethod
    def index(self) -> int:
        """This worker's index (0: the chief)."""

    @abstractmethod
    def sum(self, values: np.ndarray) -> np.ndarray:
        """``values`` summed over the workers (every worker gets the sum)."""

    @abstractmethod
    def gather(self, value: Any) -> list:
        """Every worker's ``value`` (any picklable object), in worker order (every worker gets the list)."""

    def any(self, flag: bool) -> bool:
        """Whether any worker says ``flag``."""
        return bool(self.sum(np.array([1.0 if flag else 0.0]))[0] > 0)


class MPIWorkers(WorkerGroup):
    """The workers of a job Parallax launched, over their MPI communicator (``None``: ``COMM_WORLD``)."""

    def __init__(self, comm: Any = None) -> None:
        self._comm = comm

    @property
    def comm(self) -> Any:
        if self._comm is None:
            from mpi4py import MPI

            self._comm = MPI.COMM_WORLD
        return self._comm

    @property
    def size(self) -> int:
        return self.comm.Get_size()

    @property
    def index(self) -> int:
        return self.comm.Get_rank()

    def sum(self, values: np.ndarray) -> np.ndarray:
        from mpi4py import MPI

        send = np.ascontiguousarray(values, dtype=np.float64)
        out = np.empty_like(send)
        self.comm.Allreduce(send, out, op=MPI.SUM)
        return out

    def gather(self, value: Any) -> list:
        return self.comm.allgather(value)


class Alone(WorkerGroup):
    """A process that trains alone: a group of one."""

    @property
    def size(self) -> int:
        return 1

    @property
    def index(self) -> int:
        return 0

    def sum(self, values: np.ndarray) -> np.ndarray:
        return np.asarray(values, dtype=np.float64)

    def gather(self, value: Any) -> list:
        return [value]
