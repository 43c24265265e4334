"""``parallax tune``: its arguments (the ``--space`` of choices among them), and the short trials that find the
fastest layout of a training script."""

from __future__ import annotations

import argparse
import os
import sys

from parallax.cli.arguments import _count_arg, _parse_own, _seconds_arg, _split_command


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
    from parallax.invocation import current
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
                      progress=not args.no_progress, plan_timeout=args.timeout, cache_root=current().cache_root())
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
