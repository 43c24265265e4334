"""Find what Parallax must know about a single-device training graph.

No fork of TensorFlow and no hook into the optimizer is needed: a
``tf.compat.v1.train`` optimizer creates each variable's update ops under
``<optimizer>/update_<variable>/``, and the gradient tensors (or the values and
indices of a sparse one) enter that scope from outside. So for every variable:

1. collect the ops of its update scope;
2. take the tensors that flow into the scope from outside it, dropping
   constants, variables, reads of variables (``<slot>/read`` of ref
   variables) and hyper-parameters (tensors that do not come from the
   gradient computation, e.g. a learning-rate placeholder);
3. what remains is the gradient: one floating tensor (dense), or a floating
   ``values`` tensor plus an integer ``indices`` tensor (sparse, from an
   ``IndexedSlices``).

When ops stand between ``tf.gradients`` and the update (``clip_by_global_norm``,
a scaling), each gradient is also traced back to the raw ``tf.gradients``
output it comes from (:func:`_find_raw_gradients`), so that Parallax can
aggregate the replicas' raw gradients and run those ops once on the result,
exactly as on one device.

The training ops are the ``train_op`` collection when the graph has one, and
otherwise the sinks of the update ops (the op ``apply_gradients`` returns).
A graph without any (inference, evaluation) is analysed as forward only: no
gradients, no training ops; its replicas then run side by side.
"""

from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass, replace
from typing import Any

import tensorflow as tf

from parallax.batch_statistics import batch_statistics, replica_sums_of
from parallax.errors import AnalysisError
from parallax.rewrite.graph_ops import colocated_with, is_variable_write
from parallax.update_order import gradients_after_updates

__all__ = ["VariableInfo", "GradientInfo", "ForwardOp", "GraphAnalysis", "analyse_graph", "VARIABLE_OP_TYPES",
           "update_scope_owner"]

VARIABLE_OP_TYPES = frozenset({"VarHandleOp", "VariableV2", "Variable", "AutoReloadVariable",
                               "_VarHandlesOp"})
_PURE_READS = frozenset({"ReadVariableOp", "Identity", "Const", "Shape"})
_GRADIENT_SCOPE_RE = re.compile(r"(^|/)(gradients(_\d+)?|gradient_tape)/")  # tf.gradients, a GradientTape


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
            (:mod:`parallax.batch_statistics`).
        after_updates: why a synchronous job cannot aggregate the step at once (a gradient computed after
            another update of the same step, :mod:`parallax.update_order`); ``""`` when it can.
        replica_sums: the ops that stand for sums over the replicas (synchronised batch statistics,
            :data:`parallax.batch_statistics.REPLICA_SUMS`), in the graph's order.
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


def analyse_graph(graph: tf.Graph) -> GraphAnalysis:
    """Find the variables, their gradients and the training ops of ``graph``.

    Args:
        graph: a single-device graph, usually with ``tf.compat.v1.train``
            optimizer updates (``minimize`` or ``apply_gradients``); without
            any it is forward only.

    Returns:
        A :class:`GraphAnalysis`.

    Raises:
        AnalysisError: a variable's gradient cannot be told apart from other
            inputs of its update, or two optimizer calls update it.
    """
    ops = graph.get_operations()
    trainable = {_op_name(v) for v in graph.get_collection(tf.compat.v1.GraphKeys.TRAINABLE_VARIABLES)}
    summed = {_op_name(v) for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES) if is_summed(v)}
    variables = []
    for op in ops:
        if op.type in VARIABLE_OP_TYPES:
            shape = op.get_attr("shape")
            dims = tuple(None if d.size < 0 else d.size for d in shape.dim) if hasattr(shape, "dim") \
                else tuple(tf.TensorShape(shape).as_list())
            variables.append(VariableInfo(op.name, dims, tf.dtypes.as_dtype(op.get_attr("dtype")).name,
                                          op.name in trainable, op.type != "VariableV2"
                                          and op.type != "Variable", _colocation(op), summed=op.name in summed))
    variables.sort(key=lambda v: v.name)
    scopes = _update_scopes(ops, [v.name for v in variables])
    slots = _slots(scopes, {v.name for v in variables})
    variables = [replace(v, slot_of=slots[v.name]) if v.name in slots and v.colocate_with == slots[v.name] else v
                 for v in variables]
    gradients = []
    for var_name in sorted(scopes):
        gradients.append(_gradient_of(var_name, scopes[var_name], graph))
    gradients = _find_raw_gradients(graph, gradients)
    gradients = _coupled_by_conditions(graph, gradients)
    _refuse_gradients_behind_decisions(graph, gradients)
    _refuse_decisions_on_a_replicas_data(graph, gradients)
    _refuse_hidden_updates(graph, {v.name for v in variables if v.trainable})
    _refuse_trainables_written_from_data(ops, {v.name for v in variables if v.trainable}, scopes, gradients)
    if not gradients:
        _refuse_unapplied_gradients(ops, {v.name for v in variables})
    train_ops = _train_ops(graph, scopes) if gradients else ()
    after_updates = gradients_after_updates(graph, gradients, train_ops)
    forward = _forward_ops(graph, gradients, {v.name: v for v in variables})
    statistics = batch_statistics(graph) if gradients else ()
    return GraphAnalysis(tuple(variables), tuple(gradients), train_ops, forward, statistics, after_updates,
                         replica_sums_of(graph) if gradients else ())


