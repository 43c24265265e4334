"""The global batches ``model.fit`` trains on, taken from that Keras's own data handling.

``parallax.fit(model, x, y, ...)`` must train the batches ``model.fit(x, y, ...)`` trains, in the same
order, or its result is another training. So the batches are not cut by Parallax: they come from the
object ``model.fit`` itself iterates, made with the same arguments (:class:`FitBatches`):

* Keras 3: ``TFEpochIterator`` over the data adapter (arrays, with their shuffle: a permutation drawn by
  ``tf.random.shuffle`` inside the adapter's ``tf.data`` pipeline, seeded by ``keras.utils.set_random_seed``;
  ``class_weight``; a ``tf.data.Dataset``; a generator; a ``keras.utils.PyDataset``), iterated as Keras's
  trainer iterates it: one iterator an epoch, or one kept across epochs with ``steps_per_epoch``;
* ``tf_keras``: its ``DataHandler`` (``data_adapter.get_data_handler``), epochs from ``enumerate_epochs``.

Every worker iterates the same batches and takes its replicas' parts of each. Where the program set no
seed (``tf.random.set_seed`` / ``keras.utils.set_random_seed``), the shuffle of arrays is drawn with
``seed`` (every worker alike; a launched job's processes have their generators seeded alike anyway,
:mod:`parallax.member.seeds`); a dataset or generator that yields other batches on other workers (drawn from
the operating system's entropy) is found at the first batch of each epoch and refused (:func:`check_same`).

The shapes of the step's arguments come from the pipeline's ``element_spec``: nothing is drawn from the
user's dataset outside the epochs (an iteration drawn for a peek would shift every later epoch's shuffle).
"""

from __future__ import annotations

import contextlib
import functools
import queue
import threading
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from parallax.comm.group import WorkerGroup
from parallax.logs import log
from parallax.tf2.digest import digest
from parallax.tf2.input_split import Share, share_of

__all__ = ["FitBatches", "check_same", "with_batch"]


