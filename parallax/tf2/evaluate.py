"""``parallax.evaluate`` and ``parallax.predict``: a Keras model's evaluation and prediction sharded over the
workers of the job ``parallax.fit`` trained it in, with what ``model.evaluate`` / ``model.predict`` return on
one device, on every worker.

* **the examples**: the data is cut into global batches of ``batch_size`` in order (the last one as short as
  it is), or taken as a ``tf.data.Dataset`` yields them (every worker reads all of it: it must yield the same
  batches everywhere); worker ``w`` of ``n`` takes part ``w`` of ``np.array_split(batch, n)``
  (:func:`worker_part`): every example once, on one worker, also when a batch does not split evenly;
* **evaluate**: each worker runs the model's own ``test_step`` on its parts (the compiled loss and metrics
  updated as ``model.evaluate`` updates them), then the metrics' states (counts and sums) are summed over
  the workers: every worker gets the metrics of every example;
* **predict**: each worker predicts its parts (``predict_on_batch``); the parts are gathered and put back
  in the original order (:func:`in_order`): every worker gets every example's prediction.

**Which job.** The job of the last ``parallax.fit`` in this process (its workers stay a group after its
session closes). With none (a script that only evaluates, or a call before ``fit``), the call runs on this
process alone over all the data, which is ``model.evaluate``'s result too, and says so at WARNING; to
shard an evaluation, call it after ``parallax.fit`` in the job's script.

Every worker of the job must call these functions alike (the same data, in the same order): they are
collective calls.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from parallax.comm.group import Alone, WorkerGroup
from parallax.logs import log
from parallax.tf2.arguments import check_evaluate, check_predict
from parallax.tf2.batch_parts import block_rows
from parallax.tf2.data_order import check_ordered
from parallax.tf2.keras_flavor import Flavor, flavor_of
from parallax.tf2.own_step import overrides
from parallax.tf2.part_loss import masked_losses, sums_over_batch

__all__ = ["evaluate", "predict", "worker_part", "in_order", "use_job", "job_group", "evaluate_on", "evaluated_whole",
           "global_batches", "sum_metrics", "check_same_metrics", "numbers", "CHIEF_ONLY",
           "chief_or_shared"]

#: The workers of the job of this process's last ``parallax.fit`` (set by :func:`use_job`).
_JOB: list[WorkerGroup] = []


def use_job(group: WorkerGroup) -> None:
    """Make ``group`` (the workers of the job ``parallax.fit``, or ``parallel_run`` of a ``tf.function`` step,
    runs in) the one ``evaluate`` and ``predict`` shard over in this process from now on."""
    _JOB[:] = [group]


def job_group(caller: str) -> WorkerGroup:
    """The workers of this process's job; alone (said at WARNING) when no job has started here."""
    if _JOB:
        return _JOB[0]
    log.warning("%s: no job has started in this process (parallax.fit, or parallel_run of a tf.function step), so "
                "there is none to shard over: it runs on this process alone, over all the data (as model.%s "
                "does); call it after the job has started in the job's script to shard it over the workers",
                caller, caller.rsplit(".", 1)[-1])
    return Alone()


def worker_part(batch: Any, num_workers: int, worker_id: int) -> Any:
    """Worker ``worker_id``'s part of a global ``batch`` (an array, or a structure of arrays):
    part ``worker_id`` of ``np.array_split`` in ``num_workers`` (the first parts one longer when the batch
    does not split evenly; empty ones when it has fewer examples than workers).

    >>> worker_part(np.arange(5), 2, 1)
    array([3, 4])
    """
    return tf.nest.map_structure(lambda a: None if a is None else np.array_split(np.asarray(a), num_workers)[worker_id],
                                 batch)


def _first(batch: Any, examples: int) -> Any:
    """The first ``examples`` of ``batch`` (each array cut so)."""
    return tf.nest.map_structure(lambda a: None if a is None else np.asarray(a)[:examples], batch)


