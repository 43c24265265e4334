"""Each worker reads only its share of a ``tf.data`` pipeline of global batches (``parallax.fit(model, dataset)``).

Without this, every worker iterates the whole pipeline and keeps its part of each global batch
(:mod:`parallax.tf2.batches`): N workers do N times the input work of one device. Here a pipeline of the
common shape

    source ... -> map(f) -> ... -> map(g) -> batch(B) [-> prefetch | cache() | with_options]

is rebuilt on each worker so that the per-example maps (the decoding, the augmentation: the input work) run
only on the examples of that worker's block of each global batch:

    source ... -> batch(B) -> map(this worker's block of the batch) -> unbatch -> map(f) -> ... -> map(g)
      -> batch(B / N) [-> the same tail]

each step's block coming with the size of the global batch it is cut from: from the epoch's length where it is
known; else each example carries it through the maps, so that the short last batch of a pipeline whose length is
not known before iterating (files read by a ``TFRecordDataset``, a ``filter``) is cut alike on every worker as it
arrives. A worker the short last batch leaves no example gets that batch's first one as padding (weighing 0), so
that every worker has a block at every step.

Maps of whole batches after ``batch(B)`` that work row by row (:func:`parallax.analysis.row_wise.row_wise`: a
cast, a rescaling, a lookup, a crop of each image, text vectorized to a fixed length), and the prefetches between
them, are applied after ``batch(B / N)``, to the worker's block: the rows the map would give it in the whole batch.

Global batch ``k`` is the examples ``k*B ... k*B + B - 1`` of what the maps are applied to, as on one device;
worker ``w`` keeps the block ``parallax.fit`` gives it from that batch (:func:`parallax.tf2.batch_parts.parts`: the
batch cut in ``N * replicas`` equal parts, worker ``w`` taking parts ``w * replicas`` on; the last, short batch
as :func:`~parallax.tf2.batch_parts.block_parts` cuts it). So each step's union is the batch ``model.fit`` trains,
and every replica trains the same examples as when each worker read everything: the result is the same.

What is before the maps (the source, a shuffle, a cache, a filter) still runs whole on every worker: it is
cheap (slices, file names) where the maps are not, and it must give every worker the same order. That is
checked: the prefix's graph (its data, seeds and functions), with the values of the variables the pipeline's
functions read (which the graph does not hold: a Keras ``SeedGenerator``'s state), hashed on every worker and
compared when the job starts (:attr:`Share.fingerprint`), and a pipeline that draws without a seed (a ``shuffle``
or a random op with no seed and no global seed) is not split.

Read whole (and said at INFO, with the reason; the training is the same, only the input work is not
divided) when: the pipeline is not of that shape (a ``map`` after ``batch`` that may look across a batch's
examples; ``padded_batch``; ``repeat`` after the maps), it repeats without end before its maps, the global
batch does not split into the replicas' equal parts, a map draws random numbers (its draws would follow each
worker's examples, not the one-device order), or something before the maps draws without a seed.
"""

from __future__ import annotations

import dataclasses
import re
import zlib
from collections.abc import Iterator
from typing import Any

import numpy as np
import tensorflow as tf

from parallax.analysis.row_wise import row_wise
from parallax.graph.graph_ops import STATEFUL_DRAWS, STATELESS_DRAWS
from parallax.tf2.digest import digest

__all__ = ["Share", "share_of"]

#: op types whose output depends on how many values they drew before (a map with one cannot run on a part)
_RANDOM_OPS = STATEFUL_DRAWS | frozenset({
    "ParameterizedTruncatedNormal", "RandomCrop", "RandomGammaGrad", "StatefulUniform", "StatefulUniformInt",
    "StatefulStandardNormalV2", "StatefulTruncatedNormal", "StatefulUniformFullInt", "StatefulRandomBinomial",
    "RngSkip", "RngReadAndSkip", "AnonymousSeedGenerator"})
#: draws whose seed is an input: Keras 3's random layers (``RandomFlip``, ``GaussianNoise``, ...) draw with one a
#: ``SeedGenerator`` moves on at every call, so that a map with one cannot run on a part either; seeded by their
#: input (the generator's state, alike on every worker), they are no draw without a seed
_SEEDED_BY_INPUT = STATELESS_DRAWS


