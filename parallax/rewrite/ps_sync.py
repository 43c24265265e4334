"""Pass: synchronous training through parameter servers.

Each variable the plan marks ``ps`` lives on its server (see
:mod:`parallax.rewrite.placement`). For ``sync=True`` this pass adds, with
names that every worker computes alike:

* ``parallax_sync/<v>/accumulator``: a ``ConditionalAccumulator`` (dense) or
  ``SparseConditionalAccumulator`` (sparse) on ``<v>``'s server, shared by
  name, reduction ``SUM``;
* on every worker, ``parallax_sync/<v>/apply``: adds this worker's gradient
  (its replicas' sum divided by the total number of replicas, or just their
  sum for sparse gradients without ``average_sparse``) to the accumulator;
* on the chief (worker 0), ``parallax_sync/<v>/take``: waits for one
  gradient from every worker and returns their sum, which the update ops
  then read instead of the local gradient;
* ``parallax_sync/token_<w>``: one FIFO queue per other worker ``w`` on
  server 0. After the update the chief puts one token in each; worker ``w``
  takes its token before it may start the next step;
* ``parallax_sync/train_op``: what a fetch of the training op runs: on the
  chief, the original training op and then the tokens; elsewhere, the
  gradient applies and then this worker's token. The rewritten graph records
  the substitution in the ``parallax_fetch_alias`` collection.

Plans that mix servers and all-reduce (HYBRID, AUTO): the other workers also
run the original training op, for their own copies of the all-reduced
variables, with the server variables' update scopes made no-ops (the chief
updates those). With ``host_aggregation`` only the first worker of each host
sends the host's merged sparse gradients (the others still take part in the
host all-gather), and the chief takes one gradient per host.

The protocol per step: every worker applies its gradient; the chief takes
the sums, updates the variables (each on its server), and releases the
others. No worker can run ahead, so no gradient is stale and the result
equals one device on the union batch.

For ``sync=False`` nothing is added: every worker applies its own gradient
to the variables on the servers, without waiting for the others.
"""

from __future__ import annotations

import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from parallax.analysis import update_scope_owner
from parallax.errors import RewriteError
from parallax.plan.model import Plan, TaskSpec
from parallax.rewrite.aggregate import build_subgraph
from parallax.rewrite.graph_ops import add_nodes, format_input, parse_input
from parallax.rewrite.names import FETCH_ALIAS_COLLECTION, SYNC_PREFIX, aggregate_outputs

__all__ = ["add_ps_sync"]

_ALWAYS_FRESH = 2 ** 62  # local_step that is never stale: the token protocol keeps workers in step


