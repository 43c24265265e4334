"""``parallax.fit`` of a model that overrides ``train_step`` (Keras's guide "Customizing what happens in
``fit()``": a custom loss or update, a GAN compiled with two optimizers): trained with the model's own step.

The step Parallax traces is ``model.train_step(data)``, ``data`` packed as ``model.fit`` packs it (``x``;
``(x, y)``; ``(x, y, sample_weight)``). Its metrics are the model's, updated inside the step; after every step what
the step added to them is summed over the workers into the model's metrics (:mod:`parallax.tf2.summed`: one
device's states, every example counted; with parameter servers, worker 0's examples, said at WARNING); the
progress bar shows the mean of what the step returned on this worker's replicas. An epoch's logs are made as
``model.fit`` makes them (:func:`epoch_logs`): the metrics' results where the step's logs name exactly the
model's metrics, else the last step's logs.

A batch that does not split evenly over the replicas is refused: Parallax pads such a batch with examples of
weight 0 (:func:`parallax.tf2.batch_parts.even_parts`), and a step of the program's own need not weigh them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf

from parallax.logs import log

__all__ = ["warn_own_fit", "warn_summed_trackers", "overrides", "own_train_step", "check_even", "epoch_logs"]


def overrides(model: Any, module: Any, method: str = "train_step") -> bool:
    """Whether ``model``'s class overrides its Keras's ``Model.<method>`` (``train_step``, ``test_step``, ``fit``)."""
    return getattr(type(model), method) is not getattr(module.Model, method)


def warn_own_fit(model: Any, module: Any) -> None:
    """Say at WARNING that ``model``'s class overrides ``fit``, which ``parallax.fit`` does not run (it trains on the
    batches Keras's own ``fit`` draws from the same arguments): a program comparing with its ``model.fit`` may see
    other batches."""
    if not overrides(model, module, "fit"):
        return
    owner = next(c for c in type(model).__mro__ if "fit" in vars(c))
    log.warning("parallax.fit: %s overrides model.fit (%s.%s.fit), which parallax.fit does not run: it trains on the "
                "batches Keras's own Model.fit draws from the same arguments. A model.fit that prepares the data "
                "itself trains other batches (keras-hub's task models turn arrays into an unshuffled dataset and "
                "preprocess it): for the same ones, pass shuffle=False, or the prepared tf.data.Dataset",
                type(model).__name__, owner.__module__, owner.__name__)


def warn_summed_trackers(model: Any, replicas: int) -> None:
    """Say at WARNING which ``Sum`` metrics of a model's own ``train_step`` count each of ``replicas`` replicas'
    values: a tracker given one value a step (the batch's loss) sums the replicas' values of their parts,
    ``replicas`` times one device's where the value is a mean over the batch (a ``Mean`` divides it out again)."""
    sums = [m.name for m in getattr(model, "metrics", ()) if type(m).__name__ == "Sum"]
    if sums and replicas > 1:
        log.warning("parallax.fit: the model's own train_step updates %s, a Sum: each of the %d replicas adds its "
                    "own part's value, so where the step gives it one value a batch (a loss, a mean over the "
                    "batch) its result is %d times one device's; a Mean of the same values equals one device's",
                    ", ".join(sums), replicas, replicas)


def own_train_step(model: Any, signature: list, has_targets: bool, weighted: bool, sources: dict | None = None
                   ) -> Any:
    """The model's ``train_step`` as a ``tf.function`` of ``(x[, y][, sample_weight])``; it returns the step's
    logs (a dict of tensors). When it is traced, ``sources`` takes the name of the metric whose result each log is
    (:func:`_metric_of`), for :func:`epoch_logs`."""

    def step(*args):
        data = args[0] if len(args) == 1 else tuple(args)
        logs = model.train_step(data)
        flat = _flat(logs) if isinstance(logs, dict) else {}
        if sources is not None:
            owners = _metric_variables(model)
            sources.update({k: _metric_of(v, owners) for k, v in flat.items()})
        return flat

    taken = [signature[0]] + ([signature[1]] if has_targets else []) + ([signature[2]] if weighted else [])
    return tf.function(step, input_signature=taken)


def _flat(logs: dict) -> dict:
    """The step's logs as Keras's callbacks see them: a nested dict's entries (Keras 3's compiled metrics) in place
    of it, in the order of the keys; the tensors alone."""
    flat: dict = {}
    for key, value in sorted(logs.items()):
        if isinstance(value, dict):
            flat.update(_flat(value))
        elif isinstance(value, tf.Tensor):
            flat[key] = value
    return flat


def _metric_variables(model: Any) -> dict[int, str]:
    """The name of the metric each of the model's metric variables belongs to, by the ``id`` of its handle."""
    owners = {}
    for metric in model.metrics:
        for leaf in getattr(metric, "metrics", None) or [metric]:  # Keras 3's compiled metrics: a container
            for variable in leaf.variables:
                inner = getattr(variable, "value", variable)  # Keras 3's: its tf.Variable; tf_keras's: a method
                handle = getattr(variable if callable(inner) else inner, "handle", None)
                if handle is not None:
                    owners[id(handle)] = leaf.name
    return owners


def _metric_of(tensor: tf.Tensor, owners: dict[int, str]) -> str | None:
    """The name of the metric whose result ``tensor`` is (computed from that metric's variables alone, as a
    tracker's ``result()``; ``owners``: :func:`_metric_variables`), or ``None`` (a value of the batch, another
    variable's)."""
    captured = {id(internal): id(external) for external, internal in getattr(tensor.graph, "captures", [])}
    found, seen, stack = set(), set(), [tensor.op]
    while stack:
        op = stack.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if op.type == "Placeholder":
            owner = owners.get(captured.get(id(op.outputs[0])))
            if owner is None:
                return None  # an input of the step, or a variable of no metric
            found.add(owner)
        stack.extend(t.op for t in op.inputs)
    return found.pop() if len(found) == 1 else None


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


def epoch_logs(group: Any, metrics: dict, last: dict | None, sources: dict) -> dict:
    """An epoch's logs as ``model.fit`` makes them for a model's own ``train_step``: its ``metrics``' results
    (summed over the workers) where the step's logs name exactly those metrics, else, as Keras does, the logs of
    the epoch's ``last`` step (a step that returns ``"loss"`` for a tracker named ``"total_loss"``, a raw batch
    loss, the learning rate): a log that is a metric's result (``sources``) is that metric's result over the
    job, any other the mean over the job's workers of their replicas' mean (a mean over equal parts: the batch's
    value on one device).

    >>> epoch_logs(None, {"total_loss": 1.0}, None, {})
    {'total_loss': 1.0}
    """
    if not last or set(last) == set(metrics):
        return metrics
    raw = [k for k in last if sources.get(k) not in metrics]
    means = group.sum(np.array([last[k] for k in raw], np.float64)) / group.size if raw else []
    values = {k: float(v) for k, v in zip(raw, means)}
    return {k: values[k] if k in values else metrics[sources[k]] for k in last}
