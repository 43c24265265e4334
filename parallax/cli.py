"""Command line: ``parallax-run`` and ``parallax {run,plan}``.

``parallax-run`` (= ``parallax run``) runs a training script on the devices of
a resource file:

    parallax-run --resource_info resource_info train.py --steps 1000
    parallax-run --resource_info resource_info -m mypackage.train
    parallax-run --resource_info resource_info --mpirun_options "--mca btl_tcp_if_include eth0" train.py

The script calls ``parallax.parallel_run(graph, <a resource file>, parallax_config=...)``
as usual. ``parallax-run`` starts it with this Python, and its ``parallel_run``
uses the resource file given here (instead of the one the script names), adds
the ``--mpirun_options`` to ``MPIConfig.mpirun_options``, and launches the
processes its run option needs (one per device for MPI, workers and servers
for PS and HYBRID) through ``mpirun``, exactly as when the script is run with
plain ``python``. ``--dry_run`` prints the ``mpirun`` command instead.

``parallax plan`` prints the plan a training script would use, without training:

    parallax plan train.py resource_info [--run_option AUTO] [--override emb=ps] [-- script args]

The script runs up to its ``parallel_run`` call, which prints the plan (and
writes it as JSON with ``--json``) and ends the script. The resource file and
run option given here replace the script's own.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import tempfile

from parallax.config import OVERRIDE_SYNC
from parallax.errors import ParallaxError
from parallax.invocation import TF_CONFIG_ENV, PlanRequest, current, env_with
from parallax.managers.mpijob import MPIJOB
from parallax.resources import from_environment, parse_resource_file
from parallax.slurm import SLURM

__all__ = ["main", "parallax_main", "plan_main", "manifest_main", "probe_main", "tune_main"]


def _seconds_arg(text: str) -> float:
    """An argparse type: a number of seconds > 0 (``--timeout``, ``--time_budget``, ...)."""
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a number of seconds > 0, got {text!r}")
    return value


def _whole_arg(text: str) -> int:
    """An argparse type: a whole number >= 0 (``--max-restarts``)."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {text!r}")
    return value


def _count_arg(text: str) -> int:
    """An argparse type: a whole number >= 1 (``--trials``, ``--pipeline_stages``, ...)."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 1, got {text!r}")
    return value


def _port_arg(text: str) -> int:
    """An argparse type: a TCP port, 1-65535."""
    try:
        value = int(text)
    except ValueError:
        value = 0
    if not 0 < value < 65536:
        raise argparse.ArgumentTypeError(f"expected a port 1-65535, got {text!r}")
    return value


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


def _shutdown_arg(text: str) -> str:
    """``--stall-shutdown``: seconds (a positive number) or ``none``."""
    if text.strip().lower() == "none":
        return "none"
    try:
        seconds = float(text)
    except ValueError:
        seconds = -1.0
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"expected seconds (a positive number) or 'none', got {text!r}")
    return repr(seconds)


def _elastic_options(args: argparse.Namespace) -> str | None:
    """The elastic options given, as :data:`~parallax.invocation.ELASTIC_ENV`'s JSON (``None``: none)."""
    given = {name: getattr(args, name) for name in ("max_restarts", "min_workers", "max_workers",
                                                    "host_discovery_script") if getattr(args, name) is not None}
    return json.dumps(given, sort_keys=True) if given else None


def _run_forwarding_sigterm(argv: list[str], env: dict) -> int:
    """Run the program; a SIGTERM this process gets (a manager ending the job) goes to it, which ends its job
    as a SIGTERM to the launcher does."""
    proc = subprocess.Popen(argv, env=env)
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: proc.send_signal(signum))
    try:
        while True:
            try:
                return proc.wait()
            except KeyboardInterrupt:  # the program ends its job (it may have had the terminal's Ctrl-C too)
                with contextlib.suppress(ProcessLookupError):
                    proc.send_signal(signal.SIGINT)
    finally:
        signal.signal(signal.SIGTERM, previous)


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

    try:
        cluster = parse_resource_file(resource_info)
    except (ParallaxError, OSError) as e:
        print(f"parallax-run: {e}", file=sys.stderr)
        return 2
    here, visible = len(gpu_names()), os.environ.get(GPUS_ENV)  # what TensorFlow would count here
    cluster = cluster.with_bare_hosts(here if visible is None else min(here, len([g for g in visible.split(",")
                                                                                   if g.strip()])))
    ranks = tuple(RankSpec(w.host, w.devices, w.line, "worker", w.port) for w in cluster.workers) + \
        tuple(RankSpec(s.host, None, s.line, "ps", s.port) for s in cluster.servers)
    checks = check_job_hosts(ranks, program)
    for check in checks:
        print(check.line(), flush=True)
    bad = sum(not c.ok for c in checks)
    print(f"{len(checks) - bad} of {len(checks)} hosts ready", flush=True)
    return 0 if not bad else 1


