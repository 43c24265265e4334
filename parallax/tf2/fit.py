"""``parallax.fit``: a compiled Keras 3 model trained as ``model.fit`` trains it, data-parallel.

``history = parallax.fit(model, x, y, batch_size=64, epochs=3, resource_info="resource_info")`` takes
what ``model.fit`` takes for arrays or a ``tf.data.Dataset``, and what ``parallel_run`` takes for the job,
and returns a Keras ``History`` on every worker. Under it:

* **the step**: the model's forward pass, its compiled loss and its optimizer's update, as Keras's own
  ``train_step`` writes them, in a ``tf.function`` that Parallax traces and trains data-parallel
  (:mod:`parallax.tf2.trace`); it returns the loss and the predictions of each replica's part;
* **the examples**: each epoch the arrays are cut into batches of ``batch_size`` (the global batch), in
  order, or shuffled with ``np.random.RandomState(seed + epoch)``, the same on every worker; replica
  ``k`` of worker ``w`` takes part ``w * replicas + k`` of ``np.array_split``-free equal parts of each
  batch (:func:`parts`). So one step's union is one batch of the same ``model.fit`` on one device with
  ``shuffle=False`` (or the same permutation). A last batch that does not split into equal parts is left
  out (said at WARNING). A ``Dataset`` yields global batches; every worker reads all of them (give it a
  seed) and takes its part;
* **the metrics**: the compiled metrics are updated on each worker, outside the graph, from its
  replicas' predictions; the progress bar (worker 0's) shows worker 0's running values; at each epoch's
  end the metrics' states (their counts and sums) are summed over the workers, so the epoch's logs, the
  ``History`` and the callbacks see the metrics of every example of the epoch, as one device does;
* **validation**: ``validation_data`` is evaluated after each epoch by every worker on the trained
  weights (``model.evaluate``): every worker has the same ``val_`` logs;
* **callbacks**: run on every worker with the trained weights in the model (so ``EarlyStopping`` decides
  alike everywhere; a stop asked on any worker stops all), except those that write files
  (``ModelCheckpoint``, ``TensorBoard``, ``CSVLogger``, ``BackupAndRestore``), which run on worker 0.

After ``fit`` the model holds the trained weights on every worker: ``model.evaluate``, ``model.predict``
and ``model.save`` work as after ``model.fit``. As with ``parallel_run``, the process the user started
launches the job and exits with its exit code; ``fit`` returns in the job's worker processes.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

__all__ = ["fit", "parts"]

log = logging.getLogger("parallax")

#: Callbacks that write files: run on worker 0 alone.
_CHIEF_ONLY = ("ModelCheckpoint", "TensorBoard", "CSVLogger", "BackupAndRestore")


def parts(batch: Any, num_workers: int, worker_id: int, num_replicas: int) -> list:
    """This worker's replicas' parts of a global ``batch`` (an array, or a structure of arrays), in replica
    order: the batch cut in ``num_workers * num_replicas`` equal parts, part ``worker_id * num_replicas + k``
    for replica ``k``.

    >>> parts(np.arange(6), 3, 1, 1)
    [array([2, 3])]
    """
    n = num_workers * num_replicas
    cut = [np.split(np.asarray(a), n) for a in tf.nest.flatten(batch)]
    first = worker_id * num_replicas
    return [tf.nest.pack_sequence_as(batch, [pieces[first + k] for pieces in cut]) for k in range(num_replicas)]


def _per_leaf(per_replica: list, structure: Any) -> Any:
    """``structure`` with each leaf the list of that leaf's value on every replica (what a step takes)."""
    flat = [tf.nest.flatten(part) for part in per_replica]
    return tf.nest.pack_sequence_as(structure, [[f[i] for f in flat] for i in range(len(flat[0]))])


