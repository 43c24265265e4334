"""How a job's processes communicate, as plain frozen data: the settings a plan carries.

:class:`CommSpec` says how gradients cross worker processes (the backends, fusion, compression,
overlap), :class:`PSSpec` how variables on parameter servers are read and updated. Both are
importable from :mod:`parallax.plan.model` too, whose :class:`~parallax.plan.model.Plan` holds them.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["CommSpec", "PSSpec"]


@dataclass(frozen=True)
class CommSpec:
    """How gradients cross worker processes.

    Attributes:
        backend: the backend that sums dense gradients: ``mpi`` (mpi4py
            inside the graph), ``collective`` (TF CollectiveReduceV2/
            CollectiveGatherV2) or ``horovod``.
        gather_backend: the backend that all-gathers sparse gradients; by
            default ``backend``, or ``mpi`` when ``use_allgatherv`` asks for
            MPI's ``Allgatherv``.
        host_backend: the backend that gathers sparse gradients among the
            workers of one host (HYBRID's host aggregation).
        fusion_bytes: the mpi backend fuses dense gradients into buffers of at
            most this many bytes (a larger single gradient gets its own).
        use_allgatherv: all-gather sparse gradients with MPI ``Allgatherv``
            whatever the backend.
        gpu: the replicas are GPUs (collectives use NCCL).
        job_key: a number that tells this job's collectives from those of
            another job of the same processes (0 until the plan sets it from
            its contents, see :func:`parallax.plan.policies.build_plan`).
        compression: the format floating gradients cross processes in:
            ``"none"`` (their own dtype), ``"fp16"`` or ``"bf16"``
            (:mod:`parallax.comm.compression`), in all-reduces, all-gathers and
            pushes to parameter servers; ``"auto"`` until the plan decides.
        wire_formats: the 16-bit formats ``backend`` and ``gather_backend`` both
            carry (their ``Backend.wire_formats``, which the settings read).
        overlap: all-reduce dense gradients in the order the backward pass makes
            them ready, bucket by bucket (:mod:`parallax.rewrite.readiness`);
            ``False``: after the whole backward pass, in one call.
    """

    backend: str = "mpi"
    gather_backend: str = ""
    host_backend: str = "mpi"
    fusion_bytes: int = 64 * 1024 * 1024
    use_allgatherv: bool = False
    gpu: bool = False
    job_key: int = 0
    compression: str = "none"
    wire_formats: tuple[str, ...] = ("fp16", "bf16")
    overlap: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "wire_formats", tuple(self.wire_formats))
        if not self.gather_backend:
            object.__setattr__(self, "gather_backend", "mpi" if self.use_allgatherv else self.backend)



@dataclass(frozen=True)
class PSSpec:
    """How PS-synchronised variables communicate (from ``PSConfig``).

    Attributes:
        local_aggregation: sum a worker's replicas' gradients before sending
            them (one send per worker); otherwise each replica sends its own.
        protocol: the servers' protocol.
        replicate_variables: each replica reads local copies of the dense
            variables, refreshed once per step (synchronous training only).
        boundary_among_servers: the ops between the gradients and the update
            (clipping) run on the servers instead of the chief worker.
        boundary_between_workers_and_servers: gathers of rows (embedding
            lookups) run on the server, so only the rows travel; otherwise
            the replica reads the whole variable and gathers locally.
        host_aggregation: (HYBRID, one replica per worker, several hosts,
            one with several workers) the workers of a host gather their
            sparse gradients over MPI to the host's first worker, which alone
            sends them, rows merged, to the servers.
        release_in_step: the chief may release the other workers inside its
            step, as soon as the update is done, when nothing else writes a
            server variable (:mod:`parallax.rewrite.ps_sync`); off when the
            user gave hooks, which must run before anyone goes on.
        num_servers: how many of the job's servers hold variables: ``0``
            weighs it (:func:`parallax.plan.cost.servers_to_call`); ``n``,
            the first ``n`` in :func:`~parallax.plan.cost.servers_to_call`'s
            order (all of them when the job has fewer).
    """

    local_aggregation: bool = True
    protocol: str = "grpc"
    replicate_variables: bool = True
    boundary_among_servers: bool = True
    boundary_between_workers_and_servers: bool = True
    host_aggregation: bool = False
    release_in_step: bool = True
    num_servers: int = 0