def _run_to_parallel_run(argv: list[str], env: dict, output: str, timeout: float, command: str, what: str) -> int:
    """Run a script whose ``parallel_run`` writes ``output`` and exits (a plan, a dry run); its exit code,
    or 1 with a message when it times out or never reaches ``parallel_run``."""
    try:
        proc = subprocess.run(argv, env=env, timeout=timeout)
    except subprocess.TimeoutExpired:
        print(f"{command}: {what} did not reach parallel_run in {timeout:.0f} s", file=sys.stderr)
        return 1
    if proc.returncode != 0:
        return proc.returncode
    if not os.path.exists(output):
        print(f"{command}: {what} ended without calling parallax.parallel_run", file=sys.stderr)
        return 1
    return 0


def _plan_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parallax plan", description="Print the plan (what goes where, estimated bytes per worker and step) "
        "that a training script's parallel_run would use, without training.")
    parser.add_argument("script", help="the training script (it must call parallax.parallel_run)")
    parser.add_argument("resource_info", help="the resource file to plan for (replaces the script's)")
    parser.add_argument("--run_option", choices=["PS", "MPI", "HYBRID", "AUTO"], type=str.upper, default=None,
                        help="plan for this run option instead of the script's")
    parser.add_argument("--override", action="append", default=[], metavar="VARIABLE=SYNC",
                        help="a per-variable choice (allreduce, allgather or ps; or stage:N, the pipeline stage "
                             "that holds it), as Config.plan_overrides; repeatable")
    layout = parser.add_argument_group("beyond data parallelism", "replace the script's Config fields of the same "
                                       "names (docs/modes.md)")
    layout.add_argument("--zero_stage", type=int, choices=[0, 1, 2], default=None)
    layout.add_argument("--pipeline_stages", type=_count_arg, default=None, metavar="K")
    layout.add_argument("--micro_batches", type=_count_arg, default=None, metavar="M")
    layout.add_argument("--pipeline_cuts", default=None, metavar="SCOPE,SCOPE",
                        help="the scopes where stages 1 .. k-1 begin, comma-separated")
    layout.add_argument("--pipeline_schedule", choices=["gpipe", "1f1b"], default=None)
    layout.add_argument("--device_memory", default=None, metavar="BYTES", help="e.g. 16GB")
    parser.add_argument("--json", default=None, metavar="FILE", help="also write the plan as JSON")
    parser.add_argument("--timeout", type=_seconds_arg, default=600, help="seconds before giving up on the script")
    predict = parser.add_argument_group(
        "prediction", "--predict also prints the predicted step time, speedup and scaling efficiency of each "
        "layout (MPI, PS, HYBRID, TensorFlow's own PS) on a cluster (parallax/plan/predict.py)")
    predict.add_argument("--predict", action="store_true", help="predict the speed of each layout")
    predict.add_argument("--step_time", default=None, metavar="SECONDS",
                         help="the measured time of one training step on one device (required with --predict), "
                              "e.g. 0.175 or 175ms")
    predict.add_argument("--cluster", default=None, metavar="HOSTSxDEVICES",
                         help="the cluster to predict for, e.g. 6x8 (default: the resource file's hosts and "
                              "devices per host)")
    predict.add_argument("--bandwidth", default="10Gbit", help="between hosts, per direction (default 10Gbit)")
    predict.add_argument("--latency", default="20us", help="between hosts (default 20us)")
    predict.add_argument("--inside_bandwidth", default="100Gbit",
                         help="between the devices of a host (default 100Gbit, about PCIe 3.0 x16)")
    predict.add_argument("--inside_latency", default="5us", help="between the devices of a host (default 5us)")
    predict.add_argument("--step_spread", default="0", metavar="SECONDS",
                         help="the standard deviation of one device's step time (default 0): adds the wait for the "
                              "slowest of the cluster's devices each step")
    predict.add_argument("--measured", default=None, metavar="FILE",
                         help="steps measured on small clusters, per layout (YAML, e.g. 'MPI: {1x2: 2.1ms, 2x2: "
                              "3.4ms}'): each layout's host costs are fitted to them and the prediction becomes a "
                              "forecast (docs/modes.md)")
    predict.add_argument("--probe", action="store_true",
                         help="measure the link instead (parallax probe): between the resource file's first two "
                              "hosts, or inside its host when it has one")
    parser.epilog = "Arguments for the script go after --, e.g. parallax plan train.py res -- --steps 10"
    return parser


