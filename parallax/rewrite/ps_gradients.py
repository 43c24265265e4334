"""The gradients' way to the parameter servers, under synchronous PS training.

Called by :func:`parallax.rewrite.ps_sync.add_ps_sync` for each training op:
which of a worker's gradients it sends (:func:`gradient_senders`), its pushes
of them (``apply``) to a ``ConditionalAccumulator`` per dense variable, a
``FIFOQueue`` of rows per sparse one, or, packed, one accumulator per group
of small dense gradients (:func:`push_groups`), each push compressed on the
way (:func:`compressed_push`); and the chief's ``take`` of the sums, which
its update then reads (:func:`push_and_take`). The names and devices are in
:mod:`parallax.rewrite.ps_sync`'s docstring.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable

import tensorflow as tf

from parallax.comm.compression import decompress, for_push
from parallax.comm.packing import elements, pack, packed_groups, static_nbytes, unpack
from parallax.graph.graph_ops import parse_input
from parallax.graph.names import aggregate_outputs, variable_sync_scope
from parallax.plan.model import Plan, TaskSpec, VariablePlacement

__all__ = ["gradient_senders", "gradients_sent", "compressed_push", "push_and_take", "take_rows", "push_groups",
           "PACKED"]

PACKED = "packed_"  # the scope of a packed accumulator, under the training op's sync scope
_COMPRESS = "compress_"  # the scope of a push's compression, on the worker, under the training op's sync scope
_ALWAYS_FRESH = 2 ** 62  # local_step that is never stale: the token protocol keeps workers in step


def gradient_senders(plan: Plan, task: TaskSpec, variables: list[VariablePlacement]
                     ) -> tuple[list[int | None], int, list[str]]:
    """Who sends gradients: one per host (host aggregation), per worker (local aggregation) or per replica.

    Returns this worker's senders (``None``: its replicas' sum; else each replica), how many gradients of
    each variable the chief takes, and the gradients this worker computes but does not send (its host's
    leader does), as control inputs."""
    worker = plan.workers[task.worker_index]
    listen: list[str] = []
    if plan.ps.host_aggregation:
        hosts = list(dict.fromkeys(w.host for w in plan.workers))
        leader = next(i for i, w in enumerate(plan.workers) if w.host == worker.host) == task.worker_index
        senders = [None] if leader else []
        required = len(hosts)
        if not leader:
            listen = [f"^{parse_input(t)[0]}" for v in variables for t in aggregate_outputs(v.name, v.sparse)]
    elif plan.ps.local_aggregation:
        senders, required = [None], plan.num_workers
    else:
        senders, required = list(range(len(worker.replica_devices))), plan.num_replicas
    return senders, required, listen


def gradients_sent(variables: list[VariablePlacement], senders: list[int | None]
                   ) -> tuple[list[str], list[tf.DType]]:
    """The tensors this worker sends, each variable's from each sender (a sparse one's values and indices),
    with their dtypes."""
    names: list[str] = []
    dtypes: list[tf.DType] = []
    for v in variables:
        for sender in senders:
            names.extend(aggregate_outputs(v.name, v.sparse, sender))
            dtypes.append(tf.dtypes.as_dtype(v.gradient.dtype))
            if v.sparse:
                dtypes.append(tf.dtypes.as_dtype(v.gradient.indices_dtype))
    return names, dtypes


def compressed_push(step_scope: str, compression: str) -> Callable[[tf.Tensor], tf.Tensor]:
    """What a push sends (``compress_<k>``, numbered in the order of the pushes)."""
    pushes = itertools.count()

    def sent(tensor: tf.Tensor) -> tf.Tensor:
        """``tensor`` compressed on the worker (``CommSpec.compression``) and decompressed in the caller's
        scope, on the server: what crosses between them is the compressed tensor."""
        with tf.name_scope(f"{step_scope}{_COMPRESS}{next(pushes)}/"):
            wire, scale = for_push(tensor, compression)
        return decompress(wire, tensor.dtype, scale)

    return sent


def push_and_take(inputs: list[tf.Tensor], variables: list[VariablePlacement], senders: list[int | None],
                   required: int, packed: list[list[VariablePlacement]], step_scope: str, chief: bool,
                   sent: Callable[[tf.Tensor], tf.Tensor]
                   ) -> tuple[list[tf.Operation], dict[str, list[tf.Tensor]]]:
    """Each gradient of ``inputs`` (:func:`gradients_sent`) pushed, ``sent``, to its variable's accumulator
    (a sparse one's rows to its queue; the ``packed`` ones, packed, to their group's accumulator) and, on the
    chief, the take of the ``required`` gradients' sum, after this worker's own pushes of it.

    Returns the pushes (``apply``) and the chief's takes, by variable (a sparse one's values and indices)."""
    applies, takes = [], {}
    position = 0
    in_a_pack = {v.name for group in packed for v in group}
    pushed: dict[str, list[tf.Tensor]] = {}  # a packed variable's gradient from each sender
    for v in variables:
        scope = variable_sync_scope(v.name)
        if v.name in in_a_pack:
            pushed[v.name] = inputs[position:position + len(senders)]
            position += len(senders)
            continue
        with tf.name_scope(scope):
            dtype = tf.dtypes.as_dtype(v.gradient.dtype)
            shape = tf.TensorShape([d for d in v.gradient_shape])
            if v.sparse:
                mine = []
                rows = tf.queue.FIFOQueue(-1, [dtype, tf.dtypes.as_dtype(v.gradient.indices_dtype)],
                                          shared_name=f"{scope}rows", name="rows")
                for _ in senders:
                    values, indices = sent(inputs[position]), inputs[position + 1]
                    position += 2
                    mine.append(rows.enqueue([values, indices], name="apply"))
                applies.extend(mine)
                if chief:  # after this worker's own gradients of this variable
                    with tf.control_dependencies(mine):
                        takes[v.name] = take_rows(rows, required, shape)
            else:
                acc = tf.compat.v1.ConditionalAccumulator(
                    dtype, shape=shape, shared_name=f"{scope}accumulator", name="accumulator",
                    reduction_type="SUM")
                mine = []
                for _ in senders:
                    grad = sent(inputs[position])
                    position += 1
                    mine.append(acc.apply_grad(grad, local_step=_ALWAYS_FRESH, name="apply"))
                applies.extend(mine)
                if chief:  # after this worker's own gradients of this variable
                    with tf.control_dependencies(mine):
                        takes[v.name] = [acc.take_grad(required, name="take")]
    for k, group in enumerate(packed):
        dtype = tf.dtypes.as_dtype(group[0].gradient.dtype)
        shapes = [[int(d) for d in v.gradient_shape] for v in group]
        buffers = [pack([pushed[v.name][i] for v in group], name=f"{step_scope}pack_{k}_{i}")
                   for i in range(len(senders))]
        scope = f"{step_scope}{PACKED}{k}/"
        with tf.name_scope(scope):
            acc = tf.compat.v1.ConditionalAccumulator(
                dtype, shape=[sum(elements(s) for s in shapes)], shared_name=f"{scope}accumulator",
                name="accumulator", reduction_type="SUM")
            mine = [acc.apply_grad(sent(b), local_step=_ALWAYS_FRESH, name="apply") for b in buffers]
            applies.extend(mine)
            if chief:
                with tf.control_dependencies(mine):
                    summed = acc.take_grad(required, name="take")
                for v, piece in zip(group, unpack(summed, shapes, name="unpack")):
                    takes[v.name] = [piece]
    return applies, takes


def take_rows(rows: tf.queue.FIFOQueue, required: int, shape: tf.TensorShape) -> list[tf.Tensor]:
    """The chief's take of a sparse gradient: the ``required`` senders' rows, one after the other
    (``take_<i>``), as one gradient ``[values, indices]`` (``take_values``, ``take``). Rows of equal
    index stay separate, as in a single device's gradient of the union batch: the update sums them
    (TensorFlow's sparse updates do). Linear in the rows, where a ``SparseConditionalAccumulator``
    copies every row it holds at each apply (quadratic in the senders; docs/benchmarks.md)."""
    taken = [rows.dequeue(name=f"take_{i}") for i in range(required)]
    values = [tf.ensure_shape(t[0], [None] + shape.as_list()[1:]) for t in taken]
    return [tf.concat(values, 0, name="take_values"), tf.concat([t[1] for t in taken], 0, name="take")]


def push_groups(variables: list[VariablePlacement], server_of: dict[str, str]
                ) -> tuple[list[list[VariablePlacement]], list[VariablePlacement]]:
    """The dense gradients each worker pushes packed into one buffer (:mod:`parallax.comm.packing`):
    small ones of the same dtype bound for the same server, in plan order; and the rest."""
    dense = [v for v in variables if not v.sparse]
    packed, alone = packed_groups(
        dense, key=lambda v: (server_of[v.name], v.gradient.dtype),
        nbytes=lambda v: static_nbytes(v.gradient_shape, v.gradient.dtype))
    return packed, alone + [v for v in variables if v.sparse]