def _refuse_unapplied_gradients(ops: list, variables: set[str]) -> None:
    """Refuse a graph that computes gradients and writes variables, but applies no gradient Parallax can
    see: it would be run as a forward-only graph, each worker alone, training nothing together (tf_keras'
    non-legacy optimizers' ``apply_gradients`` in a ``tf.compat.v1`` graph advance their ``iteration``
    counter and update nothing; a hand-written update that reads no gradient Parallax can tie to it).

    Raises:
        AnalysisError: naming a gradient op and a write, and what to use instead.
    """
    gradient = next((op for op in ops if op.name.split("/", 1)[0].startswith(("gradients", "gradient_tape"))), None)
    if gradient is None:
        return
    initializers = {f"{v}/Assign" for v in variables}
    write = next((op for op in ops if is_variable_write(op.type) and op.name not in initializers
                  and not op.name.split("/", 1)[0].startswith("save")), None)
    if write is None:
        return
    raise AnalysisError(
        f'the graph computes gradients ("{gradient.name}") and writes a variable ("{write.name}", {write.type}), '
        "but no optimizer update that Parallax recognises applies the gradients: it would run forward-only, each "
        "worker alone. Use a tf.compat.v1.train optimizer or a tf_keras.optimizers.legacy one in a "
        "tf.compat.v1 graph (tf_keras' non-legacy optimizers update nothing there), or write the step as a "
        "tf.function (docs/tf2_programs.md)")


#: Ops whose outputs are a replica's own part of the data: input pipelines and queues.
_DATA_SOURCES = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional", "QueueDequeue",
                           "QueueDequeueV2", "QueueDequeueMany", "QueueDequeueManyV2", "QueueDequeueUpTo",
                           "QueueDequeueUpToV2", "ReaderRead", "ReaderReadV2", "ReaderReadUpTo",
                           "ReaderReadUpToV2"})


_PLACEHOLDERS = ("Placeholder", "PlaceholderV2", "PlaceholderWithDefault")


def _is_batch_input(op) -> bool:
    """Whether ``op`` gives each replica data of its own: an input pipeline's or queue's output, or a placeholder
    whose first dimension is the batch (unknown); a placeholder of fixed shape (a learning rate, a pretrained
    table) is taken to be fed the same on every replica."""
    if op.type in _DATA_SOURCES:
        return True
    if op.type not in _PLACEHOLDERS:
        return False
    shape = op.outputs[0].shape
    return shape.rank is not None and shape.rank > 0 and shape[0] is None


def _refuse_trainables_written_from_data(ops: list, trainable: set[str], scopes: dict[str, list],
                                         gradients: list[GradientInfo] = ()) -> None:
    """Refuse a trainable variable that the program writes itself, outside the optimizer's updates, with a value
    computed from the batch (``w.assign_add(tf.reduce_mean(x))``, an update written by hand from a gradient):
    on one device it takes the whole batch's value, but each worker would write its own part's, and the
    workers' copies of a trained variable would drift apart without a word. (Writes of variables that are not
    trained, such as batch normalisation's moving statistics, follow documented rules: docs/tf1_programs.md.)
    A write under a conditional that the aggregated ``gradients`` decide is taken alike by every worker: that
    decision is no batch value (Keras 3's Nadam advances its ``u_product``, a trainable variable, from the step
    counter, inside a ``LossScaleOptimizer``'s finite check).

    Raises:
        AnalysisError: naming the variable, the write, the batch input it reads and what to change.
    """
    aggregated = {t for g in gradients for t in g.aggregation_tensors if t}
    in_updates = {op.name for scope in scopes.values() for op in scope}
    for op in ops:
        if not is_variable_write(op.type) or op.name in in_updates or not op.inputs:
            continue
        target = op.inputs[0].op
        while target.type in ("Identity", *_SWITCHES) and target.inputs:
            target = target.inputs[0].op
        if target.name not in trainable:
            continue
        for value in op.inputs[1:]:
            source = _batch_input_before(value, set(), decided=aggregated)
            if source is not None:
                raise AnalysisError(
                    f'the trainable variable "{target.name}" is written by "{op.name}" ({op.type}) outside the '
                    f'optimizer\'s updates, with a value computed from the batch input "{source.name}": one device '
                    "writes the whole batch's value, but each worker would write its own part's and the copies "
                    "of a trained variable would drift apart. Update it through the optimizer "
                    "(minimize/apply_gradients), or make it a variable that is not trained (trainable=False), "
                    "whose writes each worker makes from its own data (docs/tf1_programs.md)")