def in_order(per_worker: list[list[Any]]) -> Any:
    """The predictions of every example in the original order, from each worker's predictions of its part of
    each batch (``per_worker[w][i]``: worker ``w``'s of batch ``i``, ``None`` for an empty part); each leaf
    of the structure concatenated along the examples.

    >>> in_order([[np.array([0, 1]), np.array([4])], [np.array([2, 3]), None]])
    array([0, 1, 2, 3, 4])
    """
    pieces = [part for i in range(len(per_worker[0])) for mine in per_worker if (part := mine[i]) is not None]
    if not pieces:
        return None
    flat = [tf.nest.flatten(p) for p in pieces]
    return tf.nest.pack_sequence_as(pieces[0], [np.concatenate([f[k] for f in flat]) for k in range(len(flat[0]))])


def evaluate(model: Any, x: Any = None, y: Any = None, batch_size: int | None = None, verbose: Any = "auto",
             sample_weight: Any = None, steps: int | None = None, callbacks: list | None = None,
             return_dict: bool = False) -> Any:
    """``model.evaluate``, sharded over the job's workers (see the module docstring).

    Args:
        model: a compiled Keras 3 or ``tf_keras`` model.
        x, y, sample_weight: arrays (or structures of arrays), or ``x`` a ``tf.data.Dataset`` of
            ``(inputs, targets[, sample_weights])`` global batches.
        batch_size: the global batch (arrays; default 32).
        verbose, steps, callbacks, return_dict: as ``model.evaluate`` takes them; the progress bar is
            worker 0's (its running values are its own examples'; the last, every example's).

    Returns:
        What ``model.evaluate`` returns (the loss, or a list of the loss and metrics, or a dict), on every
        worker.

    Raises:
        TypeError: the model is no Keras model, or ``x`` is missing.
        ValueError: the model is not compiled; the workers were given different data.
    """
    flavor = flavor_of(model, "parallax.evaluate")
    check_evaluate(x, y, batch_size, verbose, sample_weight, steps)
    group = job_group("parallax.evaluate")
    count, batches = global_batches(x, y, sample_weight, batch_size, steps, "parallax.evaluate", group.size)
    logs = evaluate_on(model, flavor, group, ((batch, None) for batch in batches),
                       _callbacks(flavor, callbacks, group, verbose, count, model))
    return logs if return_dict else flavor.in_order(model, logs)


def evaluate_on(model: Any, flavor: Flavor, group: WorkerGroup, batches: Iterator[tuple], callback_list: Any,
                whole: bool | None = None) -> dict:
    """The metrics of every example of ``batches``, each worker evaluating its parts (of a model whose loss averages
    over a batch's unmasked values or sums over its examples, a compiled loss's or what a layer adds one value per
    example, whole batches in turn: the average of a batch's parts is not the batch's, :func:`evaluated_whole`,
    decided at the first batch where ``whole`` is ``None``). Each of ``batches`` is ``(global batch, None)``, or,
    where the worker reads its share of the data (:meth:`parallax.tf2.batches.FitBatches.split`, one part a worker,
    never with ``whole``), ``(its block, the examples of the global batch)``: the block of a worker that the short
    last batch leaves none is padding, not evaluated. ``callback_list`` hears the ``on_test_*`` calls
    (``parallax.fit``'s validation passes its own)."""
    model.reset_metrics()
    callback_list.on_test_begin()
    sizes: list[int] = []
    own = overrides(model, flavor.module, "test_step")
    uneven = False
    for index, (batch, examples) in enumerate(batches):
        if whole is None:  # at the first batch, which every worker has whole: alike everywhere
            whole = evaluated_whole(model, flavor, group, batch[0])
        callback_list.on_test_batch_begin(index)
        size = len(tf.nest.flatten(batch[0])[0]) if examples is None else examples
        if own and not whole and size % group.size and group.index == 0 and not uneven:
            uneven = True  # said once an evaluation
            log.warning("parallax: batch %d of the evaluation has %d examples, which do not split into %d equal "
                        "parts (one a worker), and %s's own test_step need not weigh its parts by their examples (a "
                        "Mean of each batch's loss counts each part as a batch): its results differ from "
                        "model.evaluate's. For the same, give a batch size (fit's validation_batch_size) and a "
                        "number of examples that %d divides, or a dataset batched with drop_remainder=True",
                        index, size, group.size, type(model).__name__, group.size)
        if examples is not None:  # this worker's block, cut as its share cuts a batch (padding where it has none)
            mine = _first(batch, block_rows(size, group.size, group.index))
        elif whole:
            mine = batch if index % group.size == group.index else _first(batch, 0)
        else:
            mine = worker_part(batch, group.size, group.index)
        if not sizes and len(tf.nest.flatten(mine[0])[0]) == 0:  # build the metrics as the others do, then forget
            flavor.test_batch(model, *_first(batch, 1))
            model.reset_metrics()
        sizes.append(size)
        part = len(tf.nest.flatten(mine[0])[0])
        if part:
            flavor.test_batch(model, *mine, counts=part / size)
        callback_list.on_test_batch_end(index, numbers(model.get_metrics_result()))
    agree(group, sizes, "parallax.evaluate")
    sum_metrics(model, group)
    logs = numbers(model.get_metrics_result())
    callback_list.on_test_end(logs)
    return logs


