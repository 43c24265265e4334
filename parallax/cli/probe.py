"""``parallax probe``: the bandwidth and latency between two hosts of a resource file, and the line that
reports a measured link (which ``parallax plan --probe`` prints too)."""

from __future__ import annotations

import argparse
import sys

from parallax.cli.arguments import _seconds_arg
from parallax.errors import ParallaxError
from parallax.invocation import current
from parallax.resources.files import parse_resource_file


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