#: Ops that run functions of the graph's library, with the attributes that name them.
_FUNCTION_CALLS = {"If": ("then_branch", "else_branch"), "While": ("cond", "body"), "Case": ("branches",),
                   "StatefulPartitionedCall": ("f",)}


def _refuse_hidden_updates(graph: tf.Graph, trainable: set[str]) -> None:
    """Refuse a trainable variable written inside a function the graph calls (a loop of TensorFlow 2's
    control flow, a nested function, a ``tf.cond`` of a graph not traced by Parallax): its update cannot be
    synchronised, and the graph would train each worker alone. (A traced ``tf.function`` step has its
    conditionals that write variables lowered into the graph, :mod:`parallax.tf2.conds`: a
    ``LossScaleOptimizer``'s updates are read as any optimizer's.)

    Raises:
        AnalysisError: naming the variable, the op and what to change.
    """
    library = {f.signature.name: f for f in graph.as_graph_def().library.function}
    for op in graph.get_operations():
        if op.type not in _FUNCTION_CALLS:
            continue
        handles = [(i, t) for i, t in enumerate(op.inputs) if t.dtype == tf.resource]
        if not handles:
            continue
        offset = 1 if op.type in ("If", "Case") else 0  # their first input is the predicate or branch index
        for i, tensor in handles:
            source = tensor.op
            while source.type in ("Identity", *_SWITCHES) and source.inputs:  # a lowered cond's Switch too
                source = source.inputs[0].op
            if source.name not in trainable:
                continue
            for attr in _FUNCTION_CALLS[op.type]:
                value = op.node_def.attr[attr]
                names = [f.name for f in value.list.func] if value.list.func else [value.func.name]
                if any(_writes_argument(library, name, i - offset, set()) for name in names):
                    raise AnalysisError(
                        f'the trainable variable "{source.name}" is written inside {op.type} "{op.name}" (a '
                        "TensorFlow 2 loop, nested function or tf.cond): Parallax synchronises updates it sees in "
                        "the graph, so it cannot train this one data-parallel. Apply the gradients outside the loop "
                        "or function (a tf.cond, such as a LossScaleOptimizer's, is read when the step is a "
                        "tf.function given to parallel_run)")


def _writes_argument(library: dict, function: str, index: int, seen: set[str]) -> bool:
    """Whether ``function`` (or a function it calls) writes the variable given as its argument ``index``."""
    fdef = library.get(function)
    if fdef is None or index < 0 or index >= len(fdef.signature.input_arg) or function in seen:
        return False
    seen.add(function)
    arg = fdef.signature.input_arg[index].name
    for node in fdef.node_def:
        inputs = [t.split(":")[0] for t in node.input if not t.startswith("^")]
        if is_variable_write(node.op) and inputs and inputs[0] == arg:
            return True
        if node.op in _FUNCTION_CALLS or node.op == "PartitionedCall":
            offset = 1 if node.op in ("If", "Case") else 0
            for position, name in enumerate(inputs):
                if name != arg:
                    continue
                for attr in _FUNCTION_CALLS.get(node.op, ("f",)):
                    value = node.attr[attr]
                    called = [f.name for f in value.list.func] if value.list.func else [value.func.name]
                    if any(_writes_argument(library, c, position - offset, seen) for c in called):
                        return True
    return False



def _forward_ops(graph: tf.Graph, gradients: list[GradientInfo], variables: dict) -> tuple[ForwardOp, ...]:
    """The ancestors of the gradients, variables and ``gradients`` scopes apart, in creation order."""
    starts = [graph.get_tensor_by_name(t).op for g in gradients for t in g.aggregation_tensors if t]
    seen = {op.name for op in starts}
    queue = deque(starts)
    while queue:
        op = queue.popleft()
        for parent in [t.op for t in op.inputs] + list(op.control_inputs):
            if parent.name not in seen and parent.type not in VARIABLE_OP_TYPES:
                seen.add(parent.name)
                queue.append(parent)
    out = []
    for op in graph.get_operations():
        if op.name not in seen or _in_gradient_scope(op):
            continue
        reads = []
        for t in op.inputs:
            source = t.op
            if source.type in ("Identity", "ReadVariableOp") and source.inputs:
                source = source.inputs[0].op
            if source.type in VARIABLE_OP_TYPES and source.name in variables and op.type not in _PURE_READS:
                reads.append(source.name)
        cost = 1
        for name in reads:
            shape = variables[name].shape
            elements = 1
            for d in (shape[1:] if "Gather" in op.type and shape else shape):
                elements *= d or 1
            cost += elements
        out.append(ForwardOp(op.name, cost, tuple(dict.fromkeys(reads))))
    return tuple(out)


