"""Pass: aggregate the replicas' gradients, within the worker and across workers.

Ops added, on the worker's shared device, for every variable with a gradient
(``<v>`` is the variable's name):

1. local: ``parallax_aggregate/<v>/local/``: ``AddN`` of this worker's
   replicas' dense gradients; ``ConcatV2`` of their sparse values and of
   their indices;
2. across workers (ZeRO stage 2: the sharded variables' gradients flattened and
   reduce-scattered, ``parallax_aggregate/reducescatter/``: each worker gets its part,
   :mod:`parallax.rewrite.zero`), for variables whose plan says ``allreduce`` or
   ``allgather``: the backend's ops under ``parallax_aggregate/allreduce/``
   (dense sums; a sparse gradient is first summed into the variable's shape,
   ``<v>/densify/``, with a count of the replicas that touched each row, and
   the touched rows are taken back out after, ``<v>/resparsify/``) and
   ``parallax_aggregate/allgather/`` (sparse values and indices; first the
   rows with equal indices summed, ``<v>/dedup/``, when the update sums them
   itself before anything else, :attr:`GradientRef.repeats_merged`). The dense
   ones go in the order the backward pass makes them ready, in buckets, one
   backend call each (``allreduce/bucket_<k>/``), so that the first buckets cross
   while the backward pass goes on (:mod:`parallax.rewrite.readiness`; with
   ``CommSpec.overlap`` off, or gradients that make one bucket only, one call after every gradient is there,
   ``allreduce/after_backward/``); the backend fuses and orders each call's
   tensors, and issues the calls in order; for sparse variables on
   parameter servers (synchronous, with local aggregation), the rows with equal indices
   summed when the update sums them first anyway (``<v>/dedup/``: each row is
   sent once; a batch of Zipf-distributed words repeats a third of its ids),
   and with ``host_aggregation`` a gather of these rows of the
   host's workers to its first worker, which sends them to the servers
   (``parallax_aggregate/host/``), and there merged (``<v>/merge/``: one row
   per index; the other workers' results have no rows, and they send none);
   With ``CommSpec.compression`` (fp16, bf16) the all-reduced and all-gathered
   floating tensors are cast to 16 bits before the backend's ops and back after
   (:mod:`parallax.comm.compression`; fp16 first all-reduces each tensor's largest
   magnitude to agree on its scale);
3. ``parallax_aggregate/<v>/grad`` (dense) or ``.../values`` and
   ``.../indices`` (sparse): the result, divided by the total number of
   replicas when the plan says ``mean`` (by this worker's replicas in
   asynchronous PS, where each worker applies its own gradient).

The update ops (the shared ops on the path to the training op) then read the
result instead of replica 0's gradient. Other readers of a gradient (say, a
logged gradient norm) keep their own replica's value.
"""

from __future__ import annotations

import contextlib

import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from parallax.comm.compression import compressed_allgather, compressed_allreduce
from parallax.comm.registry import backend_for
from parallax.errors import RewriteError
from parallax.graph.graph_ops import add_nodes, canonical, format_input, node_map, parse_input, rewire_inputs
from parallax.graph.names import (
    AGGREGATE_PREFIX,
    aggregate_scope,
    aggregate_step_scope,
    replica_tensor_name,
)
from parallax.plan.buckets import overlap_buckets
from parallax.plan.model import CommSpec, Plan, Sync, TaskSpec, VariablePlacement
from parallax.rewrite.classify import classify
from parallax.rewrite.readiness import readiness_order

__all__ = ["aggregate_gradients", "build_subgraph"]


def build_subgraph(builder, input_dtypes: list[tf.DType], input_names: list[str], scope: str):
    """Build ops with real TF code in a scratch graph and return their NodeDefs.

    ``builder`` gets one placeholder per input and returns output tensors; the
    placeholders are then replaced by ``input_names`` (tensor names of the
    graph being rewritten). Returns ``(nodes, output tensor names)``.
    """
    graph = tf.Graph()
    with graph.as_default():
        placeholders = [tf.compat.v1.placeholder(d, name=f"parallax_input_{i}")
                        for i, d in enumerate(input_dtypes)]
        with tf.name_scope(scope):
            outputs = builder(placeholders)
    replace = {p.op.name: input_names[i] for i, p in enumerate(placeholders)}
    nodes = []
    for node in graph.as_graph_def().node:
        if node.name in replace:
            continue
        for i, text in enumerate(node.input):
            name, _, control = parse_input(text)
            if name in replace:
                target = replace[name]
                node.input[i] = format_input(parse_input(target)[0], 0, True) if control else target
        nodes.append(node)
    return nodes, [t.name for t in outputs]


