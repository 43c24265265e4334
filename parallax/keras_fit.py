"""``parallax.fit``: a compiled Keras model (Keras 3 or ``tf_keras``) trained as ``model.fit`` trains it, data-parallel.

``history = parallax.fit(model, x, y, batch_size=64, epochs=3, resource_info="resource_info")`` takes
what ``model.fit`` takes for arrays or a ``tf.data.Dataset``, and what ``parallel_run`` takes for the job,
and returns a Keras ``History`` on every worker. Under it:

* **the step**: the model's forward pass, its compiled loss and its optimizer's update, as that Keras's own
  ``train_step`` writes them (:mod:`parallax.tf2.keras_flavor`), in a ``tf.function`` that Parallax traces
  and trains data-parallel (:mod:`parallax.tf2.trace`); it returns each replica's loss and its metrics' state;
* **the examples**: the global batches are those ``model.fit`` draws, in its order, from that Keras's own
  data handling made with the same arguments (arrays and their shuffle, ``class_weight``, a dataset, a
  generator, a ``PyDataset``: :mod:`parallax.tf2.batches`); every worker draws them all alike, and
  replica ``k`` of worker ``w`` takes part ``w * replicas + k`` of equal parts of each batch
  (:mod:`parallax.tf2.batch_parts`). So one step's union is the batch ``model.fit`` trains at that step. A batch
  that does not split into equal parts is padded to equal parts, and the step cuts the padding off
  before the forward pass: each replica trains on its part's real examples, and its whole loss (the compiled
  loss, the model's own losses: regularization, ``add_loss``, a ``compute_loss`` of its own) counts for its
  share of the batch's examples, so that the replicas' mean loss is the batch's, as on one device;
* **the metrics**: the step updates the compiled metrics and the loss metrics, in the graph, as ``model.fit``'s
  does (Keras 3's loss tracker, tf_keras's compiled loss's own), and what the replicas added is summed over the
  workers into the model's metrics where they are read (:mod:`parallax.tf2.summed`): the progress bar, the logs,
  the ``History`` and the callbacks see every example so far, as on one device;
* **validation**: ``validation_data`` is evaluated after each epoch on the trained weights, sharded over
  the workers as :func:`parallax.evaluate` does (:mod:`parallax.tf2.evaluate`): every worker has the same
  ``val_`` logs, those of every validation example; a ``tf.data`` pipeline each worker reads its share of, as
  the training data (unless the model's loss needs whole batches in turn);
* **callbacks**: run on every worker with the trained weights in the model (so ``EarlyStopping`` decides
  alike everywhere; a stop asked on any worker stops all), except those that write files
  (``ModelCheckpoint``, ``TensorBoard``, ``CSVLogger``, ``BackupAndRestore``), which run on worker 0; Keras 3's
  ``BackupAndRestore`` restores on every worker before the job's variables are made (:mod:`parallax.tf2.backup`);
* **weights**: ``sample_weight`` (or ``class_weight``, turned into sample weights as Keras does) is cut into
  the replicas' parts with the examples; ``validation_split`` holds out the last examples, as Keras does.

After ``fit`` the model holds the trained weights on every worker: ``model.evaluate``, ``model.predict``
and ``model.save`` work as after ``model.fit``, and ``parallax.evaluate`` / ``parallax.predict`` shard
over the job's workers. As with ``parallel_run``, the process the user started
launches the job and exits with its exit code; ``fit`` returns in the job's worker processes.
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import tensorflow as tf

from parallax.api import job_replicas, parallel_run
from parallax.comm.group import Alone
from parallax.tf2.arguments import check_fit, check_model, check_optimizer, input_queue, is_dataset_like
from parallax.tf2.backup import check_restored_alike, restore_backups
from parallax.tf2.batch_hooks import ENDS, BatchLogs, CallbackReach, reads_logs, saves_after
from parallax.tf2.batch_parts import block_rows, parts, per_leaf, worker_block
from parallax.tf2.batches import FitBatches, check_same, with_batch
from parallax.tf2.data_order import check_ordered
from parallax.tf2.draws import mark_part
from parallax.tf2.evaluate import chief_or_shared, evaluate_on, evaluated_whole, numbers, use_job
from parallax.tf2.executions import Executions
from parallax.tf2.exhausted import counting, exhausted_step, warn_uncounted
from parallax.tf2.host_edits import HostEdits, metric_state
from parallax.tf2.keras_flavor import Flavor, flavor_of
from parallax.tf2.own_step import (
    check_even,
    epoch_logs,
    overrides,
    own_train_step,
    warn_own_fit,
    warn_summed_trackers,
)
from parallax.tf2.part_loss import (
    counts,
    part_loss,
    per_example,
    rows,
    summed_weights,
    sums_over_batch,
    warn_masked_loss,
    with_added_sums,
)
from parallax.tf2.replica_sums import synchronised_statistics

__all__ = ["fit", "split_validation"]


def fit(model: Any, x: Any = None, y: Any = None, batch_size: int | None = None, epochs: int = 1,
        verbose: Any = "auto", callbacks: list | None = None, validation_split: float = 0.0,
        validation_data: Any = None, shuffle: bool = True, class_weight: dict | None = None,
        sample_weight: Any = None, initial_epoch: int = 0, steps_per_epoch: int | None = None,
        validation_steps: int | None = None, validation_batch_size: int | None = None, validation_freq: int = 1,
        max_queue_size: int | None = None, workers: int | None = None, use_multiprocessing: bool | None = None, *,
        resource_info: Any = None, seed: int = 0, sync: bool = True, parallax_config: Any = None) -> Any:
    """Train a compiled Keras ``model`` data-parallel, as ``model.fit`` does on one device (see the module
    docstring).

    Args:
        model: a Keras 3 or ``tf_keras`` model, compiled (``model.compile(optimizer, loss, metrics)``).
        x, y: the inputs and targets (arrays, or structures of arrays), or ``x`` a ``tf.data.Dataset``
            of ``(inputs, targets)`` global batches.
        batch_size: the global batch (arrays; default 32).
        epochs, verbose, callbacks, validation_split, validation_data, shuffle, class_weight, sample_weight,
            initial_epoch, steps_per_epoch, validation_steps, validation_batch_size, validation_freq: as
            ``model.fit`` takes them (``validation_freq`` an int; Keras 3's ``BackupAndRestore`` restores before
            the job is made, tf_keras's is refused).
        max_queue_size, workers, use_multiprocessing: as tf_keras's ``model.fit`` takes them, for a generator or a
            ``Sequence`` (Keras 3's ``model.fit`` takes none of them: ``TypeError``).
        resource_info, sync, parallax_config: as :func:`parallax.parallel_run` takes them.
        seed: the global seed the shuffle of arrays is drawn with where the program set none
            (``keras.utils.set_random_seed``), so that every worker draws the same batches.

    Returns:
        The ``History`` of the training, on every worker; it also says ``num_workers``, ``worker_id`` and
        ``num_replicas`` (per worker), as ``parallel_run`` returns them.

    Raises:
        TypeError: the model is no Keras model, or ``x`` is missing.
        ValueError: the model is not compiled; a batch does not split into the
            replicas' parts; tf_keras's ``BackupAndRestore``, or a backup that the workers read otherwise; weights
            or a split asked of a dataset.
    """
    flavor = flavor_of(model, "parallax.fit")
    check_fit(x, y, batch_size, epochs, verbose, callbacks, validation_split, validation_data, shuffle, class_weight,
              sample_weight, initial_epoch, steps_per_epoch, validation_steps, validation_batch_size, validation_freq,
              seed)
    check_model(model)
    check_optimizer(model, parallax_config)
    own = overrides(model, flavor.module)
    flavor.ready(model)  # the optimizer's variables a callback may set (the learning rate), made before the trace
    keras_3 = not flavor.module.__name__.startswith("tf_keras")
    queue = input_queue(keras_3, max_queue_size, workers, use_multiprocessing)
    backups = restore_backups(model, callbacks, legacy=not keras_3)  # before the job's variables are made
    if class_weight is not None and sample_weight is not None:
        raise ValueError("parallax.fit: class_weight goes with arrays x, y and no sample_weight (as in model.fit)")
    if validation_split:
        if isinstance(x, tf.data.Dataset) or validation_data is not None:
            raise ValueError("parallax.fit: validation_split cuts arrays x, y, and is ignored by model.fit when "
                             "validation_data is given; pass one of them, with arrays")
        (x, y, sample_weight), validation_data = split_validation((x, y, sample_weight), validation_split)
    if sample_weight is not None and isinstance(x, tf.data.Dataset):
        raise ValueError("parallax.fit: sample_weight goes with arrays; a dataset yields its own "
                         "(inputs, targets, sample_weights)")
    if x is None:
        raise TypeError("parallax.fit: x is missing (arrays, or a tf.data.Dataset of (inputs, targets) batches)")
    batches = FitBatches(flavor.module.__name__.split(".")[0], model, x, y, sample_weight, batch_size,
                         steps_per_epoch, shuffle, class_weight, initial_epoch, epochs, seed,
                         targets=not own and flavor.takes_targets(model), queue=queue)
    sources: dict = {}  # the metric whose result each log of the model's own train_step is
    # one replica in the job: traced as model.fit traces its step, with the batch size its iterator states
    static_rows = batches.static_batch if batches.static_batch and job_replicas(resource_info, parallax_config) == 1 \
        else None
    signature = [None if s is None else with_batch(s, static_rows) for s in batches.signature]
    step_fn = own_train_step(model, signature, batches.has_targets, batches.weighted, sources) if own \
        else _train_step(model, flavor, batches, signature, static_rows)
    executions = Executions.of(model, legacy=not keras_3)  # steps_per_execution: where the batch hooks run
    # Keras 3's count of the step that finds the data exhausted (a step of its own, not one of several)
    exhausted = exhausted_step(model, step_fn, batches.exhausts and executions.size == 1)
    counted = exhausted.counted
    if counted:
        step_fn = counting(step_fn, counted)
    with synchronised_statistics(model, getattr(parallax_config, "sync_batch_norm", False)):
        step, num_workers, worker_id, num_replicas = parallel_run(step_fn, resource_info, sync=sync,
                                                                  parallax_config=parallax_config)
    if worker_id == 0:  # said once a job
        warn_own_fit(model, flavor.module)
        warn_masked_loss(model, num_workers * num_replicas, step.sums_masked_counts)
        if own:
            warn_summed_trackers(model, num_workers * num_replicas)
        warn_uncounted(exhausted)
    for argument, data in (("x", x), ("validation_data", validation_data)):  # read in one order by every worker
        check_ordered(data, num_workers, "parallax.fit", argument)
    step.weighs_parts()  # a batch's parts are padded to one size, the padding weighed 0
    deferred = not own
    if deferred:
        step.defer_sums()  # summed over the workers where the logs are read (BatchLogs) and at each epoch's end
    group = step.session.group or Alone()  # (every worker of a job of several has its group)
    check_restored_alike(group, model, backups)  # a BackupAndRestore's backup read alike by every worker
    use_job(group)  # parallax.evaluate and parallax.predict shard over this job's workers from now on
    batches.split(group, num_workers, worker_id, num_replicas)  # a dataset: each worker reads its share, if it can
    if own and not is_dataset_like(x) and steps_per_epoch is None:  # arrays: every batch's size known before a step
        size, n = batch_size or 32, len(tf.nest.flatten(x)[0])
        for examples in {min(size, n), n % size or min(size, n)}:
            check_even(examples, num_workers * num_replicas)
    chief = worker_id == 0
    kept = chief_or_shared(callbacks, flavor, chief)
    steps = batches.steps
    callback_list = flavor.callbacks.CallbackList(
        kept, add_history=True, add_progbar=chief and verbose != 0, model=model,
        verbose=1 if verbose == "auto" else verbose, epochs=epochs, steps=steps)
    model.stop_training = False
    for variable in metric_state(model):  # the host's own
        step.unwatch(variable)
    edits = HostEdits(step, group)  # what the callbacks set, carried into the job (parallax.tf2.host_edits)
    scalars = step.set_between_steps
    step.leave_edits()
    callback_list.on_train_begin()
    edits.carry("on_train_begin")
    if keras_3:  # as Keras 3's model.fit: the epoch a callback restored (BackupAndRestore) goes first
        initial_epoch = getattr(model, "_initial_epoch", None) or initial_epoch
    reach = CallbackReach.of(callbacks or [], flavor)  # the program's list: alike on every worker
    sets_in_epochs = scalars and reach.sets
    # between epochs only contained hooks run (a timer) and nothing set a variable within: the model's variables
    # need the trained values only where something reads them (a validation, the end of training)
    quiet_between = not reach.sets and not reach.between_epochs and not counted
    flush = step.flush_sums if deferred else None  # the metrics summed over the workers
    batch_logs = BatchLogs(model, reads_logs(kept, flavor, ENDS), chief and verbose != 0, steps, flush=flush,
                           workers=num_workers, read_alike=reach.reads or verbose != 0)
    logs: dict = {}
    validating: FitBatches | None = None
    inputs = whole = None  # a training batch's inputs; whether the validation evaluates whole batches in turn
    behind_host = False  # the model's variables are behind the job's (quiet_between)
    behind = 0  # the optimizer steps model.fit counted that the job has not (parallax.tf2.exhausted)

    def begin_execution(index: int) -> None:
        callback_list.on_train_batch_begin(index)
        if sets_in_epochs:  # a scalar a batch's callback set (the learning rate, a loss's weight, annealed)
            edits.carry("on_train_batch_end or on_train_batch_begin", scalars)

    def end_execution(index: int, last: dict | None) -> bool:
        """The hooks after batch ``index``, the last of its execution (``last``: the logs of the model's own
        ``train_step``); whether a callback stopped the training (on any worker: a worker that went on would
        wait)."""
        at = executions.end_index(index, batches.epoch_steps)
        if own:
            callback_list.on_train_batch_end(at, last)
        else:
            # a batch hook that may read the weights, or a ModelCheckpoint(save_freq=<batches>) that saves after
            # this batch (on worker 0), gets the weights trained so far: every worker brings them into the model
            # (zero_stage's slots are gathered by all)
            if reach.weighs or reach.saves and group.any(chief and saves_after(kept, at)):
                _sync(step, model, look=reach.sets)
            callback_list.on_train_batch_end(at, batch_logs.after(index))
        if reach.stops and group.any(bool(model.stop_training)):
            model.stop_training = True
            return True
        return False

    for epoch, epoch_batches in batches.epochs(initial_epoch, epochs):
        ran_out = True  # the epoch's data ran out (no callback stopped it within)
        model.reset_metrics()
        last = None  # the logs of the epoch's last step of the model's own train_step
        if deferred:  # the job's copies too: each step adds to zero, as model.fit's does
            step.restart_sums()
        callback_list.on_epoch_begin(epoch)
        if epoch == initial_epoch or not quiet_between:
            edits.carry("on_epoch_begin" if epoch == initial_epoch else "on_epoch_end or on_epoch_begin")
        pending = None  # the batch that ended the epoch's data within an execution (its end hooks still to run)
        trained = 0
        for index, (batch, examples) in enumerate(epoch_batches):  # examples: where batch is this worker's share
            if index == 0 and num_workers > 1 and not batches.share:
                check_same(group, batch, epoch)
            if index == 0:
                inputs = batch[0]  # the validation's way is decided on such inputs (evaluated_whole)
            if executions.begins(index):  # steps_per_execution: the hooks around each execution's batches only
                begin_execution(index)
            count = [[np.int64(behind)] * num_replicas] if counted else []  # counting's argument
            behind = 0
            epoch_batches.running()  # the next batch is drawn while the step runs, not beside the work between steps
            if own:
                last = _own_step(step, batch, num_workers, worker_id, num_replicas, examples, count)
            else:
                _one_step(step, batch, num_workers, worker_id, num_replicas, examples, count)
            pending, trained = index, index + 1
            if executions.ends(index, batches.epoch_steps):
                pending = None
                if end_execution(index, last):  # a callback stopped it: as model.fit, after this execution
                    ran_out = False
                    break
        epoch_batches.close()  # the thread drawing ahead ends here, also when training stopped within the epoch
        if pending is not None and end_execution(pending, last):
            ran_out = False
        if ran_out and batches.exhausts:  # as model.fit, the execution that finds the data exhausted
            begin_execution(executions.after(trained))
        if flush:  # what the steps added since the last flush, summed over the workers
            flush()
        logs = numbers(model.get_metrics_result())
        if own:  # as model.fit: the last step's logs where they name other than the metrics
            logs = epoch_logs(group, logs, last, sources)
        validates = validation_data is not None and (epoch + 1) % validation_freq == 0
        behind_host = quiet_between and not validates
        if not behind_host:  # the callbacks and the validation see the trained weights (and the watch agrees)
            _sync(step, model, look=reach.sets)
        if counted and ran_out:  # as model.fit's step that found the data exhausted; the job's next
            for iterations in counted:
                iterations.assign_add(1)
            behind = 1
            edits.agree()
        if validates:
            if validating is None:  # as model.fit: that Keras's own iterator, made at the first validation, kept
                validating = FitBatches(flavor.module.__name__.split(".")[0], model, *_triple(validation_data),
                                        validation_batch_size or batch_size, validation_steps, False, None, 0, 1, seed,
                                        targets=False, queue=queue)
                # decided on each worker's own inputs, which every worker takes (a split reads collectively)
                whole = None if inputs is None else group.any(evaluated_whole(model, flavor, group, inputs))
                if whole is False:  # each worker evaluates its part of every batch: it may read only that
                    validating.split(group, num_workers, worker_id, 1)
            val = evaluate_on(model, flavor, group, validating.one_epoch(), callback_list, whole)
            logs.update({f"val_{k}": v for k, v in val.items()})
        callback_list.on_epoch_end(epoch, logs)
        if group.any(bool(model.stop_training)):
            model.stop_training = True
        if model.stop_training:
            break
    if behind_host:  # every worker alike: zero_stage's slots are gathered by all
        _sync(step, model, look=False)
    # the model has the trained weights since the last epoch's end: what a callback set since then stays
    step.close(write_back=False)
    if getattr(model.optimizer, "finalize_variable_values", None) is not None and epochs > 0:
        model.optimizer.finalize_variable_values(model.trainable_weights)  # as model.fit: an EMA into the weights
    callback_list.on_train_end(logs)
    history = model.history
    history.num_workers, history.worker_id, history.num_replicas = num_workers, worker_id, num_replicas
    return history


def _one_step(step: Any, batch: tuple, num_workers: int, worker_id: int, num_replicas: int,
              examples: int | None = None, count: list = ()) -> None:
    """One step of ``parallax.fit``'s own step on this worker's parts of ``batch`` (padded to split evenly):
    ``batch`` the global batch, or, where this worker reads only its share of the data, its block of a global batch
    of ``examples``; ``count``: :func:`parallax.tf2.exhausted.counting`'s argument. The step updates the compiled
    metrics itself (summed over the workers where they are read, :mod:`parallax.tf2.summed`)."""
    fed, size, examples = worker_block(batch, num_workers, worker_id, num_replicas, examples)
    mine = [parts(a, 1, 0, num_replicas) for a in fed]  # a part per replica each
    share = np.float32(examples / (num_workers * num_replicas))
    first = worker_id * num_replicas  # this worker's parts: their starts, and their examples (the rest: padding)
    starts = [(first + k) * size for k in range(num_replicas)]
    real = [np.int32(block_rows(examples, num_workers * num_replicas, first + k)) for k in range(num_replicas)]
    step(*[per_leaf(m, a) for m, a in zip(mine, fed) if a is not None], [share] * num_replicas, real,
         [np.float32(examples)] * num_replicas, [np.int32(at) for at in starts], *count)


def _train_step(model: Any, flavor: Flavor, batches: FitBatches, signature: list, rows_known: int | None) -> Any:
    """The model's ``train_step`` for one replica, its compiled metrics updated as ``model.fit``'s step updates them
    (on the part's real examples): it returns the loss and the metrics' state after the update. It takes
    ``(x, y, sample_weight)`` (:func:`parallax.tf2.batch_parts.even_parts` makes the weights) of ``signature``'s
    specs; ``rows_known``: the rows of every part, where the step is traced with them (one replica: ``model.fit``'s
    static batch size)."""

    summed = sums_over_batch(model)

    def step(x, y, sample_weight, share, real, examples, start):
        # the part's real examples (a part of padding only: one row, whose loss counts for nothing)
        x, y, sample_weight = rows(tf.maximum(real, 1), (x, y, sample_weight))
        if rows_known:  # every row real: the static size model.fit's trace has (checked as the step runs)
            x, y, sample_weight = tf.nest.map_structure(
                lambda t: None if t is None else tf.ensure_shape(t, [rows_known, *t.shape[1:]]), (x, y, sample_weight))
        mark_part(examples, start, tf.shape(tf.nest.flatten(x)[0])[0])  # its random draws: one device's rows
        with tf.GradientTape() as tape:
            prediction = model(x, training=True)
            if not batches.weighted:  # Parallax's own weights (ones, 0 for padding): over every loss of an example
                sample_weight = per_example(sample_weight, prediction)
            weighed = summed_weights(sample_weight, examples, x) if summed else sample_weight
            loss = flavor.part_loss(model, x, y, prediction, weighed, counts(real, share))
            # a sum over the part's examples (keras-io's CTC layer's add_loss): weighed as the batch's sum
            loss = part_loss(with_added_sums(loss, flavor.added_per_example(model), examples, x), real, share)
            scaled = flavor.scaled(model, loss)  # as that Keras's step: a loss scale (mixed precision) applied
        flavor.apply(model, tape, scaled)
        cut = functools.partial(rows, real)  # the part's real examples (a padded batch's padding cut off)
        flavor.update_metrics(model, cut(x), cut(y), cut(prediction), cut(sample_weight) if batches.weighted else None,
                              loss, share)
        # their state after the update, fetched with the step (parallax.tf2.summed: no second run to read it)
        return loss, flavor.metric_values(model)

    def without_targets(x, sample_weight, share, real, examples, start):  # a model whose loss is its own (add_loss)
        return step(x, None, sample_weight, share, real, examples, start)

    scalar, index = tf.TensorSpec([], tf.float32), tf.TensorSpec([], tf.int32)
    x_spec, y_spec, w_spec = signature
    rest = [w_spec, scalar, index, scalar, index]
    if not batches.has_targets:
        return tf.function(without_targets, input_signature=[x_spec, *rest])
    return tf.function(step, input_signature=[x_spec, y_spec, *rest])


def _own_step(step: Any, batch: tuple, num_workers: int, worker_id: int, num_replicas: int,
              examples: int | None = None, count: list = ()) -> dict:
    """One step of the model's own ``train_step`` on this worker's parts of ``batch`` (the global batch, or this
    worker's block of a global batch of ``examples``); the mean of its replicas' logs (:mod:`parallax.tf2.own_step`)."""
    given = [a for a in batch if a is not None]
    whole = examples is None
    examples = len(tf.nest.flatten(batch[0])[0]) if whole else examples
    check_even(examples, num_workers * num_replicas)
    if whole:
        given = [parts(a, num_workers, worker_id, 1)[0] for a in given]
    mine = [parts(a, 1, 0, num_replicas) for a in given]
    logs = step(*[per_leaf(m, a) for m, a in zip(mine, given)], *count)
    return {k: float(np.mean([np.asarray(part).mean() for part in v])) for k, v in logs.items()}


def _sync(step: Any, model: Any, look: bool = True) -> None:
    """The trained weights into the model's variables; its metrics' states stay the host's (summed over the workers;
    the job's copy of a metric is this worker's own). ``look``: whether a callback may have set a variable within the
    epoch (said at WARNING)."""
    variables = metric_state(model)
    kept = [v.numpy() for v in variables]
    step.sync_variables(whole_slots=True, look=look)  # every worker, at each epoch's end: zero_stage's slots gathered
    for variable, value in zip(variables, kept):
        variable.assign(value)


def _triple(data: Any) -> tuple:
    """``validation_data``: ``(x, y[, sample_weight])``, or a dataset."""
    if isinstance(data, (list, tuple)) and len(data) in (2, 3):
        return (*data, *([None] * (3 - len(data))))
    return (data, None, None)


def split_validation(arrays: tuple, fraction: float) -> tuple[tuple, tuple]:
    """The arrays cut as Keras cuts them for ``validation_split``: the last ``fraction`` of the examples (before
    any shuffle) for validation, the rest for training (``None`` stays ``None``).

    >>> split_validation((np.arange(10), None), 0.25)
    ((array([0, 1, 2, 3, 4, 5, 6]), None), (array([7, 8, 9]), None))
    """
    if not 0 < fraction < 1:
        raise ValueError(f"parallax.fit: validation_split must be between 0 and 1, got {fraction}")
    n = len(tf.nest.flatten(arrays[0])[0])
    at = int(np.floor(n * (1.0 - fraction)))
    if at == 0 or at == n:
        raise ValueError(f"parallax.fit: validation_split={fraction} of {n} examples leaves no examples to "
                         f"{'train on' if at == 0 else 'validate on'}")
    cut = [tuple(None if a is None else tf.nest.map_structure(lambda v, sl=sl: np.asarray(v)[sl], a)
                 for a in arrays)
           for sl in (slice(0, at), slice(at, n))]
    return cut[0], cut[1]