def _colocation(op) -> str | None:
    try:
        groups = op.get_attr("_class")
    except ValueError:
        return None
    return next((name for name in colocated_with(groups) if name != op.name), None)


def _op_name(obj) -> str:
    op = getattr(obj, "op", None)
    return op.name if op is not None else obj.name.split(":")[0]


def update_scope_owner(var_names: list[str]):
    """A function from an op name to the variable whose ``update_<var>`` scope
    holds the op (the innermost such scope; the longest variable name where
    several fit), or ``None``. A scope is ``update_<var>/`` or ``update_<var>_<n>/``,
    at the start of the name or after a ``/``. Linear in the name's length."""
    names = frozenset(var_names)

    def variable_of(scope: str) -> str | None:
        if scope in names:
            return scope
        m = _NUMBERED.fullmatch(scope)
        return m.group(1) if m and m.group(1) in names else None

    def owner(op_name: str) -> str | None:
        start = op_name.rfind("update_")
        while start >= 0:
            if start == 0 or op_name[start - 1] == "/":
                rest = op_name[start + len("update_"):]
                end = rest.rfind("/")
                while end > 0:  # the longest scope first
                    var = variable_of(rest[:end])
                    if var is not None:
                        return var
                    end = rest.rfind("/", 0, end)
            start = op_name.rfind("update_", 0, start)
        return None

    return owner


_NUMBERED = re.compile(r"(.+)_\d+")


def _update_scopes(ops, var_names: list[str]) -> dict[str, list]:
    """Map each variable name to the ops of its ``update_<var>`` scopes."""
    owner = update_scope_owner(var_names)
    scopes: dict[str, list] = {}
    for op in ops:
        var = owner(op.name)
        if var is not None:
            scopes.setdefault(var, []).append(op)
    return scopes


def _slots(scopes: dict[str, list], variable_names: set[str]) -> dict[str, str]:
    """``{slot: primary}``: the variables that enter exactly one variable's update scope
    (as a handle, a ref or a read), other than that variable itself."""
    readers: dict[str, set[str]] = {}
    for owner, ops in scopes.items():
        for op in ops:
            for t in op.inputs:
                source = t.op
                if source.type in ("Identity", "ReadVariableOp") and source.inputs:
                    source = source.inputs[0].op
                source = _behind_switches(source)
                if source.name in variable_names and source.name != owner:
                    readers.setdefault(source.name, set()).add(owner)
    return {slot: next(iter(owners)) for slot, owners in readers.items() if len(owners) == 1}


def _is_variable_read(op) -> bool:
    if op.type in VARIABLE_OP_TYPES:
        return True
    if op.type in ("Identity", "ReadVariableOp") and op.inputs:
        return _behind_switches(op.inputs[0].op).type in VARIABLE_OP_TYPES
    return False


def _behind_switches(op):
    """The op whose handle or ref ``op`` passes on through a lowered conditional's ``Switch`` ops (``op``
    itself when it is none)."""
    while op.type in _SWITCHES and op.inputs:
        op = op.inputs[0].op
    return op


_SWITCHES = frozenset({"Switch", "RefSwitch"})


def _from_gradient_computation(tensor, cache: dict) -> bool:
    """Whether ``tensor`` is computed from ops of a ``gradients`` name scope."""
    start = tensor.op
    if start.name in cache:
        return cache[start.name]
    seen = {start.name}
    queue = deque([start])
    found = False
    while queue:
        op = queue.popleft()
        if _GRADIENT_SCOPE_RE.search(op.name + "/"):
            found = True
            break
        # a lowered conditional's predicate (all gradients finite) tells which branch runs, no part of a value
        for t in list(op.inputs)[:1] if op.type in _SWITCHES else op.inputs:
            if t.op.name not in seen and t.op.type not in VARIABLE_OP_TYPES:
                seen.add(t.op.name)
                queue.append(t.op)
    cache[start.name] = found
    return found


