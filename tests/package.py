"""The package's own source, for tests that check a rule over every module (who reads the control variables,
who asks ``logging`` for a logger)."""

from __future__ import annotations

import os
from collections.abc import Iterator

#: The ``parallax`` package directory of this checkout.
PACKAGE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "parallax")


def package_modules(*but: str) -> Iterator[str]:
    """The path of every module of the package, in a stable order, except those named in ``but`` (paths
    relative to the package, e.g. ``"logs.py"``)."""
    skipped = {os.path.join(PACKAGE, name) for name in but}
    for root, _, files in sorted(os.walk(PACKAGE)):
        for name in sorted(files):
            path = os.path.join(root, name)
            if name.endswith(".py") and path not in skipped:
                yield path
