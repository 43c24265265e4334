"""Weights a callback changes in the model while ``parallax.fit`` trains: refused, never lost silently.

``parallax.fit`` trains the job's own copies of the model's variables, made from the model when the job starts,
and writes the trained values back into the model at each epoch's end (for the callbacks and the validation).
A callback that sets weights itself (``model.set_weights`` in ``on_train_begin``, ``on_epoch_end`` or
``on_epoch_begin``, as weight averaging or a restore does) would change the model and not the job, which trains
on from its own copies: ``model.fit`` on one device would train from the changed weights. :class:`HostEdits`
keeps a digest of the model's weights where the model and the job agree, and :meth:`HostEdits.check` compares
before the job trains again. The cost is one pass over the weights' bytes at each check (``zlib.crc32``).
"""

from __future__ import annotations

import zlib
from typing import Any

import numpy as np

__all__ = ["HostEdits", "metric_state"]


def metric_state(model: Any) -> list:
    """The variables of ``model``'s metrics (totals, counts): the host's own, which ``parallax.fit`` resets and sums
    at each epoch (tf_keras also counts a metric the model holds among its weights)."""
    return [v for m in getattr(model, "metrics", ()) for v in m.variables]


def _digest(weights: list) -> list[int]:
    return [zlib.crc32(np.ascontiguousarray(w.numpy()).view(np.uint8).reshape(-1)) for w in weights]


class HostEdits:
    """The model's weights as the job holds them (:meth:`agree`), checked before the job trains again."""

    def __init__(self, model: Any) -> None:
        self._model = model
        self._digest: list[int] = []
        self.agree()

    def agree(self) -> None:
        """The model's weights are the job's now (the job just started from them, or wrote them back)."""
        self._digest = _digest(self._weights())

    def check(self, where: str) -> None:
        """Refuse weights a callback changed since the model and the job last agreed.

        Raises:
            ValueError: a weight changed; names the first ones and ``where`` (the callbacks that ran).
        """
        weights = self._weights()
        now = _digest(weights)
        changed = [w.path if hasattr(w, "path") else w.name for w, a, b in zip(weights, self._digest, now) if a != b]
        if changed:
            shown = ", ".join(changed[:3]) + (f" and {len(changed) - 3} more" if len(changed) > 3 else "")
            raise ValueError(f"parallax.fit: a callback changed the model's weights ({shown}) in {where}; the job "
                             "trains its own copies of them, made when parallax.fit started and written back into the "
                             "model at each epoch's end, and would not see the change (model.fit would train from the "
                             "changed weights): set weights before parallax.fit (and pass initial_epoch), or change "
                             "them after it")

    def _weights(self) -> list:
        """The model's weights but its metrics' state (:func:`metric_state`)."""
        state = {id(v) for v in metric_state(self._model)}
        return [w for w in self._model.weights if id(w) not in state]