def _gradient_of(var_name: str, scope_ops: list, graph: tf.Graph) -> GradientInfo:
    optimizers = sorted({op.name[:op.name.rfind("update_")].rstrip("/") or "(top level)" for op in scope_ops})
    if len(optimizers) > 1:
        raise AnalysisError(
            f'variable "{var_name}" is updated by {len(optimizers)} optimizer calls ({", ".join(optimizers)}); '
            "Parallax synchronises one gradient per variable and step. Update each variable with one "
            "minimize()/apply_gradients() (e.g. pass var_list=), or sum the losses into one")
    inside = {op.name for op in scope_ops}
    external = []
    for op in scope_ops:
        for t in op.inputs:
            p = t.op
            if p.name in inside or p.type == "Const" or _is_variable_read(p) or t.dtype == tf.resource:
                continue
            if t.name not in external:
                external.append(t.name)
    # an IndexedSlices' dense shape (Keras 3 densifies a sparse gradient inside the update) is no part of it
    tensors = [t for t in (graph.get_tensor_by_name(n) for n in external)
               if t.op.type not in ("Shape", "VariableShape")]
    cache: dict = {}
    grads = [t for t in tensors if _from_gradient_computation(t, cache)]
    if not grads:
        grads = tensors  # hand-built gradients: every non-constant input is a candidate
    floats = [t for t in grads if t.dtype.is_floating or t.dtype.is_complex]
    ints = [t for t in grads if t.dtype.is_integer]
    update_ops = tuple(sorted(inside))
    if len(floats) == 1 and not ints:
        return GradientInfo(var_name, False, floats[0].name, None, floats[0].dtype.name, update_ops)
    if len(floats) == 1 and len(ints) == 1 and _shared_rows(floats[0], ints[0]):
        return GradientInfo(var_name, False, floats[0].name, None, floats[0].dtype.name, update_ops,
                            shape=tuple(floats[0].shape.as_list()))
    if len(floats) == 1 and len(ints) == 1:
        count = ints[0].shape.num_elements() if ints[0].shape.is_fully_defined() else None
        merged = _sums_rows_first(floats[0], scope_ops)
        if not merged:
            _refuse_partly_shared_rows(var_name, ints[0])
        return GradientInfo(var_name, True, floats[0].name, ints[0].name, floats[0].dtype.name, update_ops,
                            ints[0].dtype.name, indices_count=count, repeats_merged=merged)
    raise AnalysisError(
        f'cannot tell the gradient of variable "{var_name}" from the other inputs of its update ops '
        f"(candidates: {', '.join(t.name for t in grads) or 'none'}). Expected one floating tensor "
        "(dense) or values + indices (sparse) coming from tf.gradients / optimizer.compute_gradients")


#: Ops whose output depends on their input's shape only: a replica's part of the batch has the shape of every
#: other replica's (the parts of a global batch are equal), so they give every replica the same value.
_SHAPE_OPS = frozenset({"Shape", "ShapeN", "Size", "Rank", "VariableShape"})


def _refuse_partly_shared_rows(var_name: str, indices) -> None:
    """Refuse a sparse gradient made of several lookups (``ConcatV2`` of their rows), some by the batch and some
    by indices every replica shares (a table looked up by ids and by ``range``), whose update does not only sum
    its rows (Keras 3's Adam squares each row first): gathered, the shared rows would come once per replica where
    one device has each once, summed over the batch, and the update would differ without a word.

    Raises:
        AnalysisError: naming the variable and what to change.
    """
    op = indices.op
    while op.type in ("Identity", "Reshape", "Cast") and op.inputs:
        op = op.inputs[0].op
    if op.type != "ConcatV2":
        return
    shared = [_shared_rows(t, t) for t in op.inputs[:-1]]  # the last input is the axis
    if any(shared) and not all(shared):
        raise AnalysisError(
            f'the gradient of "{var_name}" gathers rows of several lookups, some by the batch and some by indices '
            "every replica computes alike (a range of positions, constant rows), and its optimizer's update does not "
            "only sum the rows (it squares each, as Keras 3's Adam does): Parallax cannot yet give that update the "
            "rows one device computes. Look the shared rows up in a table of their own (a position Embedding "
            "beside the token one), or use an optimizer that sums the rows first (SGD)")


def _shared_rows(values, indices) -> bool:
    """Whether a sparse gradient's ``indices`` are the same on every replica: computed from no batch input
    (through its shape at most) nor variable, as a gather of ``range(maxlen)`` positions (every Keras
    Transformer's position embedding) or of constant rows. One device then computes each row once, its value
    summed over the whole batch; the replicas' rows are the same rows, each with its part's sum, so their
    elementwise mean is exactly one device's gradient, where gathering the replicas' rows would repeat each
    one (which an optimizer that squares the rows before summing them, Keras 3's Adam, does not forgive). The
    values need a static shape to be all-reduced."""
    if not values.shape.is_fully_defined():
        return False
    seen, queue = {indices.op.name}, deque([indices.op])
    while queue:
        op = queue.popleft()
        if op.type in VARIABLE_OP_TYPES or op.type in _DATA_SOURCES or op.type in _PLACEHOLDERS:
            return False
        if op.type in _SHAPE_OPS:
            continue
        for t in op.inputs:
            if t.op.name not in seen:
                seen.add(t.op.name)
                queue.append(t.op)
    return True


