"""Build the ``mpirun`` command line and environment (pure: no processes, no files).

The command starts one process per rank, hosts in order, and re-runs the
user's own program in each (``python -m mpi4py <program>``, so that an
exception in any rank aborts the whole job instead of leaving the others
blocked in a collective).
"""

from __future__ import annotations

import shlex
from collections import Counter
from dataclasses import dataclass

from parallax.launch.layout import RankSpec

__all__ = ["LaunchCommand", "build_mpirun_command", "FORWARDED_ENV", "SESSION_DIR_ENV"]

#: environment variables every rank gets from the launcher (when set there).
FORWARDED_ENV = ("PYTHONPATH", "PATH", "LD_LIBRARY_PATH", "TF_CPP_MIN_LOG_LEVEL", "CUDA_VISIBLE_DEVICES",
                 "PARALLAX_FINISH_TIMEOUT", "PARALLAX_NUM_PARTITIONS", "PARALLAX_SEARCH_STEPS",
                 "PARALLAX_CACHE_DIR", "PARALLAX_RESOURCE_INFO", "PARALLAX_MPIRUN_OPTIONS", "PARALLAX_RUN_OPTION",
                 "VIRTUAL_ENV", "OMPI_MCA_coll_tuned_allreduce_algorithm", "OMPI_MCA_coll_tuned_use_dynamic_rules",
                 "GLIBC_TUNABLES", "PARALLAX_NATIVE_OPS", "PARALLAX_ARRIVAL_SPIN_US", "PARALLAX_HUGE_PAGES",
                 "PARALLAX_TUNED", "PARALLAX_USE_TUNED",
                 "PARALLAX_TRIAL", "PARALLAX_TRIAL_RESULT", "PARALLAX_SWEEP_PARAMS")


#: Open MPI 5's variable for the base of its session directories (read by mpirun and its daemons).
SESSION_DIR_ENV = "PRTE_MCA_prte_tmpdir_base"


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
        cpu_count: cores of this machine (more local ranks than cores need
            ``--oversubscribe``; as many or more, ``mpi_yield_when_idle``).
        is_root: running as root (Open MPI refuses without two variables).
        user_options: ``MPIConfig.mpirun_options``, appended as given.
        parallax_env: ``PARALLAX_*`` variables for the ranks.
        environ: the launcher's environment (which of ``FORWARDED_ENV`` to pass).
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
    """
    environ = environ or {}
    slots = Counter(r.host for r in ranks)
    hosts = ",".join(f"{h}:{n}" for h, n in slots.items())
    argv = [mpirun, "-np", str(len(ranks)), "--host", hosts, "--map-by", "slot", "--bind-to", "none"]
    local = all(h in local_hosts for h in slots)
    busiest = max((n for h, n in slots.items() if h in local_hosts), default=0)
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
    for name in FORWARDED_ENV:
        if name in environ and name not in env:
            argv += ["-x", name]
    if user_options:
        argv += shlex.split(user_options)
    argv += [python, "-m", "mpi4py", *program]
    extra = {}
    if session_dir and not _sets_session_dir(user_options, environ):
        extra[SESSION_DIR_ENV] = session_dir
    if is_root:
        extra.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    extra.update(env)
    return LaunchCommand(tuple(argv), extra)


def _sets_session_dir(user_options: str, environ: dict[str, str]) -> bool:
    return "tmpdir_base" in user_options or any(name.endswith("tmpdir_base") for name in environ)