class FitBatches:
    """The global batches of each epoch as ``model.fit`` makes them: tuples ``(x, y, sample_weight)``
    of NumPy values (``sample_weight`` ``None`` when there is none).

    Args:
        flavor_name: ``"keras"`` (Keras 3) or ``"tf_keras"``.
        model: the compiled model (``tf_keras``'s data handler reads its ``steps_per_execution``).
        x, y, sample_weight, batch_size, steps_per_epoch, shuffle, class_weight, initial_epoch, epochs:
            as ``model.fit`` takes them.
        seed: the seed of the shuffle where the program set no global seed.
        targets: whether the data must have targets (a model's own ``train_step`` may take inputs alone).
        queue: tf_keras's ``max_queue_size``, ``workers`` and ``use_multiprocessing``, those given
            (:func:`parallax.tf2.arguments.input_queue`).
    """

    def __init__(self, flavor_name: str, model: Any, x: Any, y: Any, sample_weight: Any, batch_size: int | None,
                 steps_per_epoch: int | None, shuffle: Any, class_weight: dict | None, initial_epoch: int,
                 epochs: int, seed: int, targets: bool = True, queue: dict | None = None) -> None:
        self._legacy = flavor_name == "tf_keras"
        self._x, self._steps_per_epoch, self._class_weight = x, steps_per_epoch, class_weight
        self._made = functools.partial(self._make, model=model, y=y, sample_weight=sample_weight,
                                       batch_size=batch_size, steps_per_epoch=steps_per_epoch, shuffle=shuffle,
                                       class_weight=class_weight, initial_epoch=initial_epoch, epochs=epochs,
                                       seed=seed, queue=queue or {})
        spec = self._made(x)
        #: this worker's share of a dataset where it reads only that (:meth:`split`), else ``None``
        self.share: Share | None = None
        x_spec, y_spec, w_spec = _unpack(spec)
        #: whether the data has targets
        self.has_targets = y_spec is not None
        if y_spec is None and targets:
            raise ValueError("parallax.fit: the data yields inputs without targets; give y, or a dataset of "
                             "(inputs, targets) or (inputs, targets, sample_weights)")
        #: the step's arguments: the inputs' and targets' specs (any batch size), and the weights'
        #: whether the data has weights of its own (sample_weight, class_weight, a dataset's third element)
        self.weighted = w_spec is not None
        weights = tf.TensorSpec([None], tf.float32) if w_spec is None else \
            tf.nest.map_structure(lambda s: tf.TensorSpec([None, *s.shape[1:]], tf.float32), w_spec)  # or per step
        self.signature = [_any_batch(x_spec), None if y_spec is None else _any_batch(y_spec), weights]
        #: the rows of every batch where the iterator says it statically (arrays that split into whole batches, a
        #: dataset batched with ``drop_remainder=True``): ``model.fit`` traces its step with that batch size, and
        #: TensorFlow's gradients then divide by constants where a size is known (``Mean``'s by the reduced axes'
        #: length), which TensorFlow's graph optimizer turns into products; else ``None``
        self.static_batch = _static_rows([x_spec, y_spec, w_spec])

    def _make(self, x: Any, *, model: Any, y: Any, sample_weight: Any, batch_size: int | None,
              steps_per_epoch: int | None, shuffle: Any, class_weight: dict | None, initial_epoch: int, epochs: int,
              seed: int, queue: dict) -> Any:
        """That Keras's own iterator over ``x`` (and the other arguments); the element spec of its batches."""
        with _seeded(seed):
            if self._legacy:
                from tf_keras.src.engine import data_adapter

                self._handler = data_adapter.get_data_handler(
                    x=x, y=y, sample_weight=sample_weight, batch_size=batch_size, steps_per_epoch=steps_per_epoch,
                    initial_epoch=initial_epoch, epochs=epochs, shuffle=shuffle, class_weight=class_weight,
                    model=model, steps_per_execution=model._steps_per_execution, **queue)
                self.steps = self._handler.inferred_steps
                _without_autotuning(self._handler, "_dataset")
                return self._handler._dataset.element_spec
            from keras.src.backend.tensorflow.trainer import TFEpochIterator

            self._iterator = TFEpochIterator(
                x=x, y=y, sample_weight=sample_weight, batch_size=batch_size, steps_per_epoch=steps_per_epoch,
                shuffle=shuffle, class_weight=class_weight, distribute_strategy=tf.distribute.get_strategy(),
                steps_per_execution=1)
            self._iterator.reset()
            _without_autotuning(self._iterator, "_distributed_dataset")
            self.steps = self._iterator.num_batches
            return self._iterator._distributed_dataset.element_spec

    def split(self, group: WorkerGroup, num_workers: int, worker_id: int, num_replicas: int) -> None:
        """Where the data is a ``tf.data.Dataset`` of a shape :mod:`parallax.tf2.input_split` divides, iterate only
        this worker's share of it from now on (:attr:`share`); else (said at INFO) every batch whole, as before.
        Every worker decides alike."""
        if num_workers == 1 or not isinstance(self._x, tf.data.Dataset):
            return
        try:
            share = "steps_per_epoch is given" if self._steps_per_epoch else \
                share_of(self._x, num_workers, worker_id, num_replicas)
        except Exception as e:  # a pipeline of parts this reading of tf.data's objects does not know: read whole
            share = f"it could not be divided ({type(e).__name__}: {e})"
        every = group.gather(None if isinstance(share, str) else share.fingerprint)  # every worker, collectively
        if not isinstance(share, str) and (None in every or len(set(every)) > 1):
            share = ("another worker could not divide it, or what comes before its maps (or the variables its "
                     "functions read) differs between the workers")
        if isinstance(share, str):
            log.info("parallax.fit: every worker reads the whole dataset and keeps its part of each batch: %s", share)
            return
        log.info("parallax.fit: each worker reads its share of the dataset (its maps run on 1/%d of the examples)",
                 num_workers)
        self.share = share
        blocks = share.dataset
        if self._class_weight:  # on each block's examples, as Keras maps them over whole batches
            weigh = _class_weighing(self._legacy, self._class_weight)
            blocks = blocks.map(lambda block, examples: (weigh(*block), examples))
        self._made(blocks, class_weight=None)

    def epochs(self, initial_epoch: int, epochs: int) -> Iterator[tuple[int, Iterator[tuple[tuple, int | None]]]]:
        """``(epoch, its batches)`` for each epoch, as ``model.fit``'s loop draws them: each batch ``(batch, the
        examples of the global batch)`` where this worker reads its :attr:`share` (``batch`` its block), else
        ``(batch, None)`` (``batch`` the global batch)."""
        if self._legacy:
            for epoch, iterator in self._handler.enumerate_epochs():
                yield epoch, Ahead(self._sized(self._legacy_epoch(iterator)))
            return
        for epoch in range(initial_epoch, epochs):
            yield epoch, Ahead(self._sized(self._epoch()))

    @property
    def epoch_steps(self) -> int | None:
        """The batches of an epoch as that Keras's iterator knows them now (``None``: not yet; an epoch of data of
        unknown length teaches it)."""
        return self._handler.inferred_steps if self._legacy else self._iterator.num_batches

    @property
    def exhausts(self) -> bool:
        """Whether ``model.fit`` runs its step once more than it trains at the end of each epoch, to find the data
        exhausted: Keras 3's, where the data's length is unknown (a generator, a ``tf.data`` pipeline after
        ``filter()``). It calls ``on_train_batch_begin`` for that step (:mod:`parallax.tf2.executions`), and of one
        batch a call (no ``steps_per_execution``) the step increments ``optimizer.iterations`` (15 after 3 epochs
        of 4 batches, 5 in the first epoch's ``on_epoch_end``), which an optimizer that reads the count (Adam's
        bias correction, a learning-rate schedule) sees from the second epoch on. ``parallax.fit`` does both
        (:mod:`parallax.keras_fit`, :mod:`parallax.tf2.exhausted`)."""
        return not self._legacy and self.steps is None and not self._steps_per_epoch

    def one_epoch(self) -> Iterator[tuple[tuple, int | None]]:
        """The batches of one pass, drawn here (no thread), each as :meth:`epochs` gives it: ``parallax.fit``'s
        validation, each evaluation from this same object, as ``model.fit`` keeps its evaluation iterator across
        epochs (Keras makes the next pass's iterator at the end of each: a dataset that reshuffles, also one the
        training data is taken from, draws its orders in ``model.fit``'s sequence). Keras 3's ``evaluate`` resets
        that iterator first, so a pass of ``validation_steps`` batches of a repeated dataset starts from its
        beginning each time; tf_keras's data handler goes on where the last pass stopped."""
        if self._legacy:
            for _, iterator in self._handler.enumerate_epochs():
                yield from self._sized(self._legacy_epoch(iterator))
            return
        self._iterator.reset()
        yield from self._sized(self._epoch())

    def _sized(self, elements: Iterator[Any]) -> Iterator[tuple[tuple, int | None]]:
        """The iterator's ``elements`` as ``(batch, examples of the global batch or None)`` (see :meth:`epochs`)."""
        for element in elements:
            if self.share is None:
                yield _numpy(element), None
            else:
                block, examples = element
                yield _numpy(block), int(examples)

    def _epoch(self) -> Iterator[tuple]:
        with self._iterator.catch_stop_iteration():
            for _, _, iterator in self._iterator:
                yield next(iterator)

    def _legacy_epoch(self, iterator: Any) -> Iterator[tuple]:
        with self._handler.catch_stop_iteration():
            for _ in self._handler.steps():  # one a model.fit execution (steps_per_execution): its batches each
                for _ in range(self._handler.step_increment + 1):
                    yield next(iterator)


