"""The layout ``parallax tune`` found, kept for the next ``parallel_run`` of the same graph and resources.

It is stored in the cache directory (``$PARALLAX_CACHE_DIR``, ``tuned.json``)
under a hash of the graph (as the script builds it), the resource file and
``sync``. The process the user starts looks it up and applies it to the
script's Config, logging what it changed; the processes it launches get it
through :data:`TUNED_ENV` (they may be on hosts without the cache): ``parallel_run``
hands the choice to the launcher, which sets the variable in their environment.
``PARALLAX_USE_TUNED=0`` turns it off.
"""

from __future__ import annotations

import json
from typing import Any

from parallax.invocation import TUNED_ENV, Invocation
from parallax.tuning.search import cache_key, cache_path, store_entry

__all__ = ["TUNED_FILE", "tune_key", "store_tuned", "tuned_entry", "tuned_choice"]

TUNED_FILE = "tuned.json"


def tune_key(graph, resource_text: str, sync: bool) -> str:
    """The cache key of a tuned layout (the run option is part of what is tuned, so not of the key)."""
    return cache_key(graph, resource_text, "tune", sync)


def store_tuned(key: str, choice: dict[str, Any], facts: dict[str, Any], root: str) -> str:
    """Keep ``choice`` (and what the tune measured of it) for ``key`` in the cache ``root``; returns the file's
    path."""
    return store_entry(TUNED_FILE, key, {"choice": choice, **facts}, root)


def tuned_entry(key: str, root: str) -> dict[str, Any] | None:
    """What was stored for ``key`` in the cache ``root``, or ``None``."""
    try:
        with open(cache_path(TUNED_FILE, root), encoding="utf-8") as f:
            return json.load(f).get(key)
    except (OSError, ValueError):
        return None


def tuned_choice(graph, resource_text: str, sync: bool, launched: bool, invocation: Invocation
                 ) -> tuple[dict[str, Any] | None, str]:
    """The tuned choice this process applies, and where it comes from (``""`` when none).

    A launched process (or the script run again in the same process, ``launched=True`` too) takes
    its starter's (``invocation.tuned``, :data:`TUNED_ENV`); the process the user started looks in its cache
    for this graph: the choice is then the one the processes it launches take too (the caller hands it to
    the launcher). ``invocation.use_tuned`` off: none.
    """
    if not invocation.use_tuned:
        return None, ""
    if launched:
        sent = invocation.tuned
        return (dict(sent), TUNED_ENV) if sent is not None else (None, "")
    # this call's graph decides (a program may train several), for the processes it launches too
    key, root = tune_key(graph, resource_text, sync), invocation.cache_root()
    entry = tuned_entry(key, root)
    if not entry:
        return None, ""
    return dict(entry["choice"]), f"{cache_path(TUNED_FILE, root)} ({key[:12]})"