def fit(model: Any, x: Any = None, y: Any = None, batch_size: int | None = None, epochs: int = 1,
        verbose: Any = "auto", callbacks: list | None = None, validation_data: Any = None, shuffle: bool = True,
        initial_epoch: int = 0, steps_per_epoch: int | None = None, *, resource_info: Any = None, seed: int = 0,
        sync: bool = True, parallax_config: Any = None) -> Any:
    """Train a compiled Keras 3 ``model`` data-parallel, as ``model.fit`` does on one device (see the module
    docstring).

    Args:
        model: a Keras 3 model, compiled (``model.compile(optimizer, loss, metrics)``).
        x, y: the inputs and targets (arrays, or structures of arrays), or ``x`` a ``tf.data.Dataset``
            of ``(inputs, targets)`` global batches.
        batch_size: the global batch (arrays; default 32).
        epochs, verbose, callbacks, validation_data, shuffle, initial_epoch, steps_per_epoch: as
            ``model.fit`` takes them.
        resource_info, sync, parallax_config: as :func:`parallax.parallel_run` takes them.
        seed: the shuffle of epoch ``e`` is ``np.random.RandomState(seed + e)``'s.

    Returns:
        The ``History`` of the training, on every worker; it also says ``num_workers``, ``worker_id`` and
        ``num_replicas`` (per worker), as ``parallel_run`` returns them.

    Raises:
        TypeError: the model is no Keras 3 model, or ``x`` is missing.
        ValueError: the model is not compiled; a batch does not split into the replicas' parts.
    """
    import keras

    from parallax.api import parallel_run

    if not isinstance(model, keras.Model):
        raise TypeError(f"parallax.fit: model must be a Keras 3 model (keras.Model), got {type(model).__name__}; "
                        "for tf_keras or a custom loop, pass a tf.function step to parallel_run")
    if getattr(model, "optimizer", None) is None or not getattr(model, "compiled", False):
        raise ValueError("parallax.fit: the model is not compiled; call model.compile(optimizer=..., loss=..., "
                         "metrics=...) first, as for model.fit")
    batches = _Batches(x, y, batch_size, shuffle, seed, steps_per_epoch)
    outputs: dict = {}  # the structure of the model's predictions, seen when the step is traced
    step_fn = _train_step(model, batches.signature, outputs)
    step, num_workers, worker_id, num_replicas = parallel_run(step_fn, resource_info, sync=sync,
                                                              parallax_config=parallax_config)
    group = step.session.group
    if group is None and num_workers > 1:
        step.close()
        raise ValueError("parallax.fit sums the metrics over the workers, which the tasks of a job a cluster manager "
                         "starts (TF_CONFIG) cannot do; launch the job with parallel_run's launcher (python train.py "
                         "or parallax-run), or train with a tf.function step and parallel_run")
    chief = worker_id == 0
    kept = [c for c in (callbacks or []) if chief or type(c).__name__ not in _CHIEF_ONLY]
    steps = batches.steps(num_workers * num_replicas)
    callback_list = keras.callbacks.CallbackList(
        kept, add_history=True, add_progbar=chief and verbose != 0, model=model,
        verbose=1 if verbose == "auto" else verbose, epochs=epochs, steps=steps)
    loss_tracker = next(m for m in model.metrics if m.name == "loss")
    model.stop_training = False
    callback_list.on_train_begin()
    logs: dict = {}
    for epoch in range(initial_epoch, epochs):
        model.reset_metrics()
        callback_list.on_epoch_begin(epoch)
        for index, (inputs, targets) in enumerate(batches.epoch(epoch, num_workers * num_replicas)):
            callback_list.on_train_batch_begin(index)
            mine_x = parts(inputs, num_workers, worker_id, num_replicas)
            mine_y = parts(targets, num_workers, worker_id, num_replicas)
            losses, predicted = step(_per_leaf(mine_x, inputs), _per_leaf(mine_y, targets))
            for k, (loss, part_x, part_y) in enumerate(zip(losses, mine_x, mine_y)):
                prediction = tf.nest.pack_sequence_as(outputs["structure"], [leaf[k] for leaf in predicted])
                loss_tracker.update_state(loss, sample_weight=len(tf.nest.flatten(part_x)[0]))
                model.compute_metrics(part_x, part_y, prediction)
            callback_list.on_train_batch_end(index, _numbers(model.get_metrics_result()))
        _sum_metrics(model, group)
        logs = _numbers(model.get_metrics_result())
        step.sync_variables()  # the callbacks and the validation see the trained weights
        if validation_data is not None:
            val = model.evaluate(*_pair(validation_data), verbose=0, return_dict=True)
            logs.update({f"val_{k}": float(v) for k, v in val.items()})
        callback_list.on_epoch_end(epoch, logs)
        if group is not None and group.any(bool(model.stop_training)):
            model.stop_training = True
        if model.stop_training:
            break
    step.close()
    callback_list.on_train_end(logs)
    history = model.history
    history.num_workers, history.worker_id, history.num_replicas = num_workers, worker_id, num_replicas
    return history


