"""Variables the program changes while the job trains: refused or said at WARNING, never lost silently.

A step's job trains its own copies of the variables the step uses, made from the program's when the step was
traced, and writes the trained values back into the program's (``parallax.fit``: at each epoch's end, for the
callbacks and the validation; a loop: at ``step.close()``). What the program assigns to its variables meanwhile
(a callback's ``model.set_weights`` or a KL-annealing weight set ``on_epoch_begin``; a loop's
``optimizer.learning_rate.assign(...)`` between steps) would change its variables and not the job's, which
trains on from its own copies, where one device would train with the change.

:class:`HostWatch` keeps a digest of the variables where the program and the job agree and names those that
changed since; the step's own (:meth:`parallax.tf2.step.DistributedStep.sync_variables`) says at WARNING what
it is about to write over, and :class:`HostEdits` refuses what a callback of ``parallax.fit`` changed before the
job trains again. A metric's state (the host's own, summed over the workers) and a learning rate ``parallax.fit``
feeds each step are not watched. The cost is one pass over the variables' bytes at each check (``zlib.crc32``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = ["HostWatch", "HostEdits", "metric_state", "shown"]


def metric_state(model: Any) -> list:
    """The variables of ``model``'s metrics (totals, counts): the host's own, which ``parallax.fit`` resets and sums
    at each epoch (tf_keras also counts a metric the model holds among its weights)."""
    return [v for m in getattr(model, "metrics", ()) for v in m.variables]


def _digest(value: Any) -> int:
    return zlib.crc32(np.ascontiguousarray(np.asarray(value)).view(np.uint8).reshape(-1))


class HostWatch:
    """The program's variables as the job holds them.

    Args:
        reads: a function reading each watched variable's value now, by its name.
        start: the values the job started from, by name (those the step was traced with).
    """

    def __init__(self, reads: dict[str, Callable[[], Any]], start: dict[str, Any]) -> None:
        self._reads = dict(reads)
        self._digest = {name: _digest(start[name]) for name in self._reads}

    def ignore(self, names: set[str]) -> None:
        """Stop watching ``names`` (a variable the job is told of another way)."""
        for name in names:
            self._reads.pop(name, None)
            self._digest.pop(name, None)

    def agree(self) -> None:
        """The program's variables are the job's now (written back from it)."""
        self._digest = {name: _digest(read()) for name, read in self._reads.items()}

    def changed(self) -> list[str]:
        """The variables the program changed since it and the job last agreed, by name."""
        return [name for name, read in self._reads.items() if _digest(read()) != self._digest[name]]


class HostEdits:
    """What a callback of ``parallax.fit`` changes in the step's variables, checked before the job trains again.

    Args:
        watch: the step's :class:`HostWatch`.
    """

    def __init__(self, watch: HostWatch) -> None:
        self._watch = watch

    def agree(self) -> None:
        """The model's variables are the job's now (written back from it)."""
        self._watch.agree()

    def check(self, where: str) -> None:
        """Refuse variables a callback changed since the model and the job last agreed.

        Raises:
            ValueError: a variable changed; names the first ones and ``where`` (the callbacks that ran).
        """
        changed = self._watch.changed()
        if changed:
            raise ValueError(f"parallax.fit: a callback changed the model's weights or a variable the step uses "
                             f"({shown(changed)}) in {where}; the job trains its own copies of them, made when "
                             "parallax.fit started and written back into the model at each epoch's end, and would "
                             "not see the change (model.fit would train with it): set them before parallax.fit (and "
                             "pass initial_epoch), or change them after it")


def shown(names: list[str]) -> str:
    """The first three of ``names`` and how many more."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
