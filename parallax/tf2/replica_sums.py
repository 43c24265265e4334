"""Sums over the replicas that a step asks for itself: synchronised batch statistics.

A Keras ``BatchNormalization(synchronized=True)`` (Keras 3's and tf_keras's) computes the
statistics of the whole batch across replicas: each replica sums its part (its examples, their
squares, their count), ``tf.distribute.get_replica_context().all_reduce(SUM, ...)`` adds the sums
of every replica, and the gradient of that sum is again a sum over the replicas (TensorFlow's
custom gradient of ``all_reduce``). Traced on one device, in the default replica context, each of
these sums is an ``IdentityN`` op: the sum over one replica. Parallax makes each a sum over every
replica of the job (:mod:`parallax.rewrite.aggregate`), so that every replica normalises by the
union batch's statistics, and the gradients are those of one device.

They are found where they are made, by the Python frames TensorFlow keeps with each op of a
traced function (:func:`replica_sums`): an ``IdentityN`` made by ``all_reduce`` called from a
batch normalisation's synchronised moments (forward), or from ``all_reduce``'s own gradient
(backward). The same ``all_reduce`` that an optimizer calls on the gradients stays as traced:
Parallax aggregates the gradients itself. Any other ``all_reduce`` that is differentiated would be
summed in its backward pass and not in its forward one: refused.

The names go to the graph's :data:`REPLICA_SUMS` collection, in the order the trace made them
(an order of the graph: every worker issues the sums in it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from parallax.errors import AnalysisError

__all__ = ["replica_sums", "STATISTICS_CALLERS", "synchronised_statistics"]

#: The functions of Keras 3 and tf_keras whose ``all_reduce`` sums a batch normalisation's statistics.
STATISTICS_CALLERS = frozenset({"_compute_moments_sync", "_sync_calculate_mean_and_var"})


def replica_sums(graph: Any) -> list[str]:
    """The ``IdentityN`` ops of ``graph`` (a traced function's graph) that stand for sums over the replicas,
    in the order they were made (see the module docstring).

    Raises:
        AnalysisError: a step differentiates an ``all_reduce`` that no batch normalisation called.
    """
    sums, other = [], []  # in the graph's order, forward and backward
    forward = backward = 0
    for op in graph.get_operations():
        if op.type != "IdentityN":
            continue
        caller = _all_reduce_caller(op.traceback)
        if caller is None:
            continue
        if caller.name in STATISTICS_CALLERS:
            forward += 1
        elif caller.name == "<lambda>" and caller.filename.endswith("distribute_lib.py"):
            backward += 1
        else:
            other.append(caller)
            continue
        half = len(op.inputs) // 2
        if len(op.inputs) % 2 or any(op.inputs[i].name != op.inputs[half + i].name for i in range(half)):
            raise AnalysisError(f"{op.name}: an all_reduce of the default replica context that is not the identity "
                                "Parallax knows (its results are not its inputs); please report it")
        sums.append(op.name)
    if backward > forward:
        called = ", ".join(sorted({f"{f.name} ({f.filename}:{f.lineno})" for f in other})) or "an unknown caller"
        raise AnalysisError(f"the step differentiates tf.distribute's all_reduce called from {called}: Parallax "
                            "sums over the replicas only a batch normalisation's synchronised statistics "
                            "(BatchNormalization(synchronized=True)); sum across replicas otherwise outside the "
                            "step, or make it a Keras metric")
    return sums


def _all_reduce_caller(traceback: Any) -> Any:
    """The frame that called ``ReplicaContext.all_reduce`` in ``traceback`` (innermost last), or ``None``."""
    frames = list(traceback)
    for k in range(len(frames) - 1, 0, -1):
        if frames[k].name == "all_reduce" and frames[k].filename.endswith("distribute_lib.py"):
            return frames[k - 1]
    return None


@contextlib.contextmanager
def synchronised_statistics(model: Any, every: bool) -> Iterator[None]:
    """With ``every`` (``Config.sync_batch_norm``), each batch normalisation of ``model`` (Keras 3's, tf_keras's)
    asks for synchronised statistics while the block traces its step, as ``synchronized=True`` would (a tf_keras
    layer then computes them unfused, as it does when built so); each layer as it was after."""
    layers = [layer for layer in model._flatten_layers() if hasattr(layer, "synchronized")
              and type(layer).__name__.startswith("BatchNormalization")] if every else []
    kept = [(layer.synchronized, getattr(layer, "fused", None)) for layer in layers]
    try:
        for layer in layers:
            layer.synchronized = True
            if getattr(layer, "fused", None):
                layer.fused = False
        yield
    finally:
        for layer, (synchronized, fused) in zip(layers, kept):
            layer.synchronized = synchronized
            if fused is not None:
                layer.fused = fused