def _prediction_inputs(args: argparse.Namespace) -> tuple[float, tuple[int, int] | None, object, object, dict, float]:
    """``--predict``'s step time, cluster shape (or ``None``: the resource file's), links,
    measured steps (``--measured``: per layout, per cluster shape) and the step's spread.

    Raises:
        ValueError: naming the argument and what was expected.
    """
    from parallax.plan.predict import Link, parse_bandwidth, parse_cluster, parse_latency, parse_measured

    if args.step_time is None:
        raise ValueError("--predict needs --step_time: the measured seconds of one training step on one device")
    step = _seconds("--step_time", args.step_time)
    if not step > 0:
        raise ValueError(f"--step_time {args.step_time!r} must be positive")
    spread = _seconds("--step_spread", args.step_spread)
    if spread < 0:
        raise ValueError(f"--step_spread {args.step_spread!r} must not be negative")
    shape = parse_cluster(args.cluster) if args.cluster else None
    between = Link(parse_bandwidth(args.bandwidth), parse_latency(args.latency))
    inside = Link(parse_bandwidth(args.inside_bandwidth), parse_latency(args.inside_latency))
    measured: dict = {}
    if args.measured:
        try:
            with open(args.measured, encoding="utf-8") as f:
                measured = parse_measured(f.read(), args.measured)
        except OSError as e:
            raise ValueError(f"--measured {args.measured!r}: {e.strerror}") from None
    return step, shape, between, inside, measured, spread


def _seconds(option: str, text: str) -> float:
    """``0.175`` or ``175ms`` -> seconds, or a ValueError naming ``option``."""
    from parallax.plan.predict import parse_latency

    clean = text.strip().lower()
    try:
        return parse_latency(clean) if clean.endswith(("ms", "us", "s")) else float(clean)
    except ValueError:
        raise ValueError(f"{option} {text!r}: expected seconds, e.g. 0.175 or 175ms") from None


def _print_prediction(plan_json: str, step: float, shape, between, inside, measured: dict, spread: float) -> None:
    import json

    from parallax.plan.predict import (
        ClusterShape,
        cluster_of_plan,
        fit_costs,
        format_costs,
        format_predictions,
        predict,
        variables_of_plan,
    )

    with open(plan_json, encoding="utf-8") as f:
        plan = json.load(f)
    variables = variables_of_plan(plan)
    hosts, devices = shape or cluster_of_plan(plan)  # default: the planned job's hosts
    target = ClusterShape(hosts, devices, between, inside)
    costs = {layout: fit_costs(variables, step, {ClusterShape(h, g, between, inside): t for (h, g), t in steps.items()},
                               layout, spread) for layout, steps in measured.items()}
    if costs:
        print("host costs fitted to the measured steps (--measured):\n" + format_costs(costs), flush=True)
    print(format_predictions(predict(variables, step, target, costs=costs, spread=spread), target, step), flush=True)