class _Layout:
    """Where each variable's inputs sit in the flat input list of the scratch graph, and after them each
    replica sum's (``sums``: the tensors that stand for a sum over the replicas, :data:`REPLICA_SUMS`)."""

    def __init__(self, plan: Plan, num_local: int, sums: list[tuple[str, tf.DType]] = ()) -> None:
        self.variables: list[VariablePlacement] = [v for v in plan.variables if v.gradient is not None]
        self.names: list[str] = []
        self.dtypes: list[tf.DType] = []
        self.slices: dict[str, tuple[int, int]] = {}
        self.sums = list(sums)
        for var in self.variables:
            start = len(self.names)
            parts = [(var.gradient.tensor, var.gradient.dtype)]
            if var.sparse:
                parts.append((var.gradient.indices, var.gradient.indices_dtype))
            for tensor, dtype in parts:
                for r in range(num_local):
                    self.names.append(replica_tensor_name(tensor, r))
                    self.dtypes.append(tf.dtypes.as_dtype(dtype))
            self.slices[var.name] = (start, len(self.names))
        self.sums_start = len(self.names)
        for tensor, dtype in self.sums:
            self.names.extend(replica_tensor_name(tensor, r) for r in range(num_local))
            self.dtypes.extend([dtype] * num_local)


def _build(plan: Plan, layout: _Layout, num_local: int, backend_nodes: list, order: list[str]):
    """The scratch-graph builder: local reduce, cross-worker reduce, scale, name. ``order``: the variables
    in the order the backward pass makes their gradients ready (:func:`readiness_order`)."""

    def builder(inputs: list[tf.Tensor]) -> list[tf.Tensor]:
        local: dict[str, tuple] = {}
        for var in layout.variables:
            start, end = layout.slices[var.name]
            ins = inputs[start:end]
            with tf.name_scope(aggregate_scope(var.name) + "local/"):
                if var.sparse:
                    values, indices = ins[:num_local], ins[num_local:]
                    local[var.name] = (_concat(values), _concat(indices))
                else:
                    local[var.name] = (tf.math.add_n(ins) if num_local > 1 else tf.identity(ins[0]),)
        crossed = dict(local)
        compression = plan.comm.compression
        readiness = {name: k for k, name in enumerate(order)}
        made: dict[tuple[str, str], object] = {}
        last = None  # the backend that communicated last: the next one follows it (one order of calls)

        def backend(name: str, group: str = ""):
            """One object per backend and group (a backend numbers its collectives itself)."""
            nonlocal last
            if (name, group) not in made:
                made[name, group] = backend_for(plan.comm, plan.num_workers, name, group)
                backend_nodes.append(made[name, group])
            chosen = made[name, group]
            if last is not None and last is not chosen:
                chosen.follow(last)
            last = chosen
            return chosen

        sums = _replica_sums(inputs[layout.sums_start:], num_local, plan.num_workers,
                             lambda: backend(plan.comm.backend))
        dense = plan.all_reduced_whole  # what Plan.overlaps_backward buckets
        scattered = [v for v in layout.variables if v.sync is Sync.ALLREDUCE and v not in dense]
        if dense:
            with tf.name_scope(aggregate_step_scope("allreduce")):
                summed = _allreduced(dense, local, readiness, plan.comm, plan.overlaps_backward,
                                     backend(plan.comm.backend))
            for v in dense:
                if v.sparse:  # the summed rows, and the count of replicas that touched each row
                    crossed[v.name] = _resparsified(v, *summed[v.name])
                else:
                    crossed[v.name] = (summed[v.name][0],)
        if scattered:  # ZeRO stage 2: each worker gets its part of the sum (parallax.rewrite.zero)
            with tf.name_scope(aggregate_step_scope("reducescatter")):
                parts = backend(plan.comm.backend).reduce_scatter_sum(
                    [tf.reshape(local[v.name][0], [v.num_elements]) for v in scattered])
            for v, part in zip(scattered, parts):
                crossed[v.name] = (part,)
        sparse = [v for v in layout.variables if v.sync is Sync.ALLGATHER]
        for v in sparse:  # the update sums repeated rows first anyway: send each row once
            if v.gradient.repeats_merged:
                local[v.name] = _merged(v, *local[v.name], "dedup/")
        if sparse:
            with tf.name_scope(aggregate_step_scope("allgather")):
                gathering = backend(plan.comm.gather_backend)
                pairs = [local[v.name] for v in sparse]
                gathered = compressed_allgather(pairs, compression, gathering.allgather, gathering.allreduce_sum)
            for v, pair in zip(sparse, gathered):
                crossed[v.name] = pair
        pushed = [v for v in layout.variables
                  if v.sync is Sync.PS and v.sparse and plan.ps.local_aggregation and plan.sync]
        for v in pushed:  # the update sums rows by index first anyway: send each row once
            if v.gradient.repeats_merged:
                crossed[v.name] = _merged(v, *local[v.name], "dedup/")
        host_vars = [v for v in pushed if plan.ps.host_aggregation]
        if host_vars:
            with tf.name_scope(aggregate_step_scope("host")):
                gathered = backend(plan.comm.host_backend, group="host").gather(
                    [crossed[v.name] for v in host_vars])
            for v, (values, indices) in zip(host_vars, gathered):
                crossed[v.name] = _merged(v, values, indices, "merge/") if v.gradient.repeats_merged \
                    else (values, indices)
        outputs = []
        for var in layout.variables:
            # the mean over every replica of the job where the update gets every worker's gradient (all-reduced,
            # all-gathered, or summed by the chief in synchronous PS); asynchronous PS applies each worker's own
            # gradient alone, as TF's between-graph training does: the mean over this worker's replicas
            across = var.sync.collective or (var.sync is Sync.PS and plan.sync)
            total = plan.num_replicas if across else num_local
            with tf.name_scope(aggregate_scope(var.name)):
                first = _scaled(crossed[var.name][0], var, total)
                if var.sparse:
                    outputs.append(tf.identity(first, name="values"))
                    outputs.append(tf.identity(crossed[var.name][1], name="indices"))
                else:
                    outputs.append(tf.identity(first, name="grad"))
                if var.sync is Sync.PS and not plan.ps.local_aggregation:
                    _per_replica_outputs(var, inputs[slice(*layout.slices[var.name])], num_local, total)
        return outputs + sums

    return builder


