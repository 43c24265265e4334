"""The first code of every process the launcher starts: ``python -m parallax.member.entry <program> ...``.

Every rank runs the user's whole program, its data preparation too, up to the training call. Programs
prepare their data as one process does: ``keras.utils.get_file`` downloads into a shared cache when the
file is missing and (Keras 3, ``extract=True``) extracts it again each time, ``tfds`` and other caches write
files once and then read them. Ranks of one host that run that at the same moment write the same files
while others read them, and train on other data than one device would (:func:`parallax.tf2.batches.check_same`
refuses what it sees of that, later). So, unless ``Config.staggered_start`` is off, the ranks of a host run
the program one after another up to their training call: each starts when the host's rank before it has
reached its own (and registered in the job's directory), and finds the files made, which no other rank of
its host writes meanwhile. The job's ranks meet in the training call anyway: this costs the host's ranks'
ways there, one after another, once per job.

Its random generators are then seeded as every other rank's (:mod:`parallax.member.seeds`), and the program
runs as ``python -m mpi4py`` runs it, so that an exception in any rank aborts the whole job
instead of leaving the others blocked in a collective.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from parallax.invocation import Invocation

__all__ = ["main", "before_on_host", "wait_for_registration"]

#: How often a waiting rank looks for the registration of the rank before it (seconds).
POLL_SECONDS = 0.2
#: How long a rank waits for the rank before it on its host before it starts anyway (seconds): a program that
#: meets its other ranks before the training call (its own MPI calls) would otherwise wait for ever.
LONGEST_WAIT = 600.0


def before_on_host(hosts: list[str], rank: int) -> int | None:
    """The rank before ``rank`` on its host (``hosts``: each rank's host, in rank order); ``None`` for the host's
    first.

    >>> before_on_host(["a", "a", "b", "b", "a"], 4), before_on_host(["a", "a", "b"], 2)
    (1, None)
    """
    earlier = [r for r in range(rank) if hosts[r] == hosts[rank]]
    return earlier[-1] if earlier else None


def wait_for_registration(job_dir: str, rank: int, longest: float = LONGEST_WAIT,
                          poll: float = POLL_SECONDS) -> bool:
    """Wait until ``rank`` has registered in ``job_dir`` (reached its training call), at most ``longest``
    seconds. Returns whether it did; ``True`` at once where ``job_dir`` is not on this host (nothing to wait
    for: registration happens on the launcher's file system)."""
    if not os.path.isdir(job_dir):
        return True
    path = os.path.join(job_dir, f"rank_{rank}.json")
    deadline = time.monotonic() + longest
    while not os.path.exists(path):
        if time.monotonic() > deadline:
            return False
        time.sleep(poll)
    return True


def _hold_until_first(rank: int, invocation: Invocation) -> None:
    """What the module docstring says, for this process (``rank``), as the launcher asked (``invocation``)."""
    from parallax.launch.layout import layout_from_json

    identity, job_dir = invocation.launch, invocation.channel.job_dir
    if identity is None or not identity.staggered or not job_dir:
        return
    before = before_on_host([r.host for r in layout_from_json(identity.ranks)], rank)
    if before is None:
        return
    from mpi4py import MPI  # noqa: F401 - MPI starts here: its start is collective, the first rank's waits for ours

    if not wait_for_registration(job_dir, before):
        print(f"Parallax: rank {rank} waited {LONGEST_WAIT:.0f} s for rank {before} (the one before it on its host) "
              "to reach its training call, and starts now (Config.staggered_start)", file=sys.stderr, flush=True)


def _world_rank(environ: Mapping[str, str]) -> int:
    """This process's rank, as the MPI launcher tells it in ``environ`` before MPI starts."""
    for name in ("OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"):
        if environ.get(name, "").isdigit():
            return int(environ[name])
    return 0


def main() -> None:
    """Hold this rank as :func:`_hold_until_first` says, then run the program (``sys.argv[1:]``) as
    ``python -m mpi4py`` does: the door of a launched rank, which reads its environment here."""
    from parallax.invocation import current

    invocation = current()
    _hold_until_first(_world_rank(os.environ), invocation)
    if invocation.launch is not None and invocation.launch.seed is not None:
        from parallax.member.seeds import seed_alike

        seed_alike(invocation.launch.seed)
    from mpi4py.run import main as run_program

    sys.argv[:] = ["mpi4py", *sys.argv[1:]]
    run_program()


if __name__ == "__main__":
    main()