def plan_main(argv: list[str] | None = None) -> int:
    """Entry point of ``parallax plan``; returns an exit code."""

    mine, script_args, separated = _split_command(argv)
    args = _parse_own(_plan_parser(), mine, separated, "The script's arguments go")
    for path, what in ((args.script, "script"), (args.resource_info, "resource file")):
        if not os.path.exists(path):
            print(f"parallax plan: {what} {path!r} not found", file=sys.stderr)
            return 2
    overrides: dict = {}
    for item in args.override:
        name, sep, sync = item.partition("=")
        stage = sync[len("stage:"):] if sync.startswith("stage:") else None
        if not sep or not name or (sync not in OVERRIDE_SYNC and not (stage or "").isdigit()):
            print(f"parallax plan: --override {item!r}: expected VARIABLE=SYNC with SYNC one of "
                  f"{', '.join(OVERRIDE_SYNC)}, or VARIABLE=stage:N", file=sys.stderr)
            return 2
        entry = {"stage": int(stage)} if stage is not None else {"sync": sync}
        overrides[name] = {**overrides.get(name, {}), **entry}
    fields = {key: getattr(args, key) for key in ("zero_stage", "pipeline_stages", "micro_batches", "device_memory",
                                                   "pipeline_schedule") if getattr(args, key) is not None}
    if args.pipeline_cuts:
        fields["pipeline_cuts"] = args.pipeline_cuts.split(",")
    prediction = None
    if args.predict:
        try:
            prediction = _prediction_inputs(args)
        except ValueError as e:
            print(f"parallax plan: {e}", file=sys.stderr)
            return 2
    with tempfile.TemporaryDirectory() as tmp:
        output = args.json or os.path.join(tmp, "plan.json")
        if os.path.exists(output):
            os.remove(output)
        env = env_with(plan=PlanRequest(os.path.abspath(args.resource_info), args.run_option, overrides, fields,
                                        output=os.path.abspath(output)))
        code = _run_to_parallel_run([sys.executable, os.path.abspath(args.script), *script_args], env, output,
                                    args.timeout, "parallax plan", args.script)
        if code == 0 and prediction is not None:
            if args.probe:
                try:
                    prediction = _probed(prediction, args.resource_info, args.timeout)
                except (ParallaxError, OSError) as e:
                    print(f"parallax plan: {e}", file=sys.stderr)
                    return 1
            _print_prediction(output, *prediction)
        return code


def _probed(prediction: tuple, resource_info: str, timeout: float) -> tuple:
    """``prediction`` with the link that ``parallax probe`` measures on ``resource_info``'s hosts."""
    from parallax.launch.launcher import find_mpirun
    from parallax.launch.probe import probe
    from parallax.plan.predict import Link

    hosts = parse_resource_file(resource_info).hosts
    pair = (hosts[0], hosts[1] if len(hosts) > 1 else hosts[0])
    link = probe(pair, find_mpirun(), mpirun_options=current().mpirun_options or "", timeout=timeout)
    step, shape, between, inside, *rest = prediction
    measured = Link(link.bandwidth, link.latency)
    print(f"probed {_link_text(link)}", flush=True)
    return (step, shape, measured, inside, *rest) if pair[0] != pair[1] else (step, shape, between, measured, *rest)


def _link_text(link) -> str:
    where = f"between {link.hosts[0]} and {link.hosts[1]}" if link.hosts[0] != link.hosts[1] else \
        f"inside {link.hosts[0]}"
    return (f"{where}: {link.bandwidth * 8 / 1e9:.3g} Gbit/s per direction, {link.latency * 1e6:.3g} us latency "
            f"({link.options()})")


def probe_main(argv: list[str] | None = None) -> int:
    """Entry point of ``parallax probe``; returns an exit code."""
    from parallax.launch.launcher import find_mpirun
    from parallax.launch.probe import probe

    parser = argparse.ArgumentParser(
        prog="parallax probe", description="Measure the bandwidth and latency between two hosts of a resource "
        "file over MPI, started as a job's ranks are (mpirun, ssh): what parallax plan --predict takes.")
    parser.add_argument("resource_info", help="a resource file (or slurm, mpijob)")
    parser.add_argument("--hosts", default=None, metavar="A,B",
                        help="the two hosts (default: the file's first two; one host: two processes on it)")
    parser.add_argument("--mpirun_options", default=current().mpirun_options or "",
                        help="extra mpirun options, as MPIConfig.mpirun_options")
    parser.add_argument("--timeout", type=_seconds_arg, default=120, help="seconds before giving up (default 120)")
    args = parser.parse_args(argv)
    try:
        hosts = parse_resource_file(args.resource_info).hosts
        if args.hosts:
            pair = tuple(h.strip() for h in args.hosts.split(","))
            if len(pair) != 2 or not all(pair) or any(h not in hosts for h in pair):
                parser.error(f"--hosts {args.hosts!r}: expected two of the resource file's hosts "
                             f"({', '.join(hosts)}), e.g. --hosts {hosts[0]},{hosts[-1]}")
        else:
            pair = (hosts[0], hosts[1] if len(hosts) > 1 else hosts[0])
        link = probe(pair, find_mpirun(), mpirun_options=args.mpirun_options, timeout=args.timeout)
    except (ParallaxError, OSError) as e:
        print(f"parallax probe: {e}", file=sys.stderr)
        return 1
    print(_link_text(link), flush=True)
    return 0


