"""The plan's vocabularies, one enum each: how a job's processes share the work (:class:`Layout`), how the
variables cross its workers (:class:`CrossWorker`) and how one variable's gradient does (:class:`Sync`).

A member compares equal to its value and prints as it, so plans in JSON, messages and the strings that cross
processes are what they were; code names the cases by member, so a misspelt case is an ``AttributeError``,
not a branch never taken. :mod:`parallax.plan.model` holds them (importable from there); they live here so
that :mod:`parallax.plan.describe`, a base of the plan, can name them too.
"""

from __future__ import annotations

from enum import Enum

__all__ = ["Layout", "Sync", "CrossWorker", "SYNC_METHODS"]


class _Named(str, Enum):
    """A case of one of the plan's vocabularies: it compares equal to its value and prints as it."""

    def __str__(self) -> str:
        return self.value


class Layout(_Named):
    """How a job's processes share the work: the run option in force once the resources are known.

    ``LOCAL``: one worker process trains alone (its devices in-graph replicas); ``MPI``: a process per device,
    every gradient all-reduced or all-gathered; ``PS``: workers and parameter servers; ``HYBRID``: a process per
    device, sparse variables on parameter servers, dense ones all-reduced. A member compares equal to its name
    (``Layout.MPI == "MPI"``, what the launcher sends its ranks), and code names the cases by member, so a
    misspelt case is an ``AttributeError``, not a branch never taken.
    """

    LOCAL = "local"
    MPI = "MPI"
    PS = "PS"
    HYBRID = "HYBRID"

    @property
    def launched(self) -> bool:
        """Whether the job's processes are started through mpirun (every layout but ``LOCAL``)."""
        return self is not Layout.LOCAL

    @property
    def all_reduces(self) -> bool:
        """Whether a process per device all-reduces (``MPI``, ``HYBRID``)."""
        return self in (Layout.MPI, Layout.HYBRID)


class Sync(_Named):
    """How a variable's gradient reaches the other workers (:attr:`parallax.plan.model.VariablePlacement.sync`).
    ``LOCAL``: it does not (only this worker's replicas aggregate; every variable without a gradient);
    ``ALLREDUCE``: summed across every worker (a sparse one made dense first); ``ALLGATHER``: a sparse gradient's
    rows gathered from every worker; ``PS``: sent to the parameter server that holds the variable. A member
    compares equal to its value (``Sync.PS == "ps"``, as plans in JSON say it)."""

    LOCAL = "local"
    ALLREDUCE = "allreduce"
    ALLGATHER = "allgather"
    PS = "ps"

    @property
    def collective(self) -> bool:
        """Whether the workers call a collective for it among themselves (``ALLREDUCE``, ``ALLGATHER``)."""
        return self in (Sync.ALLREDUCE, Sync.ALLGATHER)


SYNC_METHODS = tuple(m.value for m in Sync)


class CrossWorker(_Named):
    """How the variables of a job cross its workers, all alike or weighed one by one
    (:func:`parallax.plan.policies.choose_sync`). ``LOCAL``: they do not (one worker); ``ALLREDUCE``: dense
    gradients all-reduced, sparse ones all-gathered (MPI); ``PS``: every variable on the servers; ``HYBRID``:
    sparse ones on the servers, dense ones all-reduced; ``AUTO``: each the cheapest way by
    :mod:`parallax.plan.cost`."""

    LOCAL = "local"
    ALLREDUCE = "allreduce"
    PS = "ps"
    HYBRID = "hybrid"
    AUTO = "auto"

    @classmethod
    def of(cls, layout: Layout, run_option: str) -> CrossWorker:
        """How the variables cross the workers of a job laid out as ``layout`` under the run option
        ``run_option`` (``PS``, ``MPI``, ``HYBRID`` or ``AUTO``): as the layout says, but that ``AUTO``
        weighs each variable wherever a process per device all-reduces (the one place a run option or a
        layout becomes a way across workers).

        >>> [str(CrossWorker.of(layout, "AUTO")) for layout in Layout]
        ['local', 'auto', 'ps', 'auto']
        >>> [str(CrossWorker.of(layout, layout.value)) for layout in Layout]
        ['local', 'allreduce', 'ps', 'hybrid']
        """
        if run_option == "AUTO" and layout.all_reduces:
            return cls.AUTO
        return {Layout.LOCAL: cls.LOCAL, Layout.MPI: cls.ALLREDUCE, Layout.PS: cls.PS,
                Layout.HYBRID: cls.HYBRID}[layout]
