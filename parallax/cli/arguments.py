"""What the commands' arguments share: the argparse types of their numbers (seconds, counts, ports), and the
split of a command line at ``--`` into the command's own arguments and the script's."""

from __future__ import annotations

import argparse
import sys


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
