"""Build the ``mpirun`` command line and environment (pure: no processes, no files).

The command starts one process per rank, hosts in order, and re-runs the
user's own program in each (``python -m parallax.member.entry <program>``: as
``python -m mpi4py`` runs it, so that an exception in any rank aborts the whole
job instead of leaving the others blocked in a collective, after the host's
first rank has reached its training call where the launcher asks so).

When a rank uses GPUs, every rank gets its own ``CUDA_VISIBLE_DEVICES`` before
its program starts: the command is then one ``mpirun`` application context per
run of consecutive ranks with the same GPUs (``-np 1 env
CUDA_VISIBLE_DEVICES=2 python -m parallax.member.entry <program> : ...``; MPI numbers the
ranks in context order, and ``--host`` and ``--map-by slot`` place them as
before). CUDA, and so TensorFlow, NCCL and any other library of the rank, then
sees only the rank's GPUs, numbered from 0; a rank without GPUs (a parameter
server) sees none.
"""

from __future__ import annotations

import itertools
import shlex
from collections import Counter
from dataclasses import dataclass

from parallax.errors import LaunchError
from parallax.invocation import FORWARDED
from parallax.launch.layout import RankSpec
from parallax.launch.output import LEVEL_ENV, QUIET_LEVEL

__all__ = ["LaunchCommand", "build_mpirun_command", "placement", "rank_gpus", "SESSION_DIR_ENV", "GPUS_ENV"]


#: Open MPI 5's variable for the base of its session directories (read by mpirun and its daemons).
SESSION_DIR_ENV = "PRTE_MCA_prte_tmpdir_base"
#: The module every rank starts with (:mod:`parallax.member.entry`).
ENTRY = "parallax.member.entry"
#: The GPUs CUDA shows a process (read once, when CUDA starts in it).
GPUS_ENV = "CUDA_VISIBLE_DEVICES"


@dataclass(frozen=True)
class LaunchCommand:
    """An argv list and the environment variables to add for it."""

    argv: tuple[str, ...]
    env: dict[str, str]


def build_mpirun_command(mpirun: str, python: str, program: list[str], ranks: tuple[RankSpec, ...], *,
                         local_hosts: frozenset[str], cpu_count: int, is_root: bool,
                         user_options: str = "", parallax_env: dict[str, str] | None = None,
                         environ: dict[str, str] | None = None, allocated: dict[str, int] | None = None,
                         session_dir: str | None = None) -> LaunchCommand:
    """The ``mpirun`` invocation for ``ranks``.

    Args:
        mpirun: path of ``mpirun``.
        python: the Python interpreter to run in each rank.
        program: what follows the interpreter: a script and its arguments, or
            ``-m module ...``.
        ranks: one entry per rank, in rank order.
        local_hosts: host names that mean this machine.
        cpu_count: cores of this machine the job may use (more local ranks than cores need
            ``--oversubscribe``; as many or more, ``mpi_yield_when_idle``; a job of this machine alone
            with no more ranks than cores has them bound to cores: :func:`placement`).
        is_root: running as root (Open MPI refuses without two variables).
        user_options: ``MPIConfig.mpirun_options``, appended as given.
        parallax_env: ``PARALLAX_*`` variables for the ranks.
        environ: the launcher's environment (which of :data:`parallax.invocation.FORWARDED` to pass; its
            ``CUDA_VISIBLE_DEVICES``, within which the ranks' GPUs count: :func:`rank_gpus`).
        allocated: inside a Slurm allocation, its tasks per node, which Open MPI takes
            as the nodes' slots: a node given more ranks (a server beside the workers,
            a worker per GPU) needs ``--oversubscribe``.
        session_dir: a directory new to this job, for Open MPI's session files on every
            host (``prte_tmpdir_base``), unless the user chose one. Their default,
            ``/tmp/ompi.<pid>`` (``/tmp/prted.<pid>`` on other hosts), stays behind when
            a job is killed, and a later ``mpirun`` given the same pid then fails to
            start ("The PMIx server's listener thread failed to start").

    Returns:
        The command and the environment variables to set for ``mpirun``.

    Raises:
        LaunchError: a rank's GPUs are not in the launcher's ``CUDA_VISIBLE_DEVICES``.
    """
    environ = environ or {}
    gpus = rank_gpus(ranks, environ.get(GPUS_ENV))
    slots = Counter(r.host for r in ranks)
    hosts = ",".join(f"{h}:{n}" for h, n in slots.items())
    local = all(h in local_hosts for h in slots)
    busiest = max((n for h, n in slots.items() if h in local_hosts), default=0)
    argv = [mpirun] + (["-np", str(len(ranks))] if gpus is None else []) + ["--host", hosts] + \
        placement(bound_cores(ranks, local_hosts, cpu_count, user_options), user_options)
    if busiest > cpu_count or any(n > (allocated or {}).get(h, n) for h, n in slots.items()):
        argv += ["--oversubscribe"]
    if busiest >= cpu_count:
        # as many ranks as cores or more: a waiting rank must yield its core instead of busy-polling.
        # Measured on 2 cores, 2 ranks: without it 1 run in 3 fell to a tenth of the speed.
        argv += ["--mca", "mpi_yield_when_idle", "1"]
    if local:
        argv += ["--mca", "btl_tcp_if_include", "lo"]
    env = dict(parallax_env or {})
    for name in sorted(env):
        argv += ["-x", name]
    for name in FORWARDED:
        if name in environ and name not in env and not (name == GPUS_ENV and gpus is not None):
            argv += ["-x", name]
    if LEVEL_ENV not in environ:  # TensorFlow's INFO lines off in the ranks; the user's level is forwarded above
        argv += ["-x", f"{LEVEL_ENV}={QUIET_LEVEL}"]
    if user_options:
        argv += shlex.split(user_options)
    if gpus is None:
        argv += [python, "-m", ENTRY, *program]
    else:
        contexts = [(value, len(list(run))) for value, run in itertools.groupby(gpus)]
        for i, (value, count) in enumerate(contexts):
            argv += [":"] if i else []
            argv += ["-np", str(count), "env", f"{GPUS_ENV}={value}", python, "-m", ENTRY, *program]
    extra = {}
    if session_dir and not _sets_session_dir(user_options, environ):
        extra[SESSION_DIR_ENV] = session_dir
    if is_root:
        extra.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    extra.update(env)
    return LaunchCommand(tuple(argv), extra)


