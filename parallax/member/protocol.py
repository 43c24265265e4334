"""What a process of a multi-process job offers its role, whoever started it.

Two kinds of member implement :class:`JobMember`: a process mpirun started
(:class:`parallax.member.rank.LaunchedProcess`) and a task a cluster manager started
(:class:`parallax.member.joined.JoinedProcess`). The roles (:mod:`parallax.member.roles`) are written once
against this protocol.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from parallax.comm.broadcast import Broadcast
    from parallax.comm.group import WorkerGroup
    from parallax.job.plan import JobPlan, ProcessSpec
    from parallax.job.settings import Settings

__all__ = ["JobMember", "NoHeartbeat"]


class JobMember(Protocol):
    """What a process of a multi-process job offers its role (see the module docstring)."""

    def process_in(self, job: JobPlan) -> ProcessSpec:
        """This process's part of ``job``."""

    def server(self, start: Callable[[], Any], chief: bool = False) -> Any:
        """This process's TensorFlow server, started once by ``start()``."""

    def start_server(self, job: JobPlan, settings: Settings, process: ProcessSpec,
                     group_leader: str | None = None) -> Any:
        """Start this process's server in the cluster of ``job``."""

    def split_comms(self) -> tuple[Any, Any]:
        """The MPI communicators of the job's workers and of this host's workers (``(None, None)`` without MPI)."""

    def heartbeat(self, state: str, where: str = "") -> Any:
        """This process's heartbeat to a stall monitor, now in ``state``."""

    def exit_together(self, how: str, finish_timeout: float) -> None:
        """Register how this process leaves the job (``"finish"`` or ``"barrier"``)."""

    def broadcast(self, job: JobPlan, process: ProcessSpec, settings: Settings) -> Broadcast:
        """How this worker takes worker 0's values of the variables the workers hold."""

    def workers_group(self) -> WorkerGroup | None:
        """The job's workers as a group a program's loop can talk to (``None``: no means to)."""


class NoHeartbeat:
    """Stands in for a heartbeat where the launcher runs no stall monitor."""

    def set(self, state: str, where: str = "", steps: int | None = None) -> None:
        pass

    def step_done(self) -> None:
        pass

    def preempt(self) -> None:
        pass
