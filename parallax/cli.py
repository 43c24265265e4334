"""``parallax-run``: launch a training script on every device of a resource file.

    parallax-run --resource_info resource_info train.py --steps 1000
    parallax-run --resource_info resource_info -m mypackage.train

The script calls ``parallax.parallel_run(graph, <the same resource file>,
parallax_config=...)`` as usual; each launched process gets its own session.
``parallel_run`` launches by itself when the script is run with plain
``python``; this command is for users who prefer to launch explicitly (in a
batch script, with extra ``mpirun`` options).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from parallax.errors import ParallaxError
from parallax.launch.launcher import job_command, launch
from parallax.launch.layout import ranks_per_device
from parallax.resources import parse_resource_file

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parallax-run", description="Run a Parallax training script on every device of a resource file "
        "(one process per device, through mpirun).")
    parser.add_argument("--resource_info", "-r", required=True, help="the resource file")
    parser.add_argument("--mpirun_options", default="", help="extra mpirun options, e.g. '--mca btl ^openib'")
    parser.add_argument("--dry_run", action="store_true", help="print the mpirun command and exit")
    parser.add_argument("-m", dest="module", default=None, help="run a module (like python -m)")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="the script and its arguments")
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``parallax-run``; returns the job's exit code."""
    args = _parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.module:
        program = ["-m", args.module, *args.program]
    elif args.program:
        script = args.program[0]
        if not os.path.exists(script):
            print(f"parallax-run: script {script!r} not found", file=sys.stderr)
            return 2
        program = [os.path.abspath(script), *args.program[1:]]
    else:
        print("parallax-run: give the training script (or -m module) to run", file=sys.stderr)
        return 2
    try:
        ranks = ranks_per_device(parse_resource_file(args.resource_info))
        if args.dry_run:
            command, _ = job_command(ranks, "MPI", program, args.mpirun_options, "<job dir>")
            print(" ".join(command.argv))
            return 0
        result = launch(ranks, "MPI", program, args.mpirun_options)
    except ParallaxError as e:
        print(f"parallax-run: {e}", file=sys.stderr)
        return 2
    if result.failure is not None:
        print(f"\n{result.failure}", file=sys.stderr)
    return result.returncode


if __name__ == "__main__":
    sys.exit(main())
