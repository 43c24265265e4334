"""What the launcher passes on of its ranks' output: their lines, less control bytes and TensorFlow's start-up
notices.

Every rank imports TensorFlow, whose C++ runtime prints the same notices at start-up (oneDNN's, absl's
"before InitializeLog", the CPU features it was built for, the gRPC server it started): 16 lines a rank
around Parallax's three. Unless the user set ``TF_CPP_MIN_LOG_LEVEL`` (theirs wins: ``0`` shows everything),
the launcher drops those notices (:func:`noise`) and starts the ranks with ``TF_CPP_MIN_LOG_LEVEL=1``
(:data:`QUIET_LEVEL`: TensorFlow's INFO lines off, its warnings and errors kept). Control bytes (Open MPI's
help blocks end with a NUL) are never passed on, so the log stays text (:func:`printable`).
"""

from __future__ import annotations

import re

__all__ = ["QUIET_LEVEL", "LEVEL_ENV", "noise", "printable", "cleaned"]

LEVEL_ENV = "TF_CPP_MIN_LOG_LEVEL"
#: the ranks' ``TF_CPP_MIN_LOG_LEVEL`` where the user set none
QUIET_LEVEL = "1"

_NOISE = re.compile(
    r"^(WARNING: All log messages before absl::InitializeLog\(\) is called are written to STDERR"
    r"|I\d{4} [\d:. ]+\d+ [\w.]+\.cc:\d+\] .*"  # a C++ INFO line (oneDNN's notice, the CPU features, servers)
    r"|To enable the following instructions: .*|rebuild TensorFlow with the appropriate compiler flags\.)\s*$")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def noise(line: str) -> bool:
    """Whether ``line`` is one of TensorFlow's start-up notices.

    >>> noise("I0000 00:00:1796162731.225403   23526 port.cc:153] oneDNN custom operations are on.\\n")
    True
    >>> noise("Parallax: run_option MPI, 2 workers\\n")
    False
    """
    return bool(_NOISE.match(line))


def printable(line: str) -> str:
    """``line`` without control bytes (tabs and the line's end kept).

    >>> printable("\\x00Parallax elastic: attempt 1 failed\\n")
    'Parallax elastic: attempt 1 failed\\n'
    """
    return _CONTROL.sub("", line.replace("\r\n", "\n"))


def cleaned(line: str, quiet: bool) -> str | None:
    """What the launcher passes on of ``line``: ``None`` for a start-up notice when ``quiet``."""
    if quiet and noise(line):
        return None
    return printable(line)


def main() -> None:
    """``python -m parallax.launch.output``: pass standard input on as the launcher passes its ranks' output
    (``make demo`` shows its own process's lines so)."""
    import os
    import sys

    quiet = LEVEL_ENV not in os.environ
    for line in sys.stdin:
        kept = cleaned(line, quiet)
        if kept is not None:
            sys.stdout.write(kept)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
