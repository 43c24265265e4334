"""``parallax.fit`` of a model that overrides ``train_step`` (Keras's guide "Customizing what happens in
``fit()``": a custom loss or update, a GAN compiled with two optimizers): trained with the model's own step.

The step Parallax traces is ``model.train_step(data)``, ``data`` packed as ``model.fit`` packs it (``x``;
``(x, y)``; ``(x, y, sample_weight)``). Its metrics are the model's, updated inside the step, so in the graph:
each worker's copy counts its own replicas' examples. At an epoch's end (:class:`GraphMetrics`) each worker
reads its copy's states, takes what the epoch added (a metric's state is a sum: totals and counts, confusion
counts) and the workers' sums give the model's metrics the epoch's states, as one device's; the progress bar
shows what the step returned on this worker's first replica. With parameter servers (run_option PS) the
metrics' variables live on a server, and only the chief writes server variables (:mod:`parallax.rewrite.ps_sync`):
every worker then reads the same states, those of the chief's examples, which the logs show, said at WARNING.

A batch that does not split evenly over the replicas is refused: Parallax pads such a batch with examples of
weight 0 (:func:`parallax.tf2.fit.even_parts`), and a step of the program's own need not weigh them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from parallax.logs import log as logger

__all__ = ["overrides_train_step", "own_train_step", "GraphMetrics", "check_even"]


def overrides_train_step(model: Any, module: Any) -> bool:
    """Whether ``model``'s class overrides its Keras's ``Model.train_step``."""
    return type(model).train_step is not module.Model.train_step


def own_train_step(model: Any, signature: list, has_targets: bool, weighted: bool) -> Any:
    """The model's ``train_step`` as a ``tf.function`` of ``(x[, y][, sample_weight])``; it returns the step's
    logs (a dict of tensors)."""

    def step(*args):
        data = args[0] if len(args) == 1 else tuple(args)
        logs = model.train_step(data)
        return {k: v for k, v in logs.items() if isinstance(v, tf.Tensor)} if isinstance(logs, dict) else {}

    taken = [signature[0]] + ([signature[1]] if has_targets else []) + ([signature[2]] if weighted else [])
    return tf.function(step, input_signature=taken)


def check_even(examples: int, replicas: int) -> None:
    """Refuse a batch of ``examples`` that does not split into ``replicas`` equal parts.

    Raises:
        ValueError: naming the batch's size and the replicas, and what to change.
    """
    if examples % replicas:
        raise ValueError(f"parallax.fit: a batch of {examples} examples does not split into {replicas} equal parts, "
                         "and the model's own train_step need not weigh the padding Parallax would add: give a "
                         f"batch_size that {replicas} divides and drop the last short batch (a dataset's "
                         "batch(..., drop_remainder=True), or steps_per_epoch)")


class GraphMetrics:
    """The model's metrics kept in the step's graph, brought into the model at an epoch's end (see the module
    docstring).

    Args:
        model: the model, whose ``metrics`` the step updates.
    """

    def __init__(self, model: Any) -> None:
        self._model = model
        self._base: list[np.ndarray] | None = None
        self._warned = False

    def _variables(self) -> list:
        return [v for m in self._model.metrics for v in m.variables]

    def into_model(self, step: Any, group: Any) -> None:
        """The epoch's metric states into the model: this worker's graph states (synced with the weights), less
        what they held when the epoch began, summed over the workers."""
        step.sync_variables()
        variables = self._variables()
        now = [np.asarray(v.numpy()) for v in variables]
        base = self._base if self._base is not None else [np.zeros_like(a) for a in now]
        self._base = now
        epoch = [a - b for a, b in zip(now, base)]
        if epoch:
            mine = np.concatenate([a.astype(np.float64).reshape(-1) for a in epoch])
            every = group.gather(mine)
            if len(every) > 1 and all(np.array_equal(e, every[0]) for e in every[1:]):  # one copy, on a server
                flat = every[0]
                if not self._warned and group.index == 0:
                    logger.warning("Parallax: the metrics %s that the model's own train_step updates live on a "
                                   "parameter server, which only the chief writes: the logs are those of worker "
                                   "0's examples, not every worker's; run_option 'MPI' or 'HYBRID' keeps them on "
                                   "the workers", ", ".join(m.name for m in self._model.metrics))
                self._warned = True
            else:
                flat = np.sum(every, axis=0)
            at = 0
            for variable, part in zip(variables, epoch):
                variable.assign(flat[at:at + part.size].reshape(part.shape).astype(part.dtype))
                at += part.size