def evaluated_whole(model: Any, flavor: Flavor, group: WorkerGroup, x: Any) -> bool:
    """Whether a job of ``group``'s workers evaluates ``model`` by whole batches in turn rather than each its part
    of every batch: where the model's loss averages over a batch's unmasked values, sums over its examples, or a
    layer adds a loss of one value per example (seen by calling it on ``x``, inputs of at least one example: the
    answer is the model's, not the data's)."""
    return group.size > 1 and (bool(masked_losses(model)) or sums_over_batch(model)
                               or flavor.adds_per_example(model, x))


def predict(model: Any, x: Any, batch_size: int | None = None, verbose: Any = "auto", steps: int | None = None,
            callbacks: list | None = None) -> Any:
    """``model.predict``, sharded over the job's workers (see the module docstring).

    Args:
        model: a Keras 3 or ``tf_keras`` model.
        x: arrays (or a structure of arrays), or a ``tf.data.Dataset`` of global batches (of inputs, or of
            ``(inputs, ...)`` tuples whose first element is taken).
        batch_size, verbose, steps, callbacks: as ``model.predict`` takes them.

    Returns:
        The predictions of every example, in order (an array, or the structure of the model's outputs), on
        every worker.

    Raises:
        TypeError: the model is no Keras model, or ``x`` is missing.
        ValueError: the workers were given different data.
    """
    flavor = flavor_of(model, "parallax.predict", compiled=False)
    check_predict(x, batch_size, verbose, steps)
    group = job_group("parallax.predict")
    count, batches = global_batches(x, None, None, batch_size, steps, "parallax.predict", group.size)
    callback_list = _callbacks(flavor, callbacks, group, verbose, count, model)
    callback_list.on_predict_begin()
    sizes: list[int] = []
    mine: list[Any] = []
    for index, batch in enumerate(batches):
        callback_list.on_predict_batch_begin(index)
        part = worker_part(batch[0], group.size, group.index)
        sizes.append(len(tf.nest.flatten(batch[0])[0]))
        outputs = flavor.predict_batch(model, part) if len(tf.nest.flatten(part)[0]) else None
        mine.append(None if outputs is None else tf.nest.map_structure(np.asarray, outputs))
        callback_list.on_predict_batch_end(index, {"outputs": outputs})
    every = group.gather((sizes, mine))
    _check_same([s for s, _ in every], "parallax.predict")
    result = in_order([m for _, m in every])
    callback_list.on_predict_end()
    return result


def agree(group: WorkerGroup, sizes: list[int], caller: str) -> None:
    """Every worker read the same batches (their sizes), or a ``ValueError`` on every worker."""
    if group.size > 1:
        _check_same(group.gather(sizes), caller)


def _check_same(every: list[list[int]], caller: str) -> None:
    if any(s != every[0] for s in every):
        described = "; ".join(f"worker {w}: {len(s)} batches, {sum(s)} examples" for w, s in enumerate(every))
        raise ValueError(f"{caller}: the workers were given different data ({described}); every worker of the job "
                         "must pass the same data (the same arrays, or a dataset yielding the same batches)")