def add_ps_sync(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec
                ) -> meta_graph_pb2.MetaGraphDef:
    """Add the synchronous PS protocol (see the module docstring). Returns a new MetaGraphDef.

    Raises:
        RewriteError: the graph has more than one training op.
    """
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    variables = [v for v in plan.variables if v.sync == "ps" and v.gradient is not None]
    if not plan.sync or not variables:
        return out
    if len(plan.train_ops) != 1:
        raise RewriteError(f"synchronous PS training supports one training op; the graph has "
                           f"{len(plan.train_ops)}: {', '.join(plan.train_ops)}")
    train_op = plan.train_ops[0]
    num_workers = plan.num_workers
    chief = task.worker_index == 0
    worker = plan.workers[task.worker_index]
    mixed = any(v.gradient is not None and v.sync != "ps" for v in plan.variables)
    hosts = list(dict.fromkeys(w.host for w in plan.workers))
    # One gradient per host (host aggregation), per worker (local aggregation) or per replica.
    listen: list[str] = []  # gradients this worker computes but does not send (its host's leader does)
    if plan.ps.host_aggregation:
        leader = next(i for i, w in enumerate(plan.workers) if w.host == worker.host) == task.worker_index
        senders = [None] if leader else []
        required = len(hosts)
        if not leader:
            listen = [f"^{parse_input(t)[0]}" for v in variables for t in aggregate_outputs(v.name, v.sparse)]
    elif plan.ps.local_aggregation:
        senders, required = [None], num_workers
    else:
        senders, required = list(range(len(worker.replica_devices))), plan.num_replicas

    names: list[str] = []
    dtypes: list[tf.DType] = []
    for v in variables:
        for sender in senders:
            names.extend(aggregate_outputs(v.name, v.sparse, sender))
            dtypes.append(tf.dtypes.as_dtype(v.gradient.dtype))
            if v.sparse:
                dtypes.append(tf.dtypes.as_dtype(v.gradient.indices_dtype))
    names.append(f"^{train_op}")  # a control input on the original training op
    dtypes.append(tf.float32)
    names.extend(listen)
    dtypes.extend([tf.float32] * len(listen))

    def builder(inputs):
        applies, takes = [], []
        position = 0
        for v in variables:
            scope = f"{SYNC_PREFIX}/{v.name}/"
            with tf.name_scope(scope):
                dtype = tf.dtypes.as_dtype(v.gradient.dtype)
                shape = tf.TensorShape([d for d in v.shape])
                if v.sparse:
                    acc = tf.compat.v1.SparseConditionalAccumulator(
                        dtype, shape=shape, shared_name=f"{scope}accumulator", name="accumulator",
                        reduction_type="SUM")
                    for _ in senders:
                        values, indices = inputs[position], inputs[position + 1]
                        position += 2
                        applies.append(acc.apply_grad(tf.cast(indices, tf.int64), values,
                                                      local_step=_ALWAYS_FRESH, name="apply"))
                    if chief:
                        with tf.control_dependencies(applies):
                            taken = acc.take_indexed_slices_grad(required, name="take")
                        takes.extend([taken.values, tf.cast(taken.indices, indices.dtype)])
                else:
                    acc = tf.compat.v1.ConditionalAccumulator(
                        dtype, shape=shape, shared_name=f"{scope}accumulator", name="accumulator",
                        reduction_type="SUM")
                    for _ in senders:
                        grad = inputs[position]
                        position += 1
                        applies.append(acc.apply_grad(grad, local_step=_ALWAYS_FRESH, name="apply"))
                    if chief:
                        with tf.control_dependencies(applies):
                            takes.append(acc.take_grad(required, name="take"))
        original = inputs[position]
        heard = [t.op for t in inputs[position + 1:]]
        with tf.name_scope(f"{SYNC_PREFIX}/"):
            queues = {w: tf.queue.FIFOQueue(-1, [tf.int64], shapes=[[]], shared_name=f"{SYNC_PREFIX}/token_{w}",
                                            name=f"token_{w}") for w in range(1, num_workers)
                      if chief or w == task.worker_index}
            if chief:
                with tf.control_dependencies([original.op]):
                    releases = [q.enqueue(tf.constant(0, tf.int64), name=f"release_{w}") for w, q in queues.items()]
                done = tf.group(original.op, *releases, name="train_op")
            else:
                # Mixed plans: this worker also runs the training op, for its own copies of
                # the all-reduced variables (the server variables' updates are taken out).
                before = applies + heard + ([original.op] if mixed else [])
                with tf.control_dependencies(before):
                    token = queues[task.worker_index].dequeue(name="wait")
                done = tf.group(token, name="train_op")
        return [done] + takes

    nodes, outputs = build_subgraph(builder, dtypes, names, "")
    token_device = plan.server_devices[0]
    server_of = {v.name: plan.server_devices[v.server] for v in variables}
    for node in nodes:
        scope = node.name[len(SYNC_PREFIX) + 1:]
        var = next((name for name in sorted(server_of, key=len, reverse=True) if scope.startswith(name + "/")),
                   None)
        if var is not None:
            node.device = server_of[var]
        elif node.name.startswith(f"{SYNC_PREFIX}/token_") or "/release_" in node.name or \
                node.name == f"{SYNC_PREFIX}/wait":
            node.device = token_device
        else:
            node.device = worker.shared_device
    # The chief's train op must not depend on a placeholder for the original op (replaced above).
    if chief:
        takes = outputs[1:]
        rewire = {}
        position = 0
        for v in variables:
            for original in aggregate_outputs(v.name, v.sparse):
                op, index, _ = parse_input(takes[position])
                rewire[original] = format_input(op, index, False)
                position += 1
        for node in out.graph_def.node:
            if node.name.startswith(("parallax_aggregate/", f"{SYNC_PREFIX}/")):
                continue
            for i, text in enumerate(node.input):
                op, index, control = parse_input(text)
                key = f"{op}:{index}"
                if not control and key in rewire:
                    node.input[i] = rewire[key]
    if mixed and not chief:
        _drop_server_updates(out, plan, {v.name for v in variables}, worker.shared_device)
    add_nodes(out.graph_def, nodes)
    alias = out.collection_def[FETCH_ALIAS_COLLECTION].bytes_list.value
    alias.append(f"{train_op}={parse_input(outputs[0])[0]}".encode())
    return out


def _drop_server_updates(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, on_servers: set[str],
                         device: str) -> None:
    """On a worker other than the chief, the ops of the server variables'
    ``update_<var>`` scopes become no-ops: the chief updates those variables."""
    owner = update_scope_owner([v.name for v in plan.variables])
    dropped = set()
    for node in meta_graph.graph_def.node:
        if owner(node.name) in on_servers:
            dropped.add(node.name)
            node.op = "NoOp"
            del node.input[:]
            for key in list(node.attr):
                del node.attr[key]
            node.device = device
    for node in meta_graph.graph_def.node:
        if node.name in dropped:
            continue
        for text in node.input:
            op, _, control = parse_input(text)
            if op in dropped and not control:
                raise RewriteError(f'op "{node.name}" reads the output of "{op}", an update of a variable on the '
                                   "parameter servers; this graph cannot mix servers and all-reduce "
                                   "(use run_option='PS' or 'MPI')")