@dataclasses.dataclass(frozen=True)
class Share:
    """A worker's share of a pipeline of global batches.

    Attributes:
        dataset: one element a step, ``(this worker's block of the global batch, the examples of that global
            batch)``; where the last, short batch leaves this worker no example, its block is that batch's
            first example (padding: ``parallax.fit`` weighs it 0, as it weighs the padding of any part).
        fingerprint: a hash of what comes before the maps and of the variables the pipeline's functions read (alike
            on every worker, or their orders or their maps' values differ).
        steps: the global batches of an epoch (also ``dataset.cardinality()``), or ``None`` where the pipeline's
            length is not known before iterating (a file reader, a ``filter``): each global batch's size then
            comes with it, so that the short last one is cut alike on every worker as it arrives.
    """

    dataset: tf.data.Dataset
    fingerprint: int
    steps: int | None


def share_of(dataset: tf.data.Dataset, num_workers: int, worker_id: int, num_replicas: int) -> Share | str:
    """Worker ``worker_id``'s :class:`Share` of ``dataset`` (global batches, as ``parallax.fit`` takes them), or
    why it is read whole (see the module docstring)."""
    tail, batched = _peel_tail(dataset)
    after, batched, mixed = _peel_row_maps(batched)
    if mixed:
        return f"a map() after its batch() may look across a batch's examples: {mixed}"
    if not _is_batch(batched):
        return (f"it does not end in batch() (and maps that work row by row): its last transformation before the "
                f"prefetch is {_name(batched)}")
    batch_size, drop_remainder = _constant(batched._batch_size), bool(_constant(batched._drop_remainder))
    parts = num_workers * num_replicas
    if batch_size % parts:
        return f"its global batch ({batch_size}) does not split into {parts} equal parts"
    maps, prefix = _peel_maps(batched._input_dataset)
    if not maps and not any(map(_is_map, after)):
        return "no map() comes before or after its batch(): there is no input work to divide"
    unseeded = _unseeded(prefix)
    if unseeded:
        return f"{unseeded}: each worker would draw another order"
    examples = int(prefix.cardinality())
    if examples == tf.data.INFINITE_CARDINALITY:
        return "it repeats without end before its maps (Dataset.cardinality(): infinite)"

    known = examples >= 0  # else each example carries the size of its global batch (below)

    def mine(element):  # this worker's block of a global batch of raw examples, cut as fit cuts a batch
        rows = tf.shape(tf.nest.flatten(element)[0])[0]
        size = num_replicas * ((rows + parts - 1) // parts)
        start = tf.minimum(worker_id * size, rows)
        end = tf.minimum(start + size, rows)
        none = start >= end  # the short last batch left this worker none: its first example, as padding
        start, end = tf.where(none, 0, start), tf.where(none, 1, end)
        block = tf.nest.map_structure(lambda t: t[start:end], element)
        return block if known else (block, tf.fill([end - start], tf.cast(rows, tf.int64)))

    # one cut a batch, where the examples are still cheap (a filter would be a call per example)
    whole = isinstance(prefix.element_spec, tuple)  # tf.data calls a map with a tuple's items as arguments
    blocks = prefix.batch(batch_size, drop_remainder=drop_remainder)
    share = blocks.map(lambda *items: mine(items if whole else items[0])).unbatch()
    for ds in reversed(maps):
        share = _map_again(share, ds, sized=not known)
    share = share.batch(batch_size // num_workers)
    for ds in reversed(after):  # each row alone: this worker's block of the batch the map would have made
        if _is_map(ds):
            share = _map_again(share, ds, sized=not known)
        else:
            share = share.prefetch(int(_constant(ds._buffer_size)))
    steps = None
    if known:  # the sizes of an epoch's global batches, known: one a step beside the blocks (cheaper than carried)
        full, rest = divmod(examples, batch_size)
        sizes = [batch_size] * full + ([rest] if rest and not drop_remainder else [])
        steps = len(sizes)
        share = tf.data.Dataset.zip((share, tf.data.Dataset.from_tensor_slices(np.array(sizes, np.int64))))
        # the steps known to Keras's iterator (its progress bar), as the batched dataset told them
        share = share.apply(tf.data.experimental.assert_cardinality(steps))
    else:
        share = share.map(lambda block, rows: (block, rows[0]))
    for again in reversed(tail):
        share = again(share)
    # what every worker must have alike: the prefix's graph, and the state of the variables its functions read
    return Share(share.with_options(dataset.options()), digest([_fingerprint(prefix), *_variables_read(dataset)]),
                 steps)


def _peel_tail(dataset: tf.data.Dataset) -> tuple[list, tf.data.Dataset]:
    """The transformations after the batch that work on whole batches alike on any worker (prefetch, an
    in-memory cache, options), each as a function that applies it again, and the dataset before them."""
    from tensorflow.python.data.ops import cache_op, dataset_ops, prefetch_op

    tail = []
    while True:
        if isinstance(dataset, prefetch_op._PrefetchDataset):
            buffer = int(_constant(dataset._buffer_size))
            tail.append(lambda ds, buffer=buffer: ds.prefetch(buffer))
        elif isinstance(dataset, cache_op.CacheDataset) and _constant(dataset._filename) in (b"", ""):
            tail.append(lambda ds: ds.cache())
        elif not isinstance(dataset, dataset_ops._OptionsDataset):
            return tail, dataset
        dataset = dataset._input_dataset


def _is_batch(dataset: tf.data.Dataset) -> bool:
    from tensorflow.python.data.ops import batch_op

    return isinstance(dataset, (batch_op._BatchDataset, batch_op._ParallelBatchDataset))


def _peel_maps(dataset: tf.data.Dataset) -> tuple[list, tf.data.Dataset]:
    """The per-example maps just before the batch that draw nothing random (the last first), and what is before
    them."""
    maps = []
    while _is_map(dataset) and not _draws(dataset):
        maps.append(dataset)
        dataset = dataset._input_dataset
    return maps, dataset


def _peel_row_maps(dataset: tf.data.Dataset) -> tuple[list, tf.data.Dataset, str]:
    """The maps of whole batches at the end that work row by row and draw nothing, and the prefetches between them
    (``text_dataset_from_directory``'s, before a user's map; the last first), what is before them, and why the map
    before those may look across rows (``""`` where it is not a map)."""
    from tensorflow.python.data.ops import prefetch_op

    maps = []
    while _is_map(dataset) or isinstance(dataset, prefetch_op._PrefetchDataset):
        if not _is_map(dataset):
            maps.append(dataset)
            dataset = dataset._input_dataset
            continue
        graph = dataset._map_func.function.graph
        captured = {t.ref() for t in graph.internal_captures}
        mixed = ("it draws random numbers (its draws would follow each worker's rows, not one device's order)"
                 if _draws(dataset) else
                 row_wise(graph, [t for t in graph.inputs if t.ref() not in captured], graph.outputs))
        if mixed:
            return maps, dataset, mixed
        maps.append(dataset)
        dataset = dataset._input_dataset
    return maps, dataset, ""


def _is_map(dataset: tf.data.Dataset) -> bool:
    from tensorflow.python.data.ops import map_op

    return isinstance(dataset, (map_op._MapDataset, map_op._ParallelMapDataset))


def _map_again(dataset: tf.data.Dataset, like: tf.data.Dataset, sized: bool) -> tf.data.Dataset:
    """``like``'s map, with its parallelism and order, applied to ``dataset``'s examples (``sized``: to the
    examples of its ``(example, the size of its global batch)``)."""
    function = like._map_func._func
    if sized:
        mapped = function

        def function(example, rows):  # the map called as tf.data calls it on the example: a tuple's items as arguments
            return (mapped(*example) if isinstance(example, tuple) else mapped(example)), rows

    parallel = getattr(like, "_num_parallel_calls", None)
    if parallel is None:
        return dataset.map(function)
    deterministic = {"true": True, "false": False}.get(like._deterministic)
    return dataset.map(function, num_parallel_calls=int(_constant(parallel)), deterministic=deterministic)


def _draws(dataset: tf.data.Dataset) -> bool:
    """Whether one of ``dataset``'s own functions has an op that draws random numbers."""
    return any(_random_ops(wrapper.function.graph) for wrapper in dataset._functions())


def _random_ops(graph: Any) -> list:
    """The ops of ``graph`` and of the functions it calls that draw random numbers: ``(type, seed, seed2)``, the
    seeds ``None`` where the seed is an input."""
    found: list[tuple[str, int | None, int | None]] = []
    nodes = [op.node_def for op in graph.get_operations()]
    nodes += [node for function in graph._functions.values() for node in function.cached_definition.node_def]
    for node in nodes:
        if node.op in _SEEDED_BY_INPUT:
            found.append((node.op, None, None))
        elif node.op in _RANDOM_OPS:
            found.append((node.op, *(node.attr[a].i if a in node.attr else 0 for a in ("seed", "seed2"))))
    return found


def _walk(dataset: tf.data.Dataset) -> Iterator[tf.data.Dataset]:
    """``dataset`` and every dataset it is made from, each once, in one order on every worker."""
    seen, todo = set(), [dataset]
    while todo:
        ds = todo.pop()
        if id(ds) not in seen:
            seen.add(id(ds))
            yield ds
            todo.extend(ds._inputs())


def _unseeded(dataset: tf.data.Dataset) -> str:
    """What in ``dataset`` and its inputs draws without a seed (``""`` if nothing)."""
    from tensorflow.python.data.ops import shuffle_op

    for ds in _walk(dataset):
        if isinstance(ds, shuffle_op._ShuffleDataset) and _constant(ds._seed) == 0 and _constant(ds._seed2) == 0:
            return "a Dataset.shuffle without a seed (and no global seed)"
        for wrapper in ds._functions():
            unseeded = [t for t, seed, seed2 in _random_ops(wrapper.function.graph) if seed == 0 and seed2 == 0]
            if unseeded:
                return f"a function of its {_name(ds)} draws random numbers without a seed ({unseeded[0]})"
    return ""


def _variables_read(dataset: tf.data.Dataset) -> list:
    """The values of the variables the functions of ``dataset`` and its inputs read (a Keras ``SeedGenerator``'s
    state, a counter), which the graph does not hold: in a job whose processes are not seeded alike (a cluster
    manager's), an unseeded Keras random layer's state differs between the workers."""
    values = []
    for ds in _walk(dataset):
        for wrapper in ds._functions():
            for handle in wrapper.function.captured_inputs:
                data = getattr(handle, "_handle_data", None)
                if handle.dtype != tf.resource or data is None or not data.is_set or not data.shape_and_type:
                    continue  # not a variable (a lookup table's handle has no type)
                try:
                    values.append(tf.raw_ops.ReadVariableOp(resource=handle, dtype=data.shape_and_type[0].dtype))
                except (tf.errors.OpError, TypeError, ValueError):
                    continue
    return values


def _fingerprint(dataset: tf.data.Dataset) -> int:
    """A hash of ``dataset``'s graph: its data, seeds and functions (not its ops' names)."""
    from tensorflow.core.framework import graph_pb2
    from tensorflow.python.data.ops import options

    graph = graph_pb2.GraphDef.FromString(
        dataset._as_serialized_graph(external_state_policy=options.ExternalStatePolicy.IGNORE).numpy())
    # names numbered by what this process made before: the datasets', the functions', the resources'
    for function in graph.library.function:
        function.signature.name = _unnumbered(function.signature.name)
    for node in [*graph.node, *(n for f in graph.library.function for n in f.node_def)]:
        node.attr.pop("metadata", None)
        for value in node.attr.values():
            for function in [*([value.func] if value.HasField("func") else []), *value.list.func]:
                function.name = _unnumbered(function.name)
            for handle in value.tensor.resource_handle_val:
                handle.name = _unnumbered(handle.name)
    functions = sorted(graph.library.function, key=lambda f: f.SerializeToString(deterministic=True))
    del graph.library.function[:]  # listed in the order of their numbered names
    graph.library.function.extend(functions)
    return zlib.crc32(graph.SerializeToString(deterministic=True))


def _unnumbered(name: str) -> str:
    """``name`` without the number its process gave it.

    >>> _unnumbered("__inference_Dataset_map_lambda_120")
    '__inference_Dataset_map_lambda'
    """
    return re.sub(r"_\d+$", "", name)


def _constant(value: Any) -> Any:
    return value.numpy() if hasattr(value, "numpy") else np.asarray(value)


def _name(dataset: tf.data.Dataset) -> str:
    return type(dataset).__name__.lstrip("_").replace("Dataset", "") or type(dataset).__name__