def _split_command(argv: list[str] | None) -> tuple[list[str], list[str], bool]:
    """``argv`` before ``--`` and after it, and whether there was a ``--``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" not in argv:
        return argv, [], False
    return argv[:argv.index("--")], argv[argv.index("--") + 1:], True


def _parse_own(parser: argparse.ArgumentParser, mine: list[str], separated: bool, after: str) -> argparse.Namespace:
    """``parser``'s arguments of ``mine``; what it does not know, given without ``--``, is refused saying
    what goes after ``--`` (``after``: "The script's arguments go"), with the command line that does it."""
    args, extra = parser.parse_known_args(mine)
    if extra and not separated:
        fixed = [*mine[:-len(extra)], "--", *extra] if mine[-len(extra):] == extra else [*mine, "--", "..."]
        parser.error(f"unrecognized arguments: {' '.join(extra)}. {after} after --, e.g. "
                     f"{parser.prog} {' '.join(fixed)}")
    if extra:
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def _manifest_parser() -> argparse.ArgumentParser:
    from parallax.manifests import KINDS

    parser = argparse.ArgumentParser(
        prog="parallax manifest", description="Write what you submit to a cluster manager for a training job: a "
        "Kubeflow TFJob or MPIJob, a polyaxonfile, an HTCondor submit file (with its node script and environment "
        "wrapper), or an sbatch script; made from the job plan the launcher would use, and validated with the "
        "manager's own schema or parser.",
        epilog="The command every process runs goes after --, e.g. parallax manifest --kind tfjob --image "
        "me/train:1 resource_info -- python train.py --steps 1000. It must be python SCRIPT or python -m MODULE: "
        "the script runs here up to its parallel_run to make the job plan.")
    parser.add_argument("--kind", required=True, choices=KINDS, type=str.lower, help="the manager")
    parser.add_argument("resource_info", metavar="RESOURCE_OR_SPEC",
                        help="a resource file or a role spec (Polyaxon's environment section)")
    parser.add_argument("--name", default="parallax-job", help="the job's name (default: parallax-job)")
    parser.add_argument("--image", help="the container image (tfjob, mpijob, polyaxon): Python, TensorFlow, "
                        "Parallax and the script")
    parser.add_argument("--output", "-o", default=".", metavar="DIR", help="where to write (default: here)")
    parser.add_argument("--run_option", choices=["PS", "MPI", "HYBRID", "AUTO"], type=str.upper, default=None,
                        help="the run option every process uses (PARALLAX_RUN_OPTION) instead of the script's")
    parser.add_argument("--workdir", help="the directory the command runs in")
    parser.add_argument("--env", action="append", default=[], metavar="NAME=VALUE",
                        help="an environment variable of every process; repeatable")
    parser.add_argument("--setup", action="append", default=[], metavar="SHELL_LINE",
                        help="condor, slurm: a line that prepares a node's environment, e.g. 'source "
                        "/shared/venv/bin/activate'; repeatable")
    parser.add_argument("--port", type=_port_arg, default=2222, help="tfjob, polyaxon: each task's server port")
    parser.add_argument("--time", help="slurm: the job's time limit (sbatch --time), e.g. 2:00:00")
    parser.add_argument("--no_validate", action="store_true", help="do not run the validators")
    parser.add_argument("--timeout", type=_seconds_arg, default=600, help="seconds before giving up on the script")
    return parser


_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9]{0,50}[a-z0-9])?$")


def manifest_main(argv: list[str] | None = None) -> int:
    """Entry point of ``parallax manifest``; returns an exit code."""
    import json

    from parallax.manifests.validate import validate

    mine, command, separated = _split_command(argv)
    parser = _manifest_parser()
    args = _parse_own(parser, mine, separated, "The command every process runs (python SCRIPT ... or python -m "
                                               "MODULE ...) goes")
    if not command:
        parser.error("give the command every process runs after --, e.g. -- python train.py --steps 1000")
    if not os.path.basename(command[0]).startswith("python") or len(command) < 2:
        parser.error(f"the command {' '.join(command)!r} must be python SCRIPT ... or python -m MODULE ...: the "
                     "script runs here up to its parallel_run to make the job plan")
    if command[1] != "-m" and not os.path.exists(command[1]):
        parser.error(f"script {command[1]!r} not found (it runs here up to parallel_run)")
    if not os.path.exists(args.resource_info):
        parser.error(f"resource file {args.resource_info!r} not found")
    if not _K8S_NAME.match(args.name):
        parser.error(f"--name {args.name!r}: expected lower-case letters, digits and '-' (a Kubernetes name), "
                     "starting and ending with a letter or digit, at most 52 characters")
    env = []
    for item in args.env:
        name, sep, value = item.partition("=")
        if not sep or not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", name):
            parser.error(f"--env {item!r}: expected NAME=VALUE")
        env.append([name, value])
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.json")
        manifest = {"kind": args.kind, "command": command, "name": args.name, "image": args.image,
                    "workdir": args.workdir, "env": env, "run_option": args.run_option, "port": args.port,
                    "time": args.time, "python_env": args.setup, "directory": os.path.abspath(args.output),
                    "report": report}
        # the pods of a TFJob or Polyaxon job decide as tasks started from TF_CONFIG do
        env_vars = env_with(plan=PlanRequest(os.path.abspath(args.resource_info), args.run_option, manifest=manifest,
                                             manager=TF_CONFIG_ENV if args.kind in ("tfjob", "polyaxon") else None))
        code = _run_to_parallel_run([sys.executable, *command[1:]], env_vars, report, args.timeout,
                                    "parallax manifest", command[1])
        if code != 0:
            return code
        with open(report, encoding="utf-8") as f:
            written = json.load(f)
    for path in written["paths"]:
        print(f"parallax manifest: wrote {path}")
    bad = 0
    if not args.no_validate:
        for check in validate(args.kind, written["files"]):
            state = "not validated" if check.missing else "valid" if check.ok else "INVALID"
            print(f"  {state}: {check.by}")
            for problem in check.problems:
                print(f"    {problem}")
            bad += bool(check.problems)
    for note in written["notes"]:
        print(f"  {note}")
    return 1 if bad else 0


def _tune_parser() -> argparse.ArgumentParser:
    from parallax.tuning.candidates import SPACE_KEYS

    parser = argparse.ArgumentParser(
        prog="parallax tune", description="Find the fastest layout of a training script on a resource file: short "
        "trials of the layouts the plan's cost model ranks best (run option, partitions, fusion, local aggregation, "
        "replicated variables, backend, ZeRO, pipeline), on local processes or Dask; prints a table, writes a plot, "
        "and stores the fastest for the script's next parallel_run.",
        epilog="Arguments for the script go after --, e.g. parallax tune train.py res -- --steps 100. The script "
        "must run at least warm-up + timed steps (--steps).")
    parser.add_argument("script", help="the training script (it must call parallax.parallel_run)")
    parser.add_argument("resource_info", help="the resource file to tune for (replaces the script's)")
    parser.add_argument("--trials", type=_count_arg, default=8, help="at most this many trials (default 8)")
    parser.add_argument("--time_budget", type=_seconds_arg, default=None, metavar="SECONDS",
                        help="start no trial after this many seconds")
    parser.add_argument("--backend", choices=["local", "dask"], default="local",
                        help="local processes (default) or Dask")
    parser.add_argument("--scheduler", default=None, metavar="ADDRESS",
                        help="a running Dask scheduler (tcp://host:8786); default: an embedded LocalCluster")
    parser.add_argument("--space", action="append", default=[], metavar="KEY=V1,V2",
                        help=f"the values a choice may take, repeatable; keys: {', '.join(SPACE_KEYS)}")
    parser.add_argument("--steps", default="3,20", metavar="WARMUP,TIMED",
                        help="steps each trial discards and times (default 3,20: short steps vary by tens of per cent "
                             "on a busy machine; the median of 20 is steadier)")
    parser.add_argument("--time_limit", type=_seconds_arg, default=300, help="seconds one trial may run (default 300)")
    parser.add_argument("--output", "-o", default="parallax_tune", metavar="DIR",
                        help="where the table, plot, JSON, CSV and trial logs go (default ./parallax_tune)")
    parser.add_argument("--no_store", action="store_true", help="do not keep the fastest for the next run")
    parser.add_argument("--no_progress", action="store_true", help="no live progress line")
    parser.add_argument("--timeout", type=_seconds_arg, default=600, help="seconds the script may take to plan")
    return parser


def _space_value(key: str, text: str):
    low = text.strip().lower()
    if low in ("true", "false"):
        return low == "true"
    if low in ("none", "default"):
        return None
    try:
        return int(text)
    except ValueError:
        return text.strip().upper() if key == "run_option" else low


def parse_space(items: list[str]) -> dict[str, list]:
    """``--space KEY=V1,V2`` items as a space; ValueError naming a bad one."""
    from parallax.tuning.candidates import SPACE_KEYS

    space: dict[str, list] = {}
    for item in items:
        key, sep, values = item.partition("=")
        if not sep or key not in SPACE_KEYS or not values:
            raise ValueError(f"--space {item!r}: expected KEY=V1,V2 with KEY one of {', '.join(SPACE_KEYS)}")
        space[key] = [_space_value(key, v) for v in values.split(",")]
    return space


def tune_main(argv: list[str] | None = None) -> int:
    """Entry point of ``parallax tune``; returns an exit code."""
    from parallax.tuning.tuner import TuneError, tune

    mine, script_args, separated = _split_command(argv)
    parser = _tune_parser()
    args = _parse_own(parser, mine, separated, "The script's arguments go")
    try:
        space = parse_space(args.space)
        warmup, steps = (int(x) for x in args.steps.split(","))
    except ValueError as e:
        parser.error(str(e) if "--space" in str(e) else f"--steps {args.steps!r}: expected WARMUP,TIMED, e.g. 2,5")
    try:
        report = tune(args.script, args.resource_info, script_args, trials=args.trials, time_budget=args.time_budget,
                      backend=args.backend, scheduler=args.scheduler, space=space, warmup=warmup, steps=steps,
                      time_limit=args.time_limit, output=args.output, store=not args.no_store,
                      progress=not args.no_progress, plan_timeout=args.timeout)
    except (TuneError, FileNotFoundError, ValueError, OSError) as e:
        print(str(e) if str(e).startswith("parallax tune") else f"parallax tune: {e}", file=sys.stderr)
        return 1
    print(report.table())
    print(report.summary())
    if report.plot:
        print(f"plot: {report.plot}; results: {os.path.join(report.directory, 'results.json')} (and .csv)")
    if report.stored:
        print(f"stored for the next parallel_run of this graph on {args.resource_info}: {report.stored}")
    return 0


def parallax_main(argv: list[str] | None = None) -> int:
    """Entry point of ``parallax``: ``parallax run ...``, ``parallax plan ...`` or ``parallax manifest ...``."""
    argv = sys.argv[1:] if argv is None else argv
    commands = {"run": main, "plan": plan_main, "manifest": manifest_main, "probe": probe_main, "tune": tune_main}
    if not argv or argv[0] not in commands:
        print("usage: parallax {run,plan,tune,manifest,probe} ...\n  run       launch a training script on every "
              "device of a resource file\n  plan      print the plan a training script would use, without training"
              "\n  tune      find the fastest layout by short trials (local processes or Dask)"
              "\n  manifest  write a TFJob, MPIJob, polyaxonfile, HTCondor submit file or sbatch script for it"
              "\n  probe     measure the link between two hosts (for parallax plan --predict)",
              file=sys.stderr)
        return 0 if argv[:1] in (["-h"], ["--help"]) else 2
    return commands[argv[0]](argv[1:])


if __name__ == "__main__":
    sys.exit(main())
