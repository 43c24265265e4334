"""What the analysis finds: plain data on a single-device graph's variables, their gradients and its forward
pass."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import tensorflow as tf

__all__ = ["VariableInfo", "GradientInfo", "ForwardOp", "GraphAnalysis", "is_summed"]


@dataclass(frozen=True)
class VariableInfo:
    """A variable of the single-device graph.

    Attributes:
        name: the variable's op name, e.g. ``dense/kernel``.
        shape: its static shape (``None`` entries for unknown dimensions).
        dtype: its dtype name, e.g. ``float32``.
        trainable: whether it is in the ``trainable_variables`` collection.
        resource: resource variable (``VarHandleOp``) or ref variable.
        colocate_with: the variable this one must live with (an optimizer
            slot's primary variable), from the op's colocation attribute.
        slot_of: the variable this one is an optimizer slot of (Adam's ``m``,
            Adagrad's accumulator): colocated with it and read by its update
            alone. Found through the update ops, never by name, since an
            optimizer built inside a variable scope names the slots of
            ``model/emb`` ``model/model/emb/Adagrad``. Non-slot state shared by
            several updates (Adam's ``beta1_power``) is no slot.
        summed: synchronised on read with aggregation ``SUM`` (a Keras metric's state, as
            :mod:`parallax.tf2.trace` makes it): each worker keeps its own copy, in every mode.
    """

    name: str
    shape: tuple[int | None, ...]
    dtype: str
    trainable: bool
    resource: bool
    colocate_with: str | None = None
    slot_of: str | None = None
    summed: bool = False

    @property
    def num_bytes(self) -> int:
        """Size in bytes (unknown dimensions count as 1)."""
        n = tf.dtypes.as_dtype(self.dtype).size
        for d in self.shape:
            n *= d or 1
        return n


@dataclass(frozen=True)
class GradientInfo:
    """The gradient that updates one variable.

    Attributes:
        variable: the variable's op name.
        sparse: whether the gradient is an ``IndexedSlices``.
        tensor: the dense gradient tensor's name, or the sparse one's values.
        indices: the sparse gradient's indices tensor name (``None`` if dense).
        dtype: the gradient's dtype name.
        indices_dtype: the sparse gradient's indices dtype name.
        raw_tensor, raw_indices: the output of ``tf.gradients`` that ``tensor``
            and ``indices`` are computed from, when other ops (clipping,
            scaling) stand between them; ``None`` otherwise.
        update_ops: names of the ops in the variable's update scope.
        indices_count: the number of indices a sparse gradient has per replica
            and step, when the graph's static shapes say it (an upper bound on
            the rows it touches); ``None`` when unknown or dense.
        coupled_with: the other variables whose raw gradients feed this one's
            update (``clip_by_global_norm`` couples every variable it clips).
        repeats_merged: a sparse gradient's values go straight into the update,
            whose only use of them is to sum the rows of repeated indices
            (``UnsortedSegmentSum``: what TensorFlow's optimizers do first), so
            summing those rows before sending them changes nothing.
        densified: a sparse gradient the update first makes whole (Keras 3's optimizers sum its rows into a
            tensor of the variable's shape, ``UnsortedSegmentSum``, and update every element): so its update is
            element-wise over the variable, as a dense gradient's (``zero_stage`` may cut it into parts).
        shape: the dense gradient's static shape where it is not the variable's:
            the values of a gather's gradient whose indices every replica computes
            alike (positions looked up with a range, a constant row list), which
            Parallax aggregates as a dense tensor, elementwise, so that its rows are
            those one device computes over the union batch (:func:`_shared_rows`).
    """

    variable: str
    sparse: bool
    tensor: str
    indices: str | None
    dtype: str
    update_ops: tuple[str, ...]
    indices_dtype: str | None = None
    raw_tensor: str | None = None
    raw_indices: str | None = None
    indices_count: int | None = None
    coupled_with: tuple[str, ...] = ()
    repeats_merged: bool = False
    shape: tuple[int, ...] | None = None
    densified: bool = False

    @property
    def aggregation_tensors(self) -> tuple[str, str | None]:
        """Where the replicas' gradients are aggregated: the raw output of
        ``tf.gradients`` when ops (e.g. clipping) stand between it and the
        update, so that those ops see the aggregated gradient; else the
        update's own input."""
        return (self.raw_tensor or self.tensor, self.raw_indices or self.indices)

    @property
    def tensors(self) -> tuple[str, ...]:
        """Every tensor that makes up the gradient."""
        return (self.tensor,) if self.indices is None else (self.tensor, self.indices)


@dataclass(frozen=True)
class ForwardOp:
    """An op of the forward pass (an ancestor of the gradients outside ``gradients`` scopes),
    for cutting the model into pipeline stages (:mod:`parallax.plan.stages`).

    Attributes:
        name: the op's name.
        cost: its estimated cost: 1, plus the elements of each variable it computes with (a
            ``MatMul`` with a kernel), or a row of it for a gather of rows (an embedding lookup).
        reads: the variables it reads, directly or through a read op.
    """

    name: str
    cost: int
    reads: tuple[str, ...] = ()


@dataclass(frozen=True)
class GraphAnalysis:
    """What the rewrite needs to know about the single-device graph.

    Attributes:
        variables: every variable, sorted by name.
        gradients: the gradient of every variable an optimizer updates, sorted
            by variable name.
        train_ops: names of the training ops (none in a forward-only graph).
        forward: the forward pass's ops in the order they were made (the layers' order).
        batch_statistics: the layers that normalise by their batch's statistics
            (:mod:`parallax.analysis.batch_statistics`).
        after_updates: why a synchronous job cannot aggregate the step at once (a gradient computed after
            another update of the same step, :mod:`parallax.analysis.update_order`); ``""`` when it can.
        replica_sums: the ops that stand for sums over the replicas (synchronised batch statistics,
            :data:`parallax.analysis.batch_statistics.REPLICA_SUMS`), in the graph's order.
    """

    variables: tuple[VariableInfo, ...]
    gradients: tuple[GradientInfo, ...]
    train_ops: tuple[str, ...]
    forward: tuple[ForwardOp, ...] = ()
    batch_statistics: tuple[str, ...] = ()
    after_updates: str = ""
    replica_sums: tuple[str, ...] = ()

    @property
    def forward_only(self) -> bool:
        """No optimizer updates anything: inference or evaluation."""
        return not self.gradients

    def variable(self, name: str) -> VariableInfo:
        """The variable called ``name``; ``KeyError`` if there is none."""
        for v in self.variables:
            if v.name == name:
                return v
        raise KeyError(name)

    def gradient(self, variable: str) -> GradientInfo | None:
        """The gradient of ``variable``, or ``None`` if no optimizer updates it."""
        for g in self.gradients:
            if g.variable == variable:
                return g
        return None

    @property
    def dense(self) -> tuple[GradientInfo, ...]:
        return tuple(g for g in self.gradients if not g.sparse)

    @property
    def sparse(self) -> tuple[GradientInfo, ...]:
        return tuple(g for g in self.gradients if g.sparse)


def is_summed(variable: Any) -> bool:
    """Whether ``variable`` (eager, or of a graph) is synchronised on read with aggregation ``SUM``: a Keras
    metric's state, which each replica adds its part to and a read sums (:attr:`VariableInfo.summed`)."""
    return getattr(variable, "synchronization", None) == tf.VariableSynchronization.ON_READ and \
        getattr(variable, "aggregation", None) == tf.VariableAggregation.SUM
