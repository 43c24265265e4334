"""Variables the program changes while the job trains: carried into the job, or said at WARNING, never lost silently.

A step's job trains its own copies of the variables the step uses, made from the program's when the step was
traced, and writes the trained values back into the program's (``parallax.fit``: at each epoch's end, for the
callbacks and the validation; a loop: at ``step.close()``). What the program assigns to its variables meanwhile
(a callback's ``model.set_weights`` or a KL-annealing weight set ``on_epoch_begin``; a loop's
``optimizer.learning_rate.assign(...)`` between steps) changes its variables, not the job's; one device would
train with the change.

:class:`HostWatch` keeps a digest of the variables where the program and the job agree and names those that
changed since. What changed is written into the job before the next step (the traced step's own assignments,
:attr:`parallax.tf2.trace.TracedStep.host_writes`):

* ``parallax.fit``: :class:`HostEdits`, after ``on_train_begin`` and each ``on_epoch_begin`` (every variable the
  step uses), and, where a callback has batch hooks that may reach past itself, before each batch (the scalars that
  are not trained: the learning rate, a loss's weight); the workers agree on what changed and take worker 0's
  values;
* a loop: before each step, the scalars that are not trained (a learning rate, a loss's weight)
  (:class:`parallax.tf2.step.DistributedStep`).

What changed elsewhere (a loop's new weights between steps; a callback's within an epoch) the step's
:meth:`~parallax.tf2.step.DistributedStep.sync_variables` says at WARNING before it writes the job's values over
it; an optimizer's slot a callback changed is refused. A metric's state (the host's own, summed over the workers)
is not watched. The cost is one pass over the watched variables' bytes at each look (``zlib.crc32``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

from parallax.logs import log as logger
from parallax.tf2.digest import digest

__all__ = ["HostWatch", "HostEdits", "metric_state", "shown"]


def metric_state(model: Any) -> list:
    """The variables of ``model``'s metrics (totals, counts): the host's own, which ``parallax.fit`` resets and sums
    at each epoch (tf_keras also counts a metric the model holds among its weights)."""
    return [v for m in getattr(model, "metrics", ()) for v in m.variables]


def _digest(value: Any) -> int:
    return digest([value])


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

    def agree(self, names: Iterable[str] | None = None, values: dict[str, Any] | None = None) -> None:
        """The program's variables (or those of ``names``) are the job's now (written back from it, or into it);
        ``values``: what was just written into some of them, by name (not read again)."""
        values = values or {}
        for name in self._reads if names is None else [n for n in names if n in self._reads]:
            self._digest[name] = _digest(values[name] if name in values else self._reads[name]())

    def changed(self, names: Iterable[str] | None = None) -> list[str]:
        """The variables (of ``names``, where given) the program changed since it and the job last agreed."""
        chosen = self._reads if names is None else [n for n in names if n in self._reads]
        return [name for name in chosen if _digest(self._reads[name]()) != self._digest[name]]

    def read(self, name: str) -> np.ndarray:
        """The program's value of ``name`` now."""
        return np.asarray(self._reads[name]())


class HostEdits:
    """What the callbacks of ``parallax.fit`` set in the step's variables, carried into the job before it trains
    again.

    Every worker runs the callbacks (those that write no file), so each sets the same values; the workers agree on
    which variables changed, and every one writes worker 0's values into its program and the job
    (:meth:`parallax.tf2.step.DistributedStep.write_host`), as one device trains with what its callbacks set.

    Args:
        step: the job's step (:class:`parallax.tf2.step.DistributedStep`).
        group: the job's workers (:class:`parallax.comm.group.WorkerGroup`).
    """

    def __init__(self, step: Any, group: Any) -> None:
        self._step = step
        self._group = group
        self._told = False

    def agree(self) -> None:
        """The model's variables are the job's now (written back from it)."""
        self._step.host.agree()

    def carry(self, where: str, names: list[str] | None = None) -> None:
        """Write into the job what the callbacks of ``where`` changed in the step's variables (of ``names``, where
        given) since the model and the job last agreed (every worker calls it at the same points).

        Raises:
            ValueError: a changed variable cannot be written into the job (an optimizer's slot, one ``zero_stage``
                keeps in parts); names the first ones and ``where``.
        """
        watch = self._step.host
        changed = sorted({n for mine in self._group.gather(watch.changed(names)) for n in mine})
        if not changed:
            return
        refused = [n for n in changed if not self._step.can_write(n)]
        if refused:
            raise ValueError(f"parallax.fit: a callback changed {shown(refused)} in {where}, an optimizer's slot the "
                             "job keeps in its own copies (or in parts, with zero_stage) and cannot take from the "
                             "model (model.fit would train with the change): set it before parallax.fit (and pass "
                             "initial_epoch), or change it after it")
        chief = self._group.index == 0
        values = self._group.gather({n: watch.read(n) for n in changed} if chief else None)[0]
        differ = [n for n in changed if not np.array_equal(watch.read(n), values[n])]
        if differ and not self._told:
            self._told = True
            logger.warning("Parallax: the callbacks of worker %d set %s otherwise than worker 0's in %s; every "
                           "worker trains with worker 0's values (a callback that draws at random, or reads this "
                           "worker's own state, sets each worker's own)", self._group.index, shown(differ), where)
        self._step.write_host(values)


def shown(names: list[str]) -> str:
    """The first three of ``names`` and how many more."""
    return ", ".join(names[:3]) + (f" and {len(names) - 3} more" if len(names) > 3 else "")