class Ahead:
    """``items`` in their order, each drawn by a thread of its own before it is taken: the next batch is read and
    converted while the step runs (the session lets go of the interpreter), not after it. The thread draws up to
    ``depth`` items ahead; where the consumer says when its step runs (:meth:`running`), it draws the next item
    only then, so that its Python work does not hold the interpreter while the consumer's host work between steps
    needs it. What drawing raises is raised at that item; a consumer that stops early (:meth:`close`, an exception)
    stops the thread after the item it is drawing, and the generator ``items`` is closed in it.

    >>> list(Ahead(iter(range(5))))
    [0, 1, 2, 3, 4]
    """

    _END = object()

    def __init__(self, items: Iterator[Any], depth: int = 2) -> None:
        self._items = items
        self._drawn: queue.Queue = queue.Queue(depth)
        self._stop = threading.Event()
        self._gate: threading.Semaphore | None = None
        self._done = False
        self._thread = threading.Thread(target=self._draw, name="parallax-batches", daemon=True)
        self._thread.start()

    def running(self) -> None:
        """The consumer's step runs now: the thread may draw one more item (from the first call on, it draws an
        item only after each call)."""
        if self._gate is None:
            self._gate = threading.Semaphore(0)
        self._gate.release()

    def _put(self, entry: tuple) -> bool:
        while not self._stop.is_set():
            try:
                self._drawn.put(entry, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def _let(self) -> bool:
        """Wait until the consumer lets the thread draw (or stops); whether to go on."""
        while self._gate is not None and not self._stop.is_set():
            if self._gate.acquire(timeout=0.1):
                return True
        return not self._stop.is_set()

    def _draw(self) -> None:
        try:
            for item in self._items:
                if not self._put((item, None)) or not self._let():
                    return
            self._put((self._END, None))
        except BaseException as error:  # noqa: BLE001 - raised in the consumer, where it belongs
            self._put((self._END, error))
        finally:
            close = getattr(self._items, "close", None)
            if close is not None:
                close()

    def __iter__(self) -> Ahead:
        return self

    def __next__(self) -> Any:
        if self._done:
            raise StopIteration
        item, error = self._drawn.get()
        if item is self._END:
            self.close()
            if error is not None:
                raise error
            raise StopIteration
        return item

    def close(self) -> None:
        """Stop the thread (done at once, unless it is drawing an item) and close ``items``."""
        self._done = True
        self._stop.set()
        self._thread.join(10.0)


def _without_autotuning(iterator: Any, field: str) -> None:
    """The pipeline the iterator draws from (its attribute ``field``: tf_keras's ``DataHandler._dataset``, Keras
    3's ``TFEpochIterator._distributed_dataset``) run without ``tf.data``'s autotuning where nobody asked for it
    (Keras's own over arrays, a dataset whose options leave ``autotune.enabled`` unset). Keras makes a new iterator
    of the pipeline at each epoch's end, and an autotuned iterator's destructor waits, holding the interpreter, until
    its autotuning thread next wakes (0.63 s, 1.27 s, ... after the iterator was made; the period doubles): an epoch of
    0.7 s waited 0.55 s more at its end (docs/benchmarks.md), as ``model.fit``'s own epochs do once they last past
    0.63 s; two workers in step wait for the later of their two pauses. The batches stay the same (autotuning picks
    how many threads and buffers, not what they hold); a map of ``num_parallel_calls=AUTOTUNE`` then runs on a thread
    per core and a prefetch buffer grows as the prefetch needs. A dataset whose options turn autotuning on keeps
    it."""
    dataset = getattr(iterator, field, None)
    if isinstance(dataset, tf.data.Dataset) and dataset.options().autotune.enabled is None:
        setattr(iterator, field, dataset.with_options(untuned()))


def untuned() -> tf.data.Options:
    """Options that turn ``tf.data``'s autotuning off (see :func:`_without_autotuning`)."""
    options = tf.data.Options()
    options.autotune.enabled = False
    return options


def check_same(group: WorkerGroup, batch: tuple, epoch: int) -> None:
    """Refuse batches that differ between the workers (each worker iterates the same pipeline and takes its
    part: an unseeded shuffle would give each worker other examples, and the union would be no batch of
    ``model.fit``'s). Checked on an epoch's first batch: one small all-gather.

    Raises:
        ValueError: naming the epoch and what to change.
    """
    every = group.gather(digest(tf.nest.flatten(batch)))
    if len(set(every)) > 1:
        raise ValueError(
            f"parallax.fit: the workers' data gave different global batches at the start of epoch {epoch} (each "
            "worker reads the whole pipeline and trains its part of each batch, so every worker must read the same "
            "batches): data drawn from the operating system's entropy (np.random.default_rng() without a seed, "
            "tf.random.Generator.from_non_deterministic_state()), or in a job a cluster manager started (the launcher "
            "seeds the processes it starts alike) a Dataset.shuffle, a generator or a PyDataset drawing without a seed "
            "(give it a seed, or call keras.utils.set_random_seed(...) at the program's start), or files "
            "that one worker writes while another reads them (every worker runs the program's data preparation: "
            "keras.utils.get_file(extract=True) into one shared directory rewrites it; prepare the data once, "
            "before the job)")


@contextlib.contextmanager
def _seeded(seed: int) -> Iterator[None]:
    """The global seed ``seed`` while the pipeline is made, if the program set none: the shuffle that Keras's
    adapter builds into it then draws the same permutations on every worker."""
    from tensorflow.python.framework import random_seed

    if random_seed.get_seed(None)[0] is not None:
        yield
        return
    tf.random.set_seed(seed)
    try:
        yield
    finally:
        tf.random.set_seed(None)


def _unpack(data: Any) -> tuple:
    """``(x, y, sample_weight)`` of an element as Keras unpacks it (a tuple of 1 to 3; else ``x`` alone)."""
    if isinstance(data, tuple) and 1 <= len(data) <= 3:
        return (*data, *([None] * (3 - len(data))))
    if isinstance(data, list) and 1 <= len(data) <= 3:  # Keras takes a list of 2 or 3 as (x, y[, w]) too
        return (*data, *([None] * (3 - len(data))))
    return data, None, None


def _class_weighing(legacy: bool, class_weight: dict) -> Any:
    """The function of ``(x, y[, sample_weight])`` the flavor's ``fit`` maps over a dataset given a ``class_weight``."""
    if legacy:
        from tf_keras.src.engine.data_adapter import _make_class_weight_map_fn

        return _make_class_weight_map_fn(class_weight)
    from keras.src.trainers.data_adapters.tf_dataset_adapter import make_class_weight_map_fn

    return make_class_weight_map_fn(class_weight)


def _numpy(data: Any) -> tuple:
    """A batch as NumPy values: ``(x, y, sample_weight or None)``."""
    return tuple(None if a is None else tf.nest.map_structure(_to_numpy, a) for a in _unpack(data))


def _to_numpy(value: Any) -> np.ndarray:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _static_rows(specs: Any) -> int | None:
    """The first dimension every tensor of ``specs`` has, where it is one number; else ``None``."""
    rows = {s.shape[0] if s.shape.rank else None for s in tf.nest.flatten(specs) if s is not None}
    return rows.pop() if len(rows) == 1 and None not in rows else None


def with_batch(spec: Any, rows: int | None) -> Any:
    """``spec`` (a structure of ``tf.TensorSpec``, ``None`` kept) with each tensor's first dimension ``rows``."""
    return tf.nest.map_structure(lambda s: tf.TensorSpec([rows, *s.shape[1:]], s.dtype), spec)


def _any_batch(spec: Any) -> Any:
    """``spec`` with each tensor's first dimension open."""
    return with_batch(spec, None)
