"""What a test needs from the machine (a validator, Slurm, root, namespaces), and what happens without it.

Where something is missing a test cannot tell anything, so it must not pass. Under CI (``CI=true``, as
``.ci/run`` is run) the test fails, naming what is missing and the make target that installs it: CI
exists to run these tests. Elsewhere (a developer's machine without Slurm, a user without root) it skips
with the same words.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import NoReturn

import pytest

__all__ = ["in_ci", "unavailable"]


def in_ci(environ: Mapping[str, str] | None = None) -> bool:
    """Whether these tests run under CI: ``CI`` set to anything but empty, ``0``, ``false`` or ``no``
    (GitHub Actions, GitLab and ``.ci/run`` set ``CI=true``)."""
    value = (os.environ if environ is None else environ).get("CI", "")
    return value.strip().lower() not in ("", "0", "false", "no")


def unavailable(reason: str, remedy: str, environ: Mapping[str, str] | None = None) -> NoReturn:
    """End the calling test (or fixture), which cannot run here.

    Args:
        reason: what is missing, e.g. ``"a virtual cluster needs root (network, UTS and mount namespaces)"``.
        remedy: what provides it, e.g. ``"run `make test-cluster` as root"``.
        environ: the environment to read ``CI`` from (default: this process's).

    Raises:
        pytest.fail.Exception: under CI.
        pytest.skip.Exception: elsewhere.
    """
    message = f"{reason}; {remedy}"
    if in_ci(environ):
        pytest.fail(f"CI=true, so this test must run here, but {message}", pytrace=False)
    pytest.skip(message)
