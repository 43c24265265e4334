"""``parallax``: the command that hands its arguments to one of its subcommands (run, plan, tune, manifest,
probe), or lists them."""

from __future__ import annotations

import sys

from parallax.cli.manifest import manifest_main
from parallax.cli.plan import plan_main
from parallax.cli.probe import probe_main
from parallax.cli.run import main
from parallax.cli.tune import tune_main


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
