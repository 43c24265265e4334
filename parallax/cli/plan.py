"""``parallax plan``: its arguments, the plan a training script's ``parallel_run`` would use, and with
``--predict`` the predicted speed of each layout on a cluster."""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

from parallax.cli.arguments import _count_arg, _parse_own, _seconds_arg, _split_command
from parallax.cli.probe import _link_text
from parallax.cli.script import _run_to_parallel_run
from parallax.config import OVERRIDE_SYNC
from parallax.errors import ParallaxError
from parallax.invocation import PlanRequest, current, env_with
from parallax.resources.files import parse_resource_file


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
