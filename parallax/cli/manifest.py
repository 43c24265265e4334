"""``parallax manifest``: its arguments, and the files a cluster manager takes for a training job, made from
the job plan the script's ``parallel_run`` would use and checked by the manager's validators."""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile

from parallax.cli.arguments import _parse_own, _port_arg, _seconds_arg, _split_command
from parallax.cli.script import _run_to_parallel_run
from parallax.invocation import TF_CONFIG_ENV, PlanRequest, env_with


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