#: Ops that sum a sparse gradient's rows of equal index (``tf.compat.v1.train`` optimizers deduplicate
#: with ``UnsortedSegmentSum`` first; plain gradient descent scatters them, adding as it goes).
_SUMS_ROWS = frozenset({"UnsortedSegmentSum", "ResourceScatterAdd", "ResourceScatterSub", "ScatterAdd", "ScatterSub"})
#: Ops a gradient's rows may pass through on the way there without their sum changing meaning (a scale).
_ROW_SCALES = frozenset({"Neg", "Mul", "RealDiv", "Cast", "Identity"})


def _sums_rows_first(values, scope_ops: list) -> bool:
    """Whether the update's every use of a sparse gradient's ``values`` sums the rows of equal index (after
    a scale at most), so that summing them before they are sent changes nothing. Keras 3's Adam squares each
    row before summing: not so."""
    inside = {op.name for op in scope_ops}
    frontier, seen, found = [values], set(), False
    while frontier:
        tensor = frontier.pop()
        for op in tensor.consumers():
            if op.name not in inside or op.name in seen:
                continue
            seen.add(op.name)
            if op.type in _SUMS_ROWS:
                found = True
            elif op.type in _ROW_SCALES:
                frontier.extend(op.outputs)
            else:
                return False
    return found


def _train_ops(graph: tf.Graph, scopes: dict[str, list]) -> tuple[str, ...]:
    collected = graph.get_collection(tf.compat.v1.GraphKeys.TRAIN_OP)
    if collected:
        return tuple(dict.fromkeys(_op_name(t) for t in collected))
    # Sinks reachable from the update ops (following data and control edges).
    consumers: dict[str, list] = {}
    for op in graph.get_operations():
        for t in op.inputs:
            consumers.setdefault(t.op.name, []).append(op)
        for c in op.control_inputs:
            consumers.setdefault(c.name, []).append(op)
    starts = [op for ops in scopes.values() for op in ops]
    seen = {op.name for op in starts}
    queue = deque(starts)
    sinks = []
    while queue:
        op = queue.popleft()
        outs = consumers.get(op.name, [])
        if not outs and op.name not in {o.name for o in starts} and op.type not in _PURE_READS:
            sinks.append(op.name)
        for c in outs:
            if c.name not in seen:
                seen.add(c.name)
                queue.append(c)
    return tuple(sorted(sinks))


def _in_gradient_scope(op) -> bool:
    return bool(_GRADIENT_SCOPE_RE.search(op.name)) or _tape_sum(op)


def _tape_sum(op) -> bool:
    """Whether ``op`` is a ``GradientTape``'s sum of one variable's gradients from several uses: a top-level
    ``AddN`` of tensors the tape made (and of what it makes under the sum's own name: an ``IndexedSlices``
    gradient made dense beside a dense one, an embedding's lookup beside its regulariser)."""
    if op.type != "AddN" or "/" in op.name:
        return False
    return all(_GRADIENT_SCOPE_RE.search(t.op.name) or t.op.name.startswith(op.name + "/") for t in op.inputs)


def _find_raw_gradients(graph: tf.Graph, gradients: list[GradientInfo]) -> list[GradientInfo]:
    """Trace post-processed gradients back to the raw ``tf.gradients`` outputs.

    The raw outputs are the tensors made in a ``gradients`` name scope that the
    post-processing ops read (the frontier). A dense variable's raw gradient is
    the nearest frontier tensor of the variable's shape; a sparse one's values
    are the nearest frontier tensor made by the same gradient function as its
    indices (which pass through unchanged). Every frontier tensor must be
    claimed by exactly one variable; if not, the graph is left as it is and
    aggregation happens at the update's inputs.
    """
    produced = [graph.get_tensor_by_name(t) for g in gradients for t in g.tensors]
    if all(_in_gradient_scope(t.op) for t in produced):
        return gradients  # nothing between tf.gradients and the update
    frontier: set[str] = set()
    distances: dict[str, dict[str, int]] = {}
    for g in gradients:
        start = graph.get_tensor_by_name(g.tensor)
        distances[g.variable] = _frontier_distances(start, frontier)
        if g.indices is not None:
            indices = graph.get_tensor_by_name(g.indices)
            if not _in_gradient_scope(indices.op):
                return gradients
            frontier.add(indices.name)
    claimed: dict[str, str] = {}
    result = []
    for g in gradients:
        near = sorted(distances[g.variable].items(), key=lambda kv: (kv[1], kv[0]))
        if g.indices is None:
            want = graph.get_tensor_by_name(g.tensor)
            choice = next((t for t, _ in near if _same_shape(graph.get_tensor_by_name(t), want)), None)
        else:
            scope = graph.get_tensor_by_name(g.indices).op.name.rsplit("/", 1)[0]
            choice = next((t for t, _ in near if graph.get_tensor_by_name(t).op.name.rsplit("/", 1)[0] == scope
                           and graph.get_tensor_by_name(t).dtype.is_floating), None)
            if choice is not None:
                claimed[g.indices] = g.variable
        if choice is None or choice in claimed:
            return gradients
        claimed[choice] = g.variable
        # ops between the raw gradient and the update (clipping) see the repeats: keep them
        result.append(replace(g, raw_tensor=choice, raw_indices=g.indices, repeats_merged=False))
    if set(claimed) != frontier:
        return gradients  # some raw gradient feeds the post-processing without being any variable's
    return [replace(g, coupled_with=tuple(sorted({claimed[t] for t in distances[g.variable]} - {g.variable})))
            for g in result]