def bound_cores(ranks: tuple[RankSpec, ...], local_hosts: frozenset[str], cpu_count: int,
                user_options: str = "") -> int:
    """The cores ``mpirun`` binds each rank to, its own (:func:`placement`): a job on this machine alone, with no
    more ranks than ``cpu_count`` cores, gives each rank its share; else, or where the user's ``mpirun_options``
    place the ranks themselves (``--map-by`` / ``--bind-to``), 0: the ranks are not bound.

    >>> ranks = (RankSpec("localhost", None, 0), RankSpec("localhost", None, 1))
    >>> bound_cores(ranks, frozenset({"localhost"}), 8), bound_cores(ranks, frozenset(), 8)
    (4, 0)
    >>> here = frozenset({"localhost"})
    >>> bound_cores(ranks, here, 1), bound_cores(ranks, here, 8, "--bind-to none")
    (0, 0)
    """
    slots = Counter(r.host for r in ranks)
    busiest = max(slots.values(), default=0)
    if not busiest or busiest > cpu_count or any(h not in local_hosts for h in slots) or \
            _given(user_options) & {"map-by", "bind-to"}:
        return 0
    return cpu_count // busiest


def _given(user_options: str) -> set[str]:
    """The options named in ``user_options``, without their dashes and values."""
    return {word.lstrip("-").split("=")[0] for word in shlex.split(user_options) if word.startswith("-")}


def placement(cores_per_rank: int, user_options: str = "") -> list[str]:
    """How ``mpirun`` places the ranks and binds them to cores, unless the user's options say it
    (``--map-by`` / ``--bind-to`` in ``MPIConfig.mpirun_options``: theirs alone, the other one ours).

    ``cores_per_rank`` > 0 (a job on this machine alone, with no more ranks than cores): each rank
    is bound to that many cores of its own (``--map-by slot:PE=k --bind-to core``), as its share of
    the cores is what its TensorFlow thread pools are sized to
    (:meth:`parallax.job.settings.Settings.threads_per_process`); the scheduler then no longer
    moves a rank's threads onto the core another rank computes on (measured on 2 cores, 2 ranks of
    ``parallax.fit``: 11-12 ms a step bound against 15 unbound, docs/benchmarks.md). Otherwise
    (other hosts, whose cores this machine does not know; more ranks than cores) ranks are not
    bound (``--bind-to none``) and the operating system shares the cores.

    >>> placement(1), placement(0)
    (['--map-by', 'slot:PE=1', '--bind-to', 'core'], ['--map-by', 'slot', '--bind-to', 'none'])
    >>> placement(2, "--bind-to numa")
    ['--map-by', 'slot']
    """
    given = _given(user_options)
    bound = cores_per_rank > 0 and "map-by" not in given and "bind-to" not in given
    mapping = [] if "map-by" in given else ["--map-by", f"slot:PE={cores_per_rank}" if bound else "slot"]
    binding = [] if "bind-to" in given else ["--bind-to", "core" if bound else "none"]
    return mapping + binding


def rank_gpus(ranks: tuple[RankSpec, ...], inherited: str | None = None) -> tuple[str, ...] | None:
    """Each rank's ``CUDA_VISIBLE_DEVICES``: its GPU ids (``""`` for a rank without GPUs, which
    then sees none), or ``None`` when no rank uses a GPU (nothing is set).

    ``inherited``: the launching process's own ``CUDA_VISIBLE_DEVICES``, when set: the resource
    file's GPU ids count within it (as TensorFlow numbers the GPUs there), on every host.

    >>> from parallax.resources.cluster import Device, Role
    >>> ranks = (RankSpec("a", (Device("gpu", 1),), 1), RankSpec("a", (Device("gpu", 0), Device("gpu", 2)), 2),
    ...          RankSpec("a", None, 0, Role.PS))
    >>> rank_gpus(ranks)
    ('1', '0,2', '')
    >>> rank_gpus(ranks, "4,5,6")
    ('5', '4,6', '')

    Raises:
        LaunchError: a rank is given a GPU beyond the inherited list.
    """
    if not any(r.gpu_ids for r in ranks):
        return None
    if inherited is None:
        return tuple(",".join(map(str, r.gpu_ids)) for r in ranks)
    listed = [g.strip() for g in inherited.split(",") if g.strip()]
    out = []
    for rank, r in enumerate(ranks):
        beyond = [i for i in r.gpu_ids if i >= len(listed)]
        if beyond:
            raise LaunchError(f"rank {rank} (on host {r.host}) is given GPU {beyond[0]}, but {GPUS_ENV}="
                              f"{inherited!r} here lists {len(listed)} GPU(s), within which the resource file's GPU "
                              f"ids count on every host: list ids below {len(listed)}, or unset {GPUS_ENV}")
        out.append(",".join(listed[i] for i in r.gpu_ids))
    return tuple(out)


def _sets_session_dir(user_options: str, environ: dict[str, str]) -> bool:
    return "tmpdir_base" in user_options or any(name.endswith("tmpdir_base") for name in environ)
