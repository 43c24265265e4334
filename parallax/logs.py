"""Parallax's logger, ``parallax.log``: ``logging.getLogger("PARALLAX")``, as in the original Parallax.

Every module of the package logs through it, as the original did: a handler
of its own on standard error, format ``LEVEL:thread:PARALLAX:message``, and
the level from ``PARALLAX_LOG_LEVEL`` (a number or a name) when set, else
WARNING (warnings and errors), whatever the root logger's level: a library
that lowers or raises the root logger (absl's verbosity does) neither hides
Parallax's warnings nor floods its INFO lines. The plan table and start-up facts go
out at INFO, problems at WARNING. Show the INFO lines with::

    parallax.log.setLevel(logging.INFO)      # or PARALLAX_LOG_LEVEL=INFO

Unlike the original, the logger does not also pass its records to the root
logger, so ``logging.basicConfig`` does not print them twice.
"""

from __future__ import annotations

import logging

from parallax.invocation import LEVEL_ENV, setting

__all__ = ["log", "LOGGER_NAME"]

LOGGER_NAME = "PARALLAX"


def _make() -> logging.Logger:
    logger = logging.getLogger(LOGGER_NAME)
    if not any(getattr(h, "_parallax", False) for h in logger.handlers):
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:%(thread)d:%(name)s:%(message)s"))
        handler._parallax = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False
    level = (setting("log_level") or "").strip()
    if logger.level == logging.NOTSET:
        logger.setLevel(logging.WARNING)
    if level:
        try:
            logger.setLevel(int(level) if level.lstrip("-").isdigit() else level.upper())
        except ValueError:
            logger.warning("%s=%r is not a logging level (a number, or DEBUG, INFO, WARNING, ERROR)", LEVEL_ENV,
                           level)
    return logger


log = _make()
