"""Which worker this process is, before the graph is known: ``(num_workers, worker_id, num_replicas)``.

``parallel_run`` returns these with the session; for a ``tf.function`` step traced at its first call
(:mod:`parallax.tf2.deferred`), it returns them before there is a graph to plan. They are known then:

* a process the launcher started: from the ranks the launcher sent (every worker rank, in rank order; its own
  devices);
* the process the user started: one worker, with the first resource line's devices. That is what it trains when
  the job is one local worker; when the job is launched, it trains nothing (it launches the job at the step's
  first call and exits with its exit code), and the numbers only let the program's own code run to that call.

The step checks them against its job once the graph is planned.
"""

from __future__ import annotations

import os

from parallax.invocation import Invocation
from parallax.member.rank import launched_process
from parallax.resources.cluster import Role
from parallax.resources.files import parse_resource_file

__all__ = ["numbers", "replicas_in_job"]


def numbers(invocation: Invocation, resource_info: str | os.PathLike | None, redirect_path: str | None,
            gpus: int) -> tuple[int, int, int]:
    """``(num_workers, worker_id, num_replicas)`` of this process (see the module docstring).

    Args:
        invocation: this process's invocation.
        resource_info: the resource file ``parallel_run`` was given.
        redirect_path: where a launched process's output goes (``Config.redirect_path``).
        gpus: the GPUs a bare host line stands for.

    Raises:
        ValueError: a process a cluster manager started (``TF_CONFIG``), whose numbers depend on the plan.
    """
    if invocation.launch is not None:
        launched = launched_process(invocation, redirect_path)
        ranks = launched.context.ranks
        workers = [i for i, r in enumerate(ranks) if r.role == Role.WORKER]
        if launched.rank not in workers:  # a server: it trains nothing
            return len(workers), 0, 1
        return len(workers), workers.index(launched.rank), _replicas(ranks[launched.rank].devices, gpus)
    if invocation.tf_config is not None:
        raise ValueError("parallel_run: a tf.function step without an input_signature is traced at its first call, "
                         "and a task a cluster manager starts (TF_CONFIG) learns its worker_id from the job's plan, "
                         "which needs the traced graph: give the tf.function an input_signature")
    return 1, 0, _replicas(parse_resource_file(resource_info).workers[0].devices, gpus)


def replicas_in_job(invocation: Invocation, resource_info: str | os.PathLike | None, redirect_path: str | None,
                    gpus: int) -> int | None:
    """How many replicas the whole job trains (every worker's), known alike in the process the user started and in
    each process the launcher started; ``None`` where it is not known before the plan (a task a cluster manager
    started) or the resources cannot be read here (arguments as :func:`numbers`)."""
    if invocation.launch is not None:
        ranks = launched_process(invocation, redirect_path).context.ranks
        devices = [r.devices for r in ranks if r.role == Role.WORKER]
    elif invocation.tf_config is not None:
        return None
    else:
        try:
            devices = [w.devices for w in parse_resource_file(resource_info).workers]
        except Exception:  # noqa: BLE001 - parallel_run reads the resources again, and says what is wrong
            return None
    return sum(_replicas(d, gpus) for d in devices)


def _replicas(devices: tuple | None, gpus: int) -> int:
    """The replicas of a worker of ``devices`` (``None``: a bare host line, every GPU or one CPU)."""
    return len(devices) if devices else max(1, gpus)