def _coupled_by_conditions(graph: tf.Graph, gradients: list[GradientInfo]) -> list[GradientInfo]:
    """Couple each update that runs under a conditional (a lowered ``tf.cond``'s ``Switch``: a
    ``LossScaleOptimizer`` applies the gradients only when all are finite) with every variable whose gradient
    its predicate is computed from: that decision must be taken on the gradients every worker sees alike
    (aggregated), so these variables cannot be split between parameter servers and all-reduce."""
    owner = {t: g.variable for g in gradients for t in g.aggregation_tensors if t}
    behind: dict[str, frozenset[str]] = {}
    out = []
    for g in gradients:
        predicates = {}
        for name in g.update_ops:
            op = graph.get_operation_by_name(name)
            sources = [op] + [t.op for t in op.inputs]
            for source in sources:
                while source.type in _SWITCHES and len(source.inputs) > 1:
                    predicates[source.inputs[1].name] = source.inputs[1]
                    source = source.inputs[0].op
        coupled = set()
        for name, predicate in predicates.items():
            if name not in behind:
                behind[name] = _gradients_behind(predicate, owner)
            coupled |= behind[name]
        coupled -= {g.variable}
        out.append(replace(g, coupled_with=tuple(sorted(set(g.coupled_with) | coupled))) if coupled else g)
    return out


def _refuse_decisions_on_a_replicas_data(graph: tf.Graph, gradients: list[GradientInfo]) -> None:
    """Refuse an update that runs under a conditional whose predicate is computed from the batch, but not through
    the gradients (``tf.cond(loss < 1.0, apply, no-op)``): the gradients are aggregated, but each worker would
    take the decision on its own part of the batch, apply or skip alone, and the workers' variables would drift
    apart. (A ``LossScaleOptimizer``'s check that the gradients are finite reads the aggregated gradients: every
    worker decides alike.)

    Raises:
        AnalysisError: naming the variable, the conditional, the batch input and what to change.
    """
    owner = {t for g in gradients for t in g.aggregation_tensors if t}
    for g in gradients:
        for name in g.update_ops:
            op = graph.get_operation_by_name(name)
            for source in [op] + [t.op for t in op.inputs]:
                while source.type in _SWITCHES and len(source.inputs) > 1:
                    found = _batch_input_before(source.inputs[1], owner)
                    if found is not None:
                        raise AnalysisError(
                            f'the update of "{g.variable}" runs under the conditional "{source.name}", whose '
                            f'predicate is computed from the batch input "{found.name}" without going through the '
                            "gradients: each worker would decide on its own part of the batch and apply or skip "
                            "the update alone. Decide on a value every worker shares (the step, a fed flag, the "
                            "gradients themselves), or apply the gradients unconditionally")
                    source = source.inputs[0].op


def _batch_input_before(tensor, stops: set[str], decided: set[str] = frozenset()):
    """The first batch input (:func:`_is_batch_input`) ``tensor`` is computed from without passing through a
    tensor of ``stops`` (the gradients Parallax aggregates) or a variable, or ``None``; a lowered conditional's
    predicate is followed up to a tensor of ``decided`` too (on those every worker decides alike)."""
    seen, queue = {(tensor.op.name, False)}, deque([(tensor, False)])
    while queue:
        t, predicate = queue.popleft()
        if t.name in stops or (predicate and t.name in decided):
            continue
        if _is_batch_input(t.op):
            return t.op
        for i, source in enumerate(t.op.inputs):
            key = (source.op.name, predicate or (i == 1 and t.op.type in _SWITCHES))
            if key not in seen and source.op.type not in VARIABLE_OP_TYPES:
                seen.add(key)
                queue.append((source, key[1]))
    return None


