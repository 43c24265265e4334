"""``parallax-run`` (= ``parallax run``): its arguments, and the run of a training script on the devices of a
resource file (or, with ``--check``, the check of the file's hosts)."""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

from parallax.cli.arguments import _count_arg, _seconds_arg, _shutdown_arg, _whole_arg
from parallax.cli.script import _run_forwarding_sigterm, _run_to_parallel_run
from parallax.errors import ParallaxError
from parallax.invocation import env_with
from parallax.managers.mpijob import MPIJOB
from parallax.resources.files import from_environment, parse_resource_file
from parallax.resources.slurm import SLURM


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parallax-run", description="Run a Parallax training script on the devices of a resource file: "
        "its parallel_run uses this resource file and starts the processes its run option needs through mpirun.")
    parser.add_argument("--resource_info", "-r", help="the resource file (replaces the script's); 'slurm': the "
                        "nodes of the Slurm allocation this runs in (the default inside one); 'mpijob': the host "
                        "file of a Kubeflow MPIJob's launcher (the default there)")
    parser.add_argument("--check", metavar="RESOURCE_FILE", default=None,
                        help="check every host of RESOURCE_FILE or 'slurm' (over ssh, or srun inside an "
                             "allocation: names both ways, the same Python and Parallax at the same paths, free "
                             "ports, the interface), print one line per host and exit (0: all ready); a program "
                             "given after it is checked on every host too")
    parser.add_argument("--mpirun_options", default="", help="extra mpirun options, e.g. '--mca btl ^openib'")
    parser.add_argument("--stall-shutdown", dest="stall_shutdown", type=_shutdown_arg, default=None, metavar="SECONDS",
                        help="end the job when a process has waited for its peers this long (replaces "
                             "Config.stall_shutdown, default 900; 'none': never)")
    parser.add_argument("--dry_run", action="store_true",
                        help="run the script up to parallel_run, print the mpirun command and exit")
    parser.add_argument("--timeout", type=_seconds_arg, default=600, help="--dry_run: seconds before giving up on the "
                        "script")
    elastic = parser.add_argument_group(
        "elastic jobs", "restart a job that loses a process or host from its last checkpoint, on the hosts that "
        "still answer (replace the script's ElasticConfig fields; docs/launching.md)")
    elastic.add_argument("--max-restarts", dest="max_restarts", type=_whole_arg, default=None, metavar="N",
                         help="restart the job at most N times (0: fail at the first failure)")
    elastic.add_argument("--min-np", dest="min_workers", type=_count_arg, default=None, metavar="N",
                         help="end the job rather than restart it on fewer than N worker processes")
    elastic.add_argument("--max-np", dest="max_workers", type=_count_arg, default=None, metavar="N",
                         help="at most N worker processes after a restart")
    elastic.add_argument("--host-discovery-script", dest="host_discovery_script", default=None, metavar="COMMAND",
                         help="run before each restart; prints the hosts to use, one 'host' or 'host:slots' a line")
    parser.add_argument("-m", dest="module", nargs=argparse.REMAINDER, default=None, metavar="MODULE ...",
                        help="run a module and its arguments (like python -m)")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="the script and its arguments")
    return parser


def _elastic_options(args: argparse.Namespace) -> str | None:
    """The elastic options given, as :data:`~parallax.invocation.ELASTIC_ENV`'s JSON (``None``: none)."""
    given = {name: getattr(args, name) for name in ("max_restarts", "min_workers", "max_workers",
                                                    "host_discovery_script") if getattr(args, name) is not None}
    return json.dumps(given, sort_keys=True) if given else None


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``parallax-run``; returns the job's exit code."""
    parser = _parser()
    args = parser.parse_args(argv)
    if args.check is None and args.resource_info is None:
        args.resource_info = from_environment(os.environ)
        if args.resource_info is None:
            parser.error("the following arguments are required: --resource_info/-r (or --check RESOURCE_FILE); "
                         "inside a Slurm allocation or an MPIJob's launcher their hosts are used when it is not "
                         "given")
    if args.module:
        program = ["-m", *args.module]
    elif args.program:
        script = args.program[0]
        if not os.path.exists(script):
            print(f"parallax-run: script {script!r} not found", file=sys.stderr)
            return 2
        program = [os.path.abspath(script), *args.program[1:]]
    elif args.check is not None:
        program = []
    else:
        print("parallax-run: give the training script (or -m module) to run", file=sys.stderr)
        return 2
    if args.check is not None:
        return _check(args.check, program)
    try:
        parse_resource_file(args.resource_info)  # a clear error now rather than from every process
    except (ParallaxError, OSError) as e:
        print(f"parallax-run: {e}", file=sys.stderr)
        return 2
    env = env_with(resource_info=args.resource_info if args.resource_info in (SLURM, MPIJOB)
                   else os.path.abspath(args.resource_info))
    if args.mpirun_options:
        env = env_with(env, mpirun_options=args.mpirun_options)
    elastic = _elastic_options(args)
    if elastic:
        env = env_with(env, elastic=elastic)
    if args.stall_shutdown is not None:
        env = env_with(env, stall_shutdown=args.stall_shutdown)
    if not args.dry_run:
        return _run_forwarding_sigterm([sys.executable, *program], env)
    with tempfile.TemporaryDirectory() as tmp:
        output = os.path.join(tmp, "command")
        env = env_with(env, dry_run=output)
        code = _run_to_parallel_run([sys.executable, *program], env, output, args.timeout, "parallax-run",
                                    "the program")
        if code == 0:
            with open(output, encoding="utf-8") as f:
                print(f.read(), end="")
    return code


def _check(resource_info: str, program: list[str]) -> int:
    """``parallax-run --check``: one line per host of the file (its GPUs among the facts); 0 when every host
    is ready. A bare host line stands for this machine's GPUs, as in a job started here."""
    from parallax.launch.command import GPUS_ENV
    from parallax.launch.launcher import check_job_hosts
    from parallax.launch.layout import RankSpec
    from parallax.launch.preflight import gpu_names
    from parallax.resources.cluster import Role

    try:
        cluster = parse_resource_file(resource_info)
    except (ParallaxError, OSError) as e:
        print(f"parallax-run: {e}", file=sys.stderr)
        return 2
    here, visible = len(gpu_names()), os.environ.get(GPUS_ENV)  # what TensorFlow would count here
    cluster = cluster.with_bare_hosts(here if visible is None else min(here, len([g for g in visible.split(",")
                                                                                   if g.strip()])))
    ranks = tuple(RankSpec(w.host, w.devices, w.line, Role.WORKER, w.port) for w in cluster.workers) + \
        tuple(RankSpec(s.host, None, s.line, Role.PS, s.port) for s in cluster.servers)
    checks = check_job_hosts(ranks, program, own_gpus=visible is not None)
    for check in checks:
        print(check.line(), flush=True)
    bad = sum(not c.ok for c in checks)
    print(f"{len(checks) - bad} of {len(checks)} hosts ready", flush=True)
    return 0 if not bad else 1
