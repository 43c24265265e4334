"""Parallax's logger, ``parallax.log``: ``logging.getLogger("PARALLAX")``, as in the original Parallax.

Every module of the package logs through it. The plan table and start-up
facts go out at INFO, problems at WARNING. Show the INFO lines with::

    import logging, parallax
    logging.basicConfig(level=logging.WARNING)
    parallax.log.setLevel(logging.INFO)
"""

from __future__ import annotations

import logging

__all__ = ["log", "LOGGER_NAME"]

LOGGER_NAME = "PARALLAX"
log = logging.getLogger(LOGGER_NAME)