def _replica_sums(inputs: list[tf.Tensor], num_local: int, num_workers: int, summing) -> list[tf.Tensor]:
    """Each replica sum's total over the job (``inputs``: each sum's tensor on every local replica, sum after
    sum), first in the backend's order of calls: one call each, in the order of the graph (a sum waits for the
    one before it in a step, as the forward and backward passes make them)."""
    totals = []
    with tf.name_scope(aggregate_step_scope("replica_sums")):
        for k in range(0, len(inputs), num_local):
            local = tf.math.add_n(inputs[k:k + num_local]) if num_local > 1 else tf.identity(inputs[k])
            totals.append(summing().allreduce_sum([local])[0] if num_workers > 1 else local)
    return totals


def _allreduced(dense: list[VariablePlacement], local: dict[str, tuple], readiness: dict[str, int], comm: CommSpec,
                overlap: bool, summing) -> dict[str, list[tf.Tensor]]:
    """Each variable's all-reduced tensors (:func:`_densified`), by variable name.

    With ``overlap`` (:attr:`Plan.overlaps_backward`): the variables in the order their gradients become
    ready (``readiness``), in consecutive buckets (:func:`overlap_buckets`), one call of the backend per bucket under
    ``bucket_<k>/``: each call waits for its own gradients only, so the first buckets cross while the
    backward pass computes the rest (the backend issues its calls in this order). Without it, one
    call of every gradient in plan order, after every gradient is there (``after_backward/``).
    """
    tensors = {v.name: _densified(v, local[v.name]) for v in dense}
    if not overlap:
        everything = [t for v in dense for t in tensors[v.name]]
        with tf.name_scope("after_backward"), tf.control_dependencies(everything):
            waited = iter([tf.identity(t) for t in everything])
        tensors = {v.name: [next(waited) for _ in tensors[v.name]] for v in dense}
        buckets = [dense]
    else:
        ordered = sorted(dense, key=lambda v: readiness[v.name])
        sizes = [v.num_bytes for v in ordered]  # the scratch graph's inputs have no static shapes
        buckets = [[ordered[i] for i in bucket] for bucket in overlap_buckets(sizes, comm.fusion_bytes)]
    summed: dict[str, list[tf.Tensor]] = {}
    for k, bucket in enumerate(buckets):
        members = [t for v in bucket for t in tensors[v.name]]
        with tf.name_scope(f"bucket_{k}") if overlap else contextlib.nullcontext():
            results = iter(compressed_allreduce(members, comm.compression, summing.allreduce_sum))
        summed.update({v.name: [next(results) for _ in tensors[v.name]] for v in bucket})
    return summed


def _merged(var: VariablePlacement, values: tf.Tensor, indices: tf.Tensor, scope: str) -> tuple[tf.Tensor, tf.Tensor]:
    """The rows of a sparse gradient with equal indices summed: ``(values, indices)``, each index once."""
    with tf.name_scope(aggregate_scope(var.name) + scope):
        unique, position = tf.unique(indices)
        return tf.math.unsorted_segment_sum(values, position, tf.size(unique)), unique


