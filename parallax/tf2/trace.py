"""A ``tf.function`` training step as a single-device ``tf.compat.v1`` graph.

A traced step's graph (a ``FuncGraph``) holds what it reads and writes as captured
placeholders: a variable's resource handle, or a constant's value. This module
builds a ``tf.Graph`` that Parallax analyses and rewrites like any TF1 program's:

1. each captured variable becomes a resource variable of the new graph, with the
   eager variable's name (made unique) and its value now as initial value (a
   constant fill, or read from the eager variable when the process initialises);
   other captured tensors become constants;
2. the step's ops are imported with every reference to a capture (an input, a
   ``loc:@`` colocation) bound to what replaced it, and without the devices the eager
   context gave them (Parallax places them); its arguments stay placeholders of their
   own names; a ``tf.cond`` whose branches write variables (a ``LossScaleOptimizer``
   applies every gradient in one, to skip a step whose gradients overflow) is lowered
   into the graph first (``Switch``/``Merge``, :mod:`parallax.tf2.conds`), so that its
   updates are ops the analysis reads and the decision is taken once, on the gradients
   the replicas aggregated;
3. a ``tf.compat.v1.train`` optimizer traced in a function names its update scopes
   ``update_``, ``update__1``...: each is renamed ``update_<variable>`` after the
   variable its update writes, as the optimizer names them in a TF1 graph; an
   optimizer that names none (Keras 3) has each variable's update region found
   (:mod:`parallax.tf2.regions`) and named so, its slots colocated with it;
4. the step's side effects (its updates, counters, moving statistics) are grouped in
   one training op, ``parallax_step``, put in the ``train_op`` collection;
5. the sums over replicas the step asks for (a ``BatchNormalization(synchronized=True)``'s statistics)
   and the counts a masked loss divides by (:mod:`parallax.tf2.masked_means`) are named in the
   ``parallax_replica_sums`` collection (:mod:`parallax.tf2.replica_sums`);
6. each variable the program may set between steps (a KL-annealing weight a callback assigns, a loop's learning
   rate) gets a placeholder of its shape and an assignment from it (:attr:`TracedStep.host_writes`): one of the
   program's writes outside a step, as a TF1 program's ``lr.assign(new_lr)``, which every mode orders.

The step's outputs keep its return value's structure (:attr:`TracedStep.outputs`).
Nothing downstream learns where the graph came from.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import attr_value_pb2, graph_pb2

from parallax.analysis import is_summed
from parallax.analysis.batch_statistics import REPLICA_SUMS
from parallax.errors import AnalysisError
from parallax.graph.graph_ops import colocated_with, colocation_group, format_input, parse_input
from parallax.graph.names import EXACT_DRAWS, HOST_WRITES_PREFIX, INITIAL_VALUE_PREFIX, REPLICA_COUNT, REPLICA_INDEX
from parallax.tf2.conds import lower_conds
from parallax.tf2.draws import exact_draws, mark_replica_parts
from parallax.tf2.masked_means import COUNTS_SUFFIX, masked_means, sum_masked_counts
from parallax.tf2.regions import update_regions
from parallax.tf2.replica_sums import replica_sums
from parallax.tf2.state_reads import read_assigned_values
from parallax.tf2.tables import build_table, captured_table

__all__ = ["TracedStep", "trace_step", "is_step_function", "first_batched", "STEP_OP"]

#: The name of the training op that runs a traced step's side effects.
STEP_OP = "parallax_step"

#: A traced optimizer's update scopes: ``update_``, ``update__1`` (a ``tf.compat.v1.train`` optimizer's),
#: ``update``, ``update_1`` (a tf_keras ``OptimizerV2``'s).
_TRACED_UPDATE = re.compile(r"(^|/)(update(?:_|__\d+|_\d+)?)/")


@dataclass(frozen=True)
class TracedStep:
    """A ``tf.function`` step as a single-device graph.

    Attributes:
        graph: the graph (variables, the step's ops, :data:`STEP_OP`).
        inputs: one placeholder per argument tensor, in the order of the flattened arguments.
        outputs: the step's return value, its tensors those of ``graph``.
        train_op: the op that runs the step's side effects.
        variables: the eager variables the step reads or writes, by the name of the graph's variable
            that stands for each.
        signature: the arguments' ``tf.TensorSpec`` structure.
        initializers: the graph the variables were made in, which holds the callbacks of their
            ``py_function`` initializers (TensorFlow drops a callback with its graph).
        host_writes: for each variable the program may set between steps (one it shows as a ``tf.Variable``,
            neither a slot nor a metric's state), the names of a placeholder of its shape and of the op that
            assigns it to the variable (under :data:`parallax.graph.names.HOST_WRITES_PREFIX`).
        function: the ``tf.function`` traced (whose parameters bind a call's keyword arguments).
        part_rows: where the step draws random numbers of its part's rows, a scalar placeholder the step is fed
            each replica's part's rows with (:func:`parallax.tf2.draws.mark_replica_parts`), else ``None``.
        summed_writes: as ``host_writes``, for each metric's state (summed over the replicas): how the job's copies
            are reset (:meth:`parallax.tf2.summed.SummedState.restart`).
    """

    graph: tf.Graph
    inputs: tuple
    outputs: Any
    train_op: tf.Operation
    variables: dict
    signature: Any
    initializers: tf.Graph
    host_writes: dict = field(default_factory=dict)
    function: Any = None
    part_rows: Any = None
    summed_writes: dict = field(default_factory=dict)


def is_step_function(obj: Any) -> bool:
    """Whether ``obj`` is a ``tf.function`` (what :func:`trace_step` takes)."""
    return callable(getattr(obj, "get_concrete_function", None)) and hasattr(obj, "python_function")


def first_batched(pairs: Iterable[tuple[Any, Any]]) -> Any:
    """The value paired with the first tensor of a known rank above 0 (``(tensor, value)`` pairs): a step's first
    batched argument, whose rows are its part's (a scalar argument, such as a flag, has none); ``None`` if none is.

    >>> first_batched([(tf.TensorSpec([]), "flag"), (tf.TensorSpec([None, 3]), "x")])
    'x'
    """
    return next((value for tensor, value in pairs if tensor.shape.rank), None)


def trace_step(fn: Any, input_signature: Any = None) -> TracedStep:
    """Trace ``fn`` (a ``tf.function``) into a single-device graph (see the module docstring).

    Args:
        fn: the training step, a ``tf.function`` with an ``input_signature`` (or one given here).
        input_signature: ``tf.TensorSpec`` objects for its arguments, when ``fn`` has none.

    Raises:
        TypeError: ``fn`` is not a ``tf.function``.
        ValueError: it has no input signature.
        AnalysisError: it captures a resource that is no variable (a lookup table, an iterator).
    """
    if not is_step_function(fn):
        raise TypeError(f"parallel_run: a TensorFlow 2 step must be a tf.function, got {type(fn).__name__}")
    signature = input_signature if input_signature is not None else getattr(fn, "input_signature", None)
    if signature is None:
        raise ValueError(f"parallel_run: the tf.function {fn.python_function.__name__!r} has no input_signature; "
                         "declare one (@tf.function(input_signature=[tf.TensorSpec([None, 784], tf.float32), ...])) "
                         "so that every replica's batch has a placeholder of known dtype and shape")
    concrete = fn.get_concrete_function(*signature)
    func_graph = concrete.graph
    known = {id(v.handle): _Eager.of(v) for v in func_graph.variables}
    for placeholder, value in zip(func_graph.internal_captures, concrete.captured_inputs):
        if id(value) not in known and value.dtype == tf.resource:  # a slot made in the step, passed as a handle
            found = _Eager.of_handle(value, placeholder.op.name)
            if found is not None:
                known[id(value)] = found
    captures = list(zip([p.op.name for p in func_graph.internal_captures], concrete.captured_inputs))
    tables = {}  # lookup tables the step reads, carried in by their contents (parallax.tf2.tables)
    for placeholder, value in zip(func_graph.internal_captures, concrete.captured_inputs):
        if value.dtype == tf.resource and id(value) not in known:
            table = captured_table(value, placeholder)
            if table is not None:
                tables[placeholder.op.name] = table
                continue
            raise AnalysisError(
                f"the step {fn.python_function.__name__!r} captures {placeholder.op.name!r}, a resource that is no "
                "variable nor a lookup table it only reads (a table it writes, a dataset iterator, a random "
                "generator); Parallax takes a step whose state is variables and tables: pass the batches as the "
                "step's arguments")
    sums = replica_sums(func_graph)  # synchronised batch statistics (parallax.tf2.replica_sums)
    step_def, cond_outputs = lower_conds(func_graph.as_graph_def())  # a LossScaleOptimizer's updates, out of its cond
    num_args = len(func_graph.inputs) - len(func_graph.internal_captures)
    arguments = [t.op.name for t in func_graph.inputs[:num_args]]
    # a read after the step's own assign: the value assigned (a SeedGenerator drawn from twice)
    read_assigned_values(step_def, {op.name for op in func_graph.control_outputs}, set(arguments))
    batch = first_batched((t, t.op.name) for t in func_graph.inputs[:num_args])  # a loop's first batch
    replica_marks = mark_replica_parts(step_def, batch) if batch is not None else None
    exact = exact_draws(step_def)  # random draws of the part's rows: each replica its rows of one device's draw
    sums = _in_order(func_graph, sums, step_def)  # with a masked loss's counts (parallax.tf2.masked_means)
    primary = _slot_owners(step_def, {c for c, _ in captures})
    captures = [(name, value) for name, value in captures if name not in tables]
    held = {name for name, value in captures if value.dtype == tf.resource}
    regions = update_regions(step_def, held, {name for name, value in captures
                                              if value.dtype == tf.resource and known[id(value)].trainable})
    for region in regions:  # a Keras 3 optimizer's slots, by what the update writes
        primary.update({slot: region.variable for slot in region.slots})
    scratch = tf.Graph()  # the variables and constants that stand for the captures
    bindings: dict[str, str] = {}  # capture placeholder -> op that stands for it
    variables: dict[str, Any] = {}
    writes: dict[str, tuple[str, str]] = {}
    summed_writes: dict[str, tuple[str, str]] = {}
    with scratch.as_default():
        for name, table in sorted(tables.items()):
            bindings[name] = build_table(table, f"parallax_table/{name.replace('/', '_')}")
        taken: set[str] = set()
        # variables first, then their slots beside them (a slot's placeholder is colocated with its variable's)
        for name, value in sorted(captures, key=lambda c: primary[c[0]] is not None):
            if value.dtype != tf.resource:
                bindings[name] = tf.constant(np.asarray(value), name=f"parallax_captured/{name}").op.name
                continue
            eager = known[id(value)]
            owner = primary[name]
            if owner is not None and eager.name == name:  # a slot made in the step: named after its variable
                eager = replace(eager, name=f"{bindings[owner]}/{name.rsplit('/', 1)[-1]}")
            with scratch.colocate_with(scratch.get_operation_by_name(bindings[owner])) if owner in bindings \
                    else contextlib.nullcontext():
                made = _graph_variable(eager, taken)
            variables[made.op.name] = eager
            bindings[name] = made.op.name
            if owner is None and eager.variable is not None:  # the program may set it (a metric: reset it)
                (summed_writes if eager.summed else writes)[made.op.name] = _host_write(made, eager)
    with scratch.as_default():
        meta = tf.compat.v1.train.export_meta_graph(graph=scratch)
    step_def = _bound(step_def, bindings)
    renamed = _name_update_scopes(step_def, set(variables))
    renamed.update(_name_regions(step_def, regions, bindings))
    clash = sorted({n.name for n in step_def.node} & {n.name for n in meta.graph_def.node})
    if clash:
        raise AnalysisError(f"the step {fn.python_function.__name__!r} has ops named as its variables' own "
                            f"({', '.join(clash[:5])}); rename the name scope of the step's ops or of the variables")
    meta.graph_def.node.extend(step_def.node)
    meta.graph_def.library.MergeFrom(step_def.library)

    def mine(name: str) -> str:  # a tensor's or op's name in the graph made
        op, index, _ = parse_input(cond_outputs.get(name, name))
        return f"{renamed.get(op, op)}:{index}" if ":" in name else renamed.get(op, op)

    effects = sorted({parse_input(mine(op.name))[0] for op in func_graph.control_outputs})
    meta.graph_def.node.add(name=STEP_OP, op="NoOp", input=[f"^{e}" for e in effects])
    meta.collection_def[tf.compat.v1.GraphKeys.TRAIN_OP].node_list.value.append(STEP_OP)
    if sums:
        meta.collection_def[REPLICA_SUMS].node_list.value.extend(mine(name) for name in sums)
    if exact:
        meta.collection_def[EXACT_DRAWS].node_list.value.extend(mine(name) for name in exact)
    if replica_marks:
        for key, name in zip((REPLICA_INDEX, REPLICA_COUNT), replica_marks):
            meta.collection_def[key].node_list.value.append(mine(name))
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.import_meta_graph(meta)
    args = [graph.get_tensor_by_name(mine(t.name)) for t in func_graph.inputs[:num_args]]
    outputs = tf.nest.map_structure(
        lambda t: graph.get_tensor_by_name(mine(t.name)) if isinstance(t, tf.Tensor) else t,
        func_graph.structured_outputs)
    train_op = graph.get_operation_by_name(STEP_OP)
    part_rows = graph.get_tensor_by_name(f"{mine(replica_marks[2])}:0") if replica_marks else None
    return TracedStep(graph, tuple(args), outputs, train_op, variables, signature, scratch, writes, fn, part_rows,
                      summed_writes)


@dataclass(frozen=True)
class _Eager:
    """An eager variable the step uses: its name, dtype, shape, trainability and value now, how to read it
    later (a slot made in the step comes as a bare handle, with no Variable object the function shows), and
    whether it is a sum over replicas (``summed``: synchronised on read with aggregation ``SUM``, as every Keras
    metric's state is; :mod:`parallax.tf2.summed`)."""

    name: str
    dtype: tf.DType
    value: np.ndarray
    trainable: bool
    read: Any
    write: Any
    summed: bool = False
    variable: Any = None  # the tf.Variable, where the step shows one

    @classmethod
    def of(cls, variable: Any) -> _Eager:
        dtype = variable.dtype.base_dtype
        return cls(variable.name.split(":")[0], variable.dtype, variable.numpy(), bool(variable.trainable),
                   _reader(variable.handle, dtype), variable.assign, is_summed(variable) and not variable.trainable,
                   variable)

    @classmethod
    def of_handle(cls, handle: Any, name: str) -> _Eager | None:
        from tensorflow.python.ops import gen_resource_variable_ops, resource_variable_ops

        data = resource_variable_ops.get_eager_safe_handle_data(handle)
        if data is None or not data.is_set or len(data.shape_and_type) != 1:
            return None
        dtype = tf.dtypes.as_dtype(data.shape_and_type[0].dtype)
        read = _reader(handle, dtype)

        def write(value: Any) -> None:
            gen_resource_variable_ops.assign_variable_op(handle, tf.convert_to_tensor(value, dtype))

        try:
            value = read().numpy()
        except tf.errors.OpError:  # not a variable's handle after all
            return None
        return cls(name, dtype, value, False, read, write)


def _reader(handle: Any, dtype: tf.DType) -> Any:
    """A read of the eager variable of ``handle``: the op alone (the host reads the step's variables between steps,
    where ``Variable.read_value``'s Python layers cost several times the op)."""
    from tensorflow.python.ops import gen_resource_variable_ops

    def read() -> tf.Tensor:
        return gen_resource_variable_ops.read_variable_op(handle, dtype)

    return read


def _graph_variable(variable: _Eager, taken: set[str]) -> tf.Variable:
    """A resource variable of the graph being built standing for the eager ``variable``."""
    base = re.sub(r"[^A-Za-z0-9_./-]", "_", variable.name) or "variable"
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    value = variable.value
    flat = value.reshape(-1)

    if flat.size and np.all(flat == flat[0]):  # a constant fill (zeros, ones): no copy of the values

        def initial() -> tf.Tensor:  # made under the variable's own name scope (<name>/Initializer/)
            return tf.fill(value.shape, tf.constant(flat[0], dtype=variable.dtype))
    else:
        # read from the eager variable when the process initialises (eagerly: a py_function), not copied in;
        # made apart from the variable (no colocation with it, nor with a slot's variable), so that it runs in the
        # worker's process, whose Python holds the eager variable, wherever the variable lives (a parameter
        # server's process has no such Python)
        graph = tf.compat.v1.get_default_graph()
        with graph.colocate_with(None, ignore_existing=True), tf.name_scope(f"{INITIAL_VALUE_PREFIX}/{name}/"):
            read = tf.ensure_shape(tf.py_function(variable.read, [], variable.dtype), value.shape)

        def initial() -> tf.Tensor:
            return read

    kept = dict(synchronization=tf.VariableSynchronization.ON_READ, aggregation=tf.VariableAggregation.SUM) \
        if variable.summed else {}  # a metric's state: each worker keeps its own (parallax.tf2.summed)
    made = tf.compat.v1.Variable(initial, name=name, trainable=variable.trainable, use_resource=True,
                                 dtype=variable.dtype, **kept)
    if made.op.name != name:
        raise AnalysisError(f"variable {variable.name!r} could not keep its name in the step's graph ({made.op.name})")
    return made


def _in_order(func_graph: Any, sums: list[str], step_def: graph_pb2.GraphDef) -> list[str]:
    """``sums`` (a synchronised batch normalisation's) and the counts of the step's masked losses, made sums in
    ``step_def``, in the order of the graph (every worker issues the sums in it, one waiting for the one before)."""
    divisions = masked_means(func_graph)
    made = set(sum_masked_counts(step_def, [name for _, name in divisions]))
    position = {op.name: k for k, op in enumerate(func_graph.get_operations())}
    found = [(position[name], name) for name in sums]
    found += [(k, f"{name}/{COUNTS_SUFFIX}") for k, name in divisions if f"{name}/{COUNTS_SUFFIX}" in made]
    return [name for _, name in sorted(found)]


def _host_write(made: tf.Variable, variable: _Eager) -> tuple[str, str]:
    """A placeholder of ``made``'s shape and the op that assigns it to ``made``: how the program's value of the
    eager ``variable``, set between steps, reaches the job (fed the same on every replica)."""
    scope = f"{HOST_WRITES_PREFIX}/{made.op.name}"
    value = tf.compat.v1.placeholder(variable.dtype, variable.value.shape, name=f"{scope}/value")
    write = made.assign(value, read_value=False, name=f"{scope}/write")
    return value.name, write.name


def _name_regions(graph_def: graph_pb2.GraphDef, regions: list, bindings: dict[str, str]) -> dict[str, str]:
    """Rename each update region's ops (:mod:`parallax.tf2.regions`) ``<scope>/update_<variable>/<rest>``
    and colocate them with the variable, as a TF1 optimizer builds an update, in place. Returns the new
    name of every renamed op."""
    renamed, variable_of = {}, {}
    for region in regions:
        variable = bindings[region.variable]
        for op in region.ops:
            scope, _, rest = op.partition("/")
            renamed[op] = f"{scope}/update_{variable}/{rest}" if rest else f"update_{variable}/{op}"
            variable_of[op] = variable
    for node in graph_def.node:
        if node.name in variable_of:
            node.attr["_class"].CopyFrom(attr_value_pb2.AttrValue(
                list=attr_value_pb2.AttrValue.ListValue(s=[colocation_group(variable_of[node.name])])))
        node.name = renamed.get(node.name, node.name)
        _rename_references(node, renamed)
    return renamed


def _slot_owners(step_def: graph_pb2.GraphDef, captures: set[str]) -> dict[str, str | None]:
    """For each capture placeholder, the capture it is an optimizer slot of (``None``: none): the one its
    placeholder is colocated with, or else the variable of the one traced update scope whose ops read it
    (a sparse update's slots come uncolocated)."""
    owners: dict[str, str | None] = {}
    scope_votes: dict[str, dict[str, int]] = {}
    readers: dict[str, set[str]] = {}
    for node in step_def.node:
        targets = colocated_with(node.attr["_class"].list.s) if "_class" in node.attr else []
        if node.name in captures:
            owners[node.name] = next((t for t in targets if t in captures and t != node.name), None)
            continue
        m = _TRACED_UPDATE.search(node.name)
        if m is None:
            continue
        scope = node.name[:m.end(2)]
        for t in targets:
            if t in captures:
                votes = scope_votes.setdefault(scope, {})
                votes[t] = votes.get(t, 0) + 1
        for text in node.input:
            source = parse_input(text)[0]
            if source in captures:
                readers.setdefault(source, set()).add(scope)
    variable_of = {scope: max(sorted(votes), key=votes.get) for scope, votes in scope_votes.items()}
    for name in captures:
        if owners.get(name) is None:
            scopes = readers.get(name, set())
            owner = variable_of.get(next(iter(scopes))) if len(scopes) == 1 else None
            owners[name] = owner if owner != name else None
    return owners


def _bound(graph_def: graph_pb2.GraphDef, bindings: dict[str, str]) -> graph_pb2.GraphDef:
    """``graph_def`` without the capture placeholders of ``bindings``, every input and colocation that
    named one naming what stands for it."""
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        if node.name in bindings:
            continue
        copy = out.node.add()
        copy.CopyFrom(node)
        copy.device = ""  # where the eager context put it (/job:localhost/...): Parallax places the ops
        _rename_references(copy, bindings)
    return out


def _rename_references(node, names: dict[str, str]) -> None:
    """Rename the inputs and ``loc:@`` colocations of ``node`` that ``names`` maps."""
    for i, text in enumerate(node.input):
        op, index, control = parse_input(text)
        if op in names:
            node.input[i] = format_input(names[op], index, control)
    if "_class" in node.attr:
        groups = [colocation_group(names.get(t[0], t[0])) if (t := colocated_with([g])) else g
                  for g in node.attr["_class"].list.s]
        node.attr["_class"].CopyFrom(attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(s=groups)))


def _name_update_scopes(graph_def: graph_pb2.GraphDef, variables: set[str]) -> dict[str, str]:
    """Rename a traced ``tf.compat.v1.train`` optimizer's ``update_``, ``update__1``... scopes
    ``update_<variable>`` after the variable each one updates (the one its ops are colocated with, as the
    optimizer colocates them), in place. Returns the new name of every renamed op."""
    votes: dict[str, dict[str, int]] = {}  # "<prefix>update__1" -> {variable: ops colocated with it}
    for node in graph_def.node:
        m = _TRACED_UPDATE.search(node.name)
        if m is None or "_class" not in node.attr:
            continue
        for target in colocated_with(node.attr["_class"].list.s):
            if target in variables:
                counts = votes.setdefault(node.name[:m.end(2)], {})
                counts[target] = counts.get(target, 0) + 1
    scopes = {scope: max(sorted(counts), key=counts.get) for scope, counts in votes.items()}
    renamed = {}
    for node in graph_def.node:
        m = _TRACED_UPDATE.search(node.name)
        if m is not None and node.name[:m.end(2)] in scopes:
            renamed[node.name] = f"{node.name[:m.start(2)]}update_{scopes[node.name[:m.end(2)]]}{node.name[m.end(2):]}"
    if renamed:
        for node in graph_def.node:
            node.name = renamed.get(node.name, node.name)
            _rename_references(node, renamed)
    return renamed