def sum_metrics(model: Any, group: WorkerGroup) -> None:
    """Every metric's state (counts and sums) summed over the workers: the metrics of every example."""
    if group.size == 1:
        return
    variables = [v for m in model.metrics for v in m.variables]
    values = [np.asarray(v.numpy(), dtype=np.float64) for v in variables]
    check_same_metrics(group, [a.shape for a in values])
    if not values:
        return
    summed = group.sum(np.concatenate([a.reshape(-1) for a in values]))
    start = 0
    for variable, value in zip(variables, values):
        dtype = tf.as_dtype(variable.dtype).as_numpy_dtype
        variable.assign(summed[start:start + value.size].reshape(value.shape).astype(dtype))
        start += value.size


def check_same_metrics(group: WorkerGroup, shapes: list) -> None:
    """Refuse workers whose models keep other metric variables (``shapes``: this worker's; a collective)."""
    every = group.gather([tuple(s) for s in shapes])
    if any(s != every[0] for s in every):
        described = "; ".join(f"worker {w}: {len(s)} variables" for w, s in enumerate(every))
        raise ValueError(f"the workers' models keep different metrics ({described}); build and compile the same "
                         "model, with the same metrics, on every worker")


def numbers(logs: dict) -> dict:
    """Logs as Python numbers (a metric with several values, such as a per-class score, as an array)."""
    return {k: float(a) if (a := np.asarray(v)).ndim == 0 else a for k, v in logs.items()}


def _callbacks(flavor: Flavor, callbacks: list | None, group: WorkerGroup, verbose: Any, steps: int | None,
               model: Any) -> Any:
    """The callbacks of an evaluation or a prediction: those that write files on worker 0 alone, and worker
    0's progress bar."""
    kept = chief_or_shared(callbacks, flavor, group.index == 0)
    return flavor.callbacks.CallbackList(kept, add_progbar=group.index == 0 and verbose != 0, model=model,
                                         verbose=1 if verbose == "auto" else verbose, epochs=1, steps=steps)


#: Callbacks that write files: run on worker 0 alone (their subclasses too).
CHIEF_ONLY = ("ModelCheckpoint", "TensorBoard", "CSVLogger", "BackupAndRestore")


def chief_or_shared(callbacks: list | None, flavor: Flavor, chief: bool) -> list:
    """The ``callbacks`` this worker runs: every one on worker 0 (``chief``), on the others those that write
    no file (instances of :data:`CHIEF_ONLY`'s classes, subclasses included, run on worker 0 alone)."""
    if chief:
        return list(callbacks or [])
    writers = tuple(getattr(flavor.callbacks, name) for name in CHIEF_ONLY)
    return [c for c in (callbacks or []) if not isinstance(c, writers)]


def global_batches(x: Any, y: Any, sample_weight: Any, batch_size: int | None, steps: int | None,
                   caller: str, workers: int = 1) -> tuple[int | None, Iterator[tuple]]:
    """How many global batches (``None``: as many as a dataset yields) and the batches ``(x, y, sample_weight)``
    of arrays (in order, the last as short as it is) or of a ``tf.data.Dataset`` (as it yields them, in order on
    each of ``workers``: :func:`parallax.tf2.data_order.check_ordered`), at most ``steps`` of them."""
    if x is None:
        raise TypeError(f"{caller}: x is missing (arrays, or a tf.data.Dataset of batches)")
    if isinstance(x, tf.data.Dataset):
        check_ordered(x, workers, caller, "x")
        return steps, _dataset_batches(x, steps)
    n = len(tf.nest.flatten(x)[0])
    size = batch_size or 32
    count = -(-n // size) if steps is None else min(steps, -(-n // size))
    return count, _array_batches((x, y, sample_weight), size, count)


def _dataset_batches(dataset: tf.data.Dataset, steps: int | None) -> Iterator[tuple]:
    for index, element in enumerate(dataset):
        if steps is not None and index >= steps:
            return
        element = tf.nest.map_structure(np.asarray, element)
        if not isinstance(element, tuple):
            element = (element,)
        yield (*element, *([None] * (3 - len(element))))


def _array_batches(arrays: tuple, size: int, count: int) -> Iterator[tuple]:
    for start in range(0, count * size, size):
        yield tuple(None if a is None else tf.nest.map_structure(lambda v, s=start: np.asarray(v)[s:s + size], a)
                    for a in arrays)