def _refuse_gradients_behind_decisions(graph: tf.Graph, gradients: list[GradientInfo]) -> None:
    """Refuse a gradient that Parallax would aggregate inside a conditional whose predicate is computed from
    the gradients (a ``LossScaleOptimizer``'s finite check): each worker would take that decision on its own
    gradients, and the aggregation would run on some workers only.

    Raises:
        AnalysisError: naming the variable, the conditional and what to change.
    """
    cache: dict = {}
    inside = []
    for g in gradients:
        for name in g.aggregation_tensors:
            if name is None:
                continue
            switch = _switch_behind(graph.get_tensor_by_name(name))
            if switch is not None and _from_gradient_computation(switch.inputs[1], cache):
                inside.append((g, name, switch))
                break
    if not inside:
        return
    # the raw gradients are found for all or none (_find_raw_gradients): name the one that cannot be traced back
    # to the tape (a sparse gradient made dense), which leaves the others inside the conditional with it
    g, name, switch = next((c for c in inside if not _traceable(graph.get_tensor_by_name(c[1]))), inside[0])
    raise AnalysisError(
        f'the gradient of "{g.variable}" ({name}) is computed inside a conditional that the gradients '
        f'decide ("{switch.name}": a LossScaleOptimizer\'s check that they are all finite), from ops '
        "Parallax cannot run on the aggregated gradients before that check (e.g. an optimizer's "
        "global_clipnorm turning a sparse gradient, an embedding's, into a dense one): "
        "every worker would decide on its own gradients. Clip the gradients in the step, outside the "
        "optimizer, or leave the sparse variable out of the clipping")


def _traceable(tensor) -> bool:
    """Whether a dense gradient is computed from a gradient of its own shape made by the tape (not from a sparse
    gradient's values and indices, or from nothing the tape made)."""
    return any(_same_shape(tensor.graph.get_tensor_by_name(t), tensor) for t in _frontier_distances(tensor, set()))


def _switch_behind(tensor):
    """The first ``Switch`` op ``tensor`` is computed from, outside gradient scopes and variables (``None``)."""
    seen, queue = {tensor.op.name}, deque([tensor.op])
    while queue:
        op = queue.popleft()
        if op.type in _SWITCHES:
            return op
        if _in_gradient_scope(op):
            continue
        for t in op.inputs:
            if t.op.name not in seen and t.op.type not in VARIABLE_OP_TYPES:
                seen.add(t.op.name)
                queue.append(t.op)
    return None


def _gradients_behind(tensor, owner: dict[str, str]) -> frozenset[str]:
    """The variables (``owner``: gradient tensor -> variable) whose gradients ``tensor`` is computed from."""
    found, seen, queue = set(), {tensor.op.name}, deque([tensor])
    while queue:
        t = queue.popleft()
        if t.name in owner:
            found.add(owner[t.name])
            continue
        for source in t.op.inputs:
            if source.op.name not in seen and source.op.type not in VARIABLE_OP_TYPES:
                seen.add(source.op.name)
                queue.extend(source.op.outputs)
    return frozenset(found)


def _frontier_distances(start, frontier: set[str]) -> dict[str, int]:
    """Breadth-first backwards from ``start`` through ops outside gradient scopes;
    returns the gradient-scope tensors reached, with their distance, and adds
    them to ``frontier``."""
    if _in_gradient_scope(start.op):
        frontier.add(start.name)
        return {start.name: 0}
    found: dict[str, int] = {}
    seen = {_walk_key(start)}
    queue = deque([(start, 1)])
    while queue:
        tensor, depth = queue.popleft()
        for t in _value_sources(tensor):
            p = t.op
            if p.type in VARIABLE_OP_TYPES or p.type == "Const" or t.dtype == tf.resource:
                continue
            if _in_gradient_scope(p):
                found.setdefault(t.name, depth)
                frontier.add(t.name)
            elif _walk_key(t) not in seen:
                seen.add(_walk_key(t))
                queue.append((t, depth + 1))
    return found


#: Ops whose output ``k`` is their input ``k``, passed on: an ``IdentityN`` (every Keras 3 optimizer passes the
#: gradients through one, the default replica context's ``all_reduce``, a ``custom_gradient``).
_PER_OUTPUT = frozenset({"IdentityN"})


def _value_sources(tensor) -> list:
    """The inputs ``tensor``'s value is computed from: all its op's, but a lowered conditional's predicate (all
    gradients finite: it tells which branch runs, no part of a value) and an ``IdentityN``'s other inputs."""
    op = tensor.op
    if op.type in _SWITCHES:
        return list(op.inputs)[:1]
    if op.type in _PER_OUTPUT and tensor.value_index < len(op.inputs):
        return [op.inputs[tensor.value_index]]
    return list(op.inputs)


def _walk_key(tensor) -> str:
    """What a walk over values marks as seen: the tensor of an op in :data:`_PER_OUTPUT`, else its op."""
    return tensor.name if tensor.op.type in _PER_OUTPUT else tensor.op.name


def _same_shape(a, b) -> bool:
    return a.dtype == b.dtype and a.shape.is_fully_defined() and a.shape == b.shape