def _train_step(model: Any, signature: list, outputs: dict) -> Any:
    """Keras 3's ``train_step`` for one replica, its metrics left to the host: the loss and the predictions
    (flattened; their structure goes into ``outputs["structure"]``)."""

    @tf.function(input_signature=signature)
    def train_step(x, y):
        with tf.GradientTape() as tape:
            prediction = model(x, training=True)
            loss = model.compute_loss(x=x, y=y, y_pred=prediction, training=True)
            scaled = model.optimizer.scale_loss(loss)  # as Keras's: a loss scale (mixed precision) or the loss
        variables = model.trainable_weights
        model.optimizer.apply_gradients(zip(tape.gradient(scaled, variables), variables))
        outputs["structure"] = prediction
        return loss, tf.nest.flatten(prediction)

    return train_step


def _sum_metrics(model: Any, group: Any) -> None:
    """Every metric's state (counts and sums) summed over the workers: the metrics of every example."""
    if group is None or group.size == 1:
        return
    variables = [v for m in model.metrics for v in m.variables]
    values = [np.asarray(v.numpy(), dtype=np.float64) for v in variables]
    if not values:
        return
    summed = group.sum(np.concatenate([a.reshape(-1) for a in values]))
    start = 0
    for variable, value in zip(variables, values):
        variable.assign(summed[start:start + value.size].reshape(value.shape).astype(variable.dtype))
        start += value.size


def _numbers(logs: dict) -> dict:
    return {k: float(np.asarray(v)) for k, v in logs.items()}


def _pair(data: Any) -> tuple:
    if isinstance(data, (list, tuple)) and len(data) == 2:
        return tuple(data)
    return (data,)


class _Batches:
    """The global batches of each epoch, from arrays or a ``tf.data.Dataset`` (see the module docstring)."""

    def __init__(self, x: Any, y: Any, batch_size: int | None, shuffle: bool, seed: int,
                 steps_per_epoch: int | None) -> None:
        if x is None:
            raise TypeError("parallax.fit: x is missing (arrays, or a tf.data.Dataset of (inputs, targets) batches)")
        self._dataset = x if isinstance(x, tf.data.Dataset) else None
        self._x, self._y = x, y
        self._batch = batch_size or 32
        self._shuffle, self._seed, self._steps = shuffle, seed, steps_per_epoch
        if self._dataset is None:
            self._n = len(tf.nest.flatten(x)[0])
            first_x = tf.nest.map_structure(lambda a: np.asarray(a)[:1], x)
            first_y = tf.nest.map_structure(lambda a: np.asarray(a)[:1], y)
        else:
            first_x, first_y = next(iter(self._dataset))
        self.signature = [_spec(first_x), _spec(first_y)]

    def steps(self, parts: int) -> int | None:
        if self._steps is not None or self._dataset is not None:
            return self._steps
        return len(list(self._cuts(0, parts)))

    def epoch(self, epoch: int, parts: int) -> Iterator[tuple[Any, Any]]:
        if self._dataset is not None:
            for i, (x, y) in enumerate(self._dataset):
                if self._steps is not None and i >= self._steps:
                    return
                if len(tf.nest.flatten(x)[0]) % parts:
                    raise ValueError(f"parallax.fit: batch {i} of the dataset has {len(tf.nest.flatten(x)[0])} "
                                     f"examples, which do not split into {parts} equal parts (one per replica); "
                                     "batch it with a multiple of the replicas and drop_remainder=True")
                yield tf.nest.map_structure(np.asarray, x), tf.nest.map_structure(np.asarray, y)
            return
        for chosen in self._cuts(epoch, parts):
            yield (tf.nest.map_structure(lambda a, c=chosen: np.asarray(a)[c], self._x),
                   tf.nest.map_structure(lambda a, c=chosen: np.asarray(a)[c], self._y))

    def _cuts(self, epoch: int, parts: int) -> Iterator[np.ndarray]:
        order = np.random.RandomState(self._seed + epoch).permutation(self._n) if self._shuffle \
            else np.arange(self._n)
        count = 0
        for start in range(0, self._n, self._batch):
            chosen = order[start:start + self._batch]
            if len(chosen) % parts:
                if epoch == 0:
                    log.warning("parallax.fit: the last %d example(s) of each epoch do not split into %d equal parts "
                                "(one per replica); they are left out", len(chosen), parts)
                continue
            if self._steps is not None and count >= self._steps:
                return
            count += 1
            yield chosen


def _spec(value: Any) -> Any:
    """A ``tf.TensorSpec`` of ``value``'s dtype and shape, any batch size."""
    return tf.nest.map_structure(
        lambda a: tf.TensorSpec([None, *np.asarray(a).shape[1:]], tf.as_dtype(np.asarray(a).dtype)), value)
