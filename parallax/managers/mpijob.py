"""Kubeflow's MPIJob: the launcher's host file as the job's resources (pure).

The MPI Operator starts worker pods, writes a host file listing them
(``/etc/mpi/hostfile``: ``<pod>.<service> slots=<n>`` for Open MPI,
``<pod>:<n>`` for Intel MPI and MPICH) and points the launcher pod's MPI at it
through an environment variable. A training script (or ``parallax-run``) run
in the launcher with no resource file, or with ``resource_info="mpijob"``,
reads that file: one line per worker pod, one process per slot, launched
through the same ``mpirun`` (over the ssh the operator sets up).

A slot is one replica on the CPU (``cpu:<i>``) unless ``PARALLAX_SLOT_DEVICE=gpu``
(``parallax manifest --kind mpijob`` sets it when the workers have GPUs): the
launcher pod has no GPUs of its own to count.

>>> hostfile_text("job-worker-0.job-worker slots=2\\njob-worker-1.job-worker:1\\n", "f", gpus=False)
'job-worker-0.job-worker: cpu:0,cpu:1\\njob-worker-1.job-worker: cpu:0\\n'
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping

from parallax.errors import ResourceFileError
from parallax.invocation import SLOT_DEVICE_ENV, Invocation

__all__ = ["MPIJOB", "HOSTFILE_ENVS", "hostfile_of", "in_launcher", "hostfile_text", "resource_text", "source_name"]

#: ``resource_info`` naming the MPIJob's host file.
MPIJOB = "mpijob"
#: Where MPI implementations are told their default host file (the MPI Operator sets the one of its MPI).
HOSTFILE_ENVS = ("OMPI_MCA_orte_default_hostfile", "PRTE_MCA_prte_default_hostfile", "I_MPI_HYDRA_HOST_FILE",
                 "HYDRA_HOST_FILE")
_LINE = re.compile(r"^(?P<host>[^\s:]+)(?:\s*:\s*(?P<colon>\d+)|(?P<rest>(?:\s+\S+)*))$")


def hostfile_of(environ: Mapping[str, str]) -> tuple[str, str] | None:
    """``(variable, path)`` of the host file this environment points MPI at, if any."""
    for name in HOSTFILE_ENVS:
        path = environ.get(name, "").strip()
        if path:
            return name, path
    return None


def in_launcher(environ: Mapping[str, str]) -> bool:
    """Whether this looks like an MPIJob's launcher: a default host file is set and exists
    (and this is not a process Parallax itself launched)."""
    found = hostfile_of(environ)
    return found is not None and os.path.isfile(found[1]) and Invocation.from_env(environ).launch is None


def source_name(environ: Mapping[str, str]) -> str:
    """How messages name the host file, e.g. ``the MPIJob host file /etc/mpi/hostfile (OMPI_MCA_...)``."""
    found = hostfile_of(environ)
    return f"the MPIJob host file {found[1]} ({found[0]})" if found else "the MPIJob host file (none set)"


def resource_text(environ: Mapping[str, str]) -> str:
    """The resource file the environment's host file stands for.

    Raises:
        ResourceFileError: no host file is set, or it cannot be read or parsed.
    """
    found = hostfile_of(environ)
    if found is None:
        raise ResourceFileError(f"resource_info {MPIJOB!r}: no MPI host file is set (none of "
                                f"{', '.join(HOSTFILE_ENVS)}); run inside a Kubeflow MPIJob's launcher")
    name, path = found
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ResourceFileError(f"{source_name(environ)}: cannot read it: {e}") from e
    device = Invocation.from_env(environ).comm.slot_device
    if device not in ("cpu", "gpu"):
        raise ResourceFileError(f"{SLOT_DEVICE_ENV}={device!r}; expected cpu or gpu")
    return hostfile_text(text, source_name(environ), gpus=device == "gpu")


def hostfile_text(text: str, source: str, gpus: bool) -> str:
    """An MPI host file as a resource file: ``host slots=N`` (Open MPI), ``host:N`` (Intel MPI, MPICH)
    or a bare ``host`` (one slot); one replica per slot, on GPU ``i`` or ``cpu:i``.

    Raises:
        ResourceFileError: naming the line.
    """
    lines = []
    for number, raw in enumerate(text.splitlines(), start=1):
        content = raw.split("#", 1)[0].strip()
        if not content:
            continue
        match = _LINE.match(content)
        slots = None
        if match and match.group("colon"):
            slots = int(match.group("colon"))
        elif match:
            slots = 1
            for option in (match.group("rest") or "").split():
                key, _, value = option.partition("=")
                if key in ("slots", "max_slots", "max-slots") and not value.isdigit():
                    match = None
                    break
                if key == "slots":
                    slots = int(value)
        if not match or not slots:
            raise ResourceFileError(f'{source}, line {number}: "{content}"; expected "<host> slots=<n>" or '
                                    '"<host>:<n>" with n >= 1')
        ids = ",".join(str(i) if gpus else f"cpu:{i}" for i in range(slots))
        lines.append(f"{match.group('host')}: {ids}\n")
    if not lines:
        raise ResourceFileError(f"{source}: no hosts in the host file")
    return "".join(lines)
