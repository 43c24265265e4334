"""The graphs the analysis refuses, each saying what to change: an update Parallax cannot see or synchronise,
or a value or decision that each worker would take from its own part of the batch."""

from __future__ import annotations

from collections import deque

import tensorflow as tf

from parallax.analysis.model import GradientInfo
from parallax.analysis.ops import _SWITCHES, VARIABLE_OP_TYPES, _in_gradient_scope, _is_batch_input
from parallax.analysis.walks import _from_gradient_computation, _frontier_distances, _same_shape, _shared_rows
from parallax.errors import AnalysisError
from parallax.graph.graph_ops import is_variable_write

__all__ = ["_refuse_unapplied_gradients", "_refuse_trainables_written_from_data", "_refuse_hidden_updates",
           "_refuse_decisions_on_a_replicas_data", "_refuse_gradients_behind_decisions", "_refuse_partly_shared_rows"]


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