def _per_replica_outputs(var: VariablePlacement, ins: list[tf.Tensor], num_local: int, total: int) -> None:
    """Without local aggregation each replica sends its own gradient: name each one,
    scaled like the aggregate (``<v>/grad_<r>``, or ``values_<r>`` and ``indices_<r>``)."""
    for r in range(num_local):
        if var.sparse:
            tf.identity(_scaled(ins[r], var, total), name=f"values_{r}")
            tf.identity(ins[num_local + r], name=f"indices_{r}")
        else:
            tf.identity(_scaled(ins[r], var, total), name=f"grad_{r}")


def _densified(var: VariablePlacement, local: tuple) -> list[tf.Tensor]:
    """What to all-reduce for ``var``: its dense gradient, or for a sparse one the
    rows summed into the variable's shape plus how often each row was touched."""
    if not var.sparse:
        return [local[0]]
    values, indices = local
    rows = var.shape[0]
    if rows is None:
        raise RewriteError(f'cannot all-reduce the sparse gradient of "{var.name}" as a dense one: its first '
                           'dimension is unknown; use sync "allgather" or "ps" for it')
    with tf.name_scope(aggregate_scope(var.name) + "densify/"):
        dense = tf.math.unsorted_segment_sum(values, indices, rows)
        touched = tf.math.unsorted_segment_sum(tf.ones_like(indices, dtype=values.dtype), indices, rows)
    return [dense, touched]


def _resparsified(var: VariablePlacement, dense: tf.Tensor, touched: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The rows some replica touched, as values and indices again (each row once)."""
    with tf.name_scope(aggregate_scope(var.name) + "resparsify/"):
        indices = tf.reshape(tf.where(touched > 0), [-1])
        values = tf.gather(dense, indices)
        return values, tf.cast(indices, tf.dtypes.as_dtype(var.gradient.indices_dtype))


def _scaled(gradient: tf.Tensor, var: VariablePlacement, total: int) -> tf.Tensor:
    """``gradient`` divided by the number of replicas when the plan averages ``var``."""
    if var.aggregation == "mean" and total > 1:
        return gradient / tf.constant(total, dtype=gradient.dtype)
    return gradient


def _concat(tensors: list[tf.Tensor]) -> tf.Tensor:
    return tf.concat(tensors, 0) if len(tensors) > 1 else tf.identity(tensors[0])


def aggregate_gradients(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec
                        ) -> meta_graph_pb2.MetaGraphDef:
    """Aggregate every variable's gradient as the plan says (see the module docstring).

    Args:
        meta_graph: the graph after :func:`replicate_graph` (not modified).
        plan: the job's plan.
        task: the worker to rewrite for.

    Returns:
        A new MetaGraphDef.
    """
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    worker = plan.workers[task.worker_index]
    num_local = len(worker.replica_devices)
    layout = _Layout(plan, num_local, _sums_of(out.graph_def, plan.replica_sums))
    if not layout.variables:
        return out
    backends: list = []
    order = [v.name for v in layout.variables]
    if plan.overlaps_backward:
        order = readiness_order(out.graph_def, {v.name: layout.names[slice(*layout.slices[v.name])]
                                                for v in layout.variables})
    nodes, outputs = build_subgraph(_build(plan, layout, num_local, backends, order), layout.dtypes, layout.names,
                                    AGGREGATE_PREFIX + "/")
    for backend in backends:
        backend.finalize_nodes(nodes)
    for node in nodes:
        node.device = worker.shared_device
    rewire: dict[str, str] = {}
    position = 0
    for var in layout.variables:
        parts = [var.gradient.tensor] + ([var.gradient.indices] if var.sparse else [])
        for original in parts:
            op, index, _ = parse_input(outputs[position])
            rewire[canonical(original)] = format_input(op, index, False)
            position += 1
    update_path = classify(out.graph_def, plan).update_path
    graph_nodes = node_map(out.graph_def)
    rewire_inputs([graph_nodes[name] for name in sorted(update_path)], rewire)
    # every reader of a replica's sum (its IdentityN's output) reads the job's total instead
    rewire_inputs(out.graph_def.node, {replica_tensor_name(tensor, r): format_input(*parse_input(total)[:2], False)
                                        for (tensor, _), total in zip(layout.sums, outputs[position:])
                                        for r in range(num_local)})
    add_nodes(out.graph_def, nodes)
    return out


def _sums_of(graph_def, names: tuple[str, ...]) -> list[tuple[str, tf.DType]]:
    """The tensors that stand for sums over the replicas (``names``: ``IdentityN`` ops whose first half of
    outputs are their first half of inputs, summed, :attr:`Plan.replica_sums`) and their dtypes, in order."""
    nodes = node_map(graph_def) if names else {}
    sums = []
    for name in names:
        node = nodes[name]
        types = node.attr["T"].list.type
        sums.extend((f"{node.name}:{i}", tf.dtypes.as_dtype(types[i])) for i in range(len(types) // 2))
    return sums
