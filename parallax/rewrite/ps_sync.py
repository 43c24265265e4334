"""Pass: synchronous training through parameter servers.

Each variable the plan marks ``ps`` lives on its server (see
:mod:`parallax.rewrite.placement`). For ``sync=True`` this pass adds, with
names that every worker computes alike:

* ``parallax_sync/<v>/accumulator``: a ``ConditionalAccumulator`` on a dense
  ``<v>``'s server, shared by name, reduction ``SUM``; for a sparse ``<v>``,
  ``parallax_sync/<v>/rows``: a ``FIFOQueue`` of ``(values, indices)`` there;
* on every worker, ``parallax_sync/<v>/apply``: adds this worker's gradient
  (its replicas' sum divided by the total number of replicas, or just their
  sum for sparse gradients without ``average_sparse``) to the accumulator, or
  puts its rows in the queue;
* on the chief (worker 0), ``parallax_sync/<v>/take``: waits for one
  gradient from every worker and returns their sum (sparse: every sender's
  rows, concatenated; the update sums rows of equal index, as it does on one
  device), which the update ops then read instead of the local gradient;
* small dense gradients bound for one server (below
  :data:`parallax.comm.packing.PACK_BELOW_BYTES`, one dtype) are pushed
  packed: ``parallax_sync/step/<t>/pack_<k>_<sender>`` concatenates them on
  the worker, one accumulator ``parallax_sync/step/<t>/packed_<k>/`` takes
  them, and the chief's ``unpack`` there splits the sum again. One transfer
  per server instead of one per variable;
* with ``CommSpec.compression`` (fp16, bf16), each push is cast to 16 bits on the
  worker (``parallax_sync/step/<t>/compress_<k>/``, with fp16's scale) and back on
  the server, in the scope of the accumulator or queue it goes to: the 16-bit
  tensor is what crosses (:mod:`parallax.comm.compression`);
* for every training op ``<t>`` (the op an optimizer's ``apply_gradients``
  returns) that updates server variables, under ``parallax_sync/step/<t>/``:
  ``token_<w>``, one FIFO queue per other worker ``w`` on server 0. On the
  chief, ``release_<w>`` puts one token in each. Worker ``w`` takes its token
  (``wait``) at the end of its own step. When the tokens are put:

  - as soon as the update is done, inside the chief's step
    (``release_in_step``), when nothing but the update writes a server
    variable (:func:`written_after`). This saves the chief a second ``run``
    per step. The tokens follow the step's writes on the servers
    (:func:`_server_writes`), not the training op on the chief, which would
    add a round trip between the chief and the servers to every step;
  - otherwise (an EMA or moving statistics run after the update), or with
    the user's hooks (``PSSpec.release_in_step`` off), by the session
    (:class:`parallax.session.ParallaxSession`), which runs ``release`` after
    every ``run`` that ran ``<t>``, so the whole step (the update, what the
    program runs after it, the hooks) is done before anyone goes on.

  Either way a worker that reads any server variable after its step sees
  the chief's whole step;
* the training op itself is renamed ``parallax_sync/step/<t>/unsynchronised``
  and a new op takes its name ``<t>``: on the chief, the original training op
  (which waits for every worker's gradient); elsewhere, the gradient applies
  and then this worker's token. Every op the program built on the training op
  (``tf.group(train_op, *update_ops)``, an ``ExponentialMovingAverage`` under
  ``control_dependencies([train_op])``, a fetch by name) therefore runs the
  protocol; nothing is substituted at fetch time.

Several training ops (two optimizers in one ``tf.group``, or a GAN's two
ops run in turn) each get their own tokens: each is a protocol of its own,
over the server variables it updates.

Only the chief writes server variables: on the other workers every other op
that writes one (an EMA of the weights, batch-norm moving statistics kept on
a server, the program's own increment of the global step or assignment of a
learning rate, a saver's restore) runs nothing, so that it runs once per step,
as on one device; it keeps its name and output, with the value one device
gives (:func:`_drop_server_writes`). The program's writes outside a step take
the writes barrier under ``parallax_sync/writes/``: ``token_<w>`` queues on
server 0, the chief's ``release`` (a token to each other worker), each other
worker's ``wait``; the session runs ``release`` after, ``wait`` before, a run
that makes such a write and trains nothing (:class:`parallax.session.WritesBarrier`),
and the writes' names are in the collection :data:`PROGRAM_WRITES`.

Plans that mix servers and all-reduce (HYBRID, AUTO): the other workers also
run the original training op, for their own copies of the all-reduced
variables, with the server variables' update scopes made no-ops (the chief
updates those). With ``host_aggregation`` only the first worker of each host
sends the host's merged sparse gradients (the others send theirs to it, in the
host gather), and the chief takes one gradient per host.

The protocol per step: every worker applies its gradient; the chief takes
the sums, updates the variables (each on its server), and releases the
others. No worker can run ahead, so no gradient is stale and the result
equals one device on the union batch.

For ``sync=False`` nothing is added: every worker applies its own gradient
to the variables on the servers, without waiting for the others.
"""

from __future__ import annotations

import itertools

import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from parallax.analysis import VARIABLE_OP_TYPES, update_scope_owner
from parallax.comm.compression import decompress, for_push
from parallax.comm.packing import elements, pack, packed_groups, static_nbytes, unpack
from parallax.errors import RewriteError
from parallax.plan.model import Plan, TaskSpec, VariablePlacement
from parallax.rewrite.aggregate import build_subgraph
from parallax.rewrite.graph_ops import (
    add_nodes,
    ancestors,
    consumers,
    descendants,
    enclosing_scope,
    format_input,
    is_variable_write,
    make_no_op,
    node_map,
    parse_input,
    written_variable,
)
from parallax.rewrite.names import (
    SYNC_PREFIX,
    WRITES_SCOPE,
    aggregate_outputs,
    is_parallax_op,
    sync_scope,
    unsynchronised_train_op,
    variable_sync_scope,
)

__all__ = ["add_ps_sync", "variables_by_train_op", "program_writes", "UNSYNCHRONISED", "PROGRAM_WRITES"]

#: The collection of the ops whose value a worker other than the chief cannot give as one device would in a
#: run that also trains (see :func:`_drop_server_writes`): the session refuses such a fetch there.
UNSYNCHRONISED = "parallax_unsynchronised"
#: The collection of the program's writes of server variables outside a training step: a ``run`` of any of
#: them takes the writes barrier (:func:`_add_writes_barrier`).
PROGRAM_WRITES = "parallax_program_writes"

_TAKEN = "taken"  # the chief's group of its takes, under the training op's sync scope
_PACKED = "packed_"  # the scope of a packed accumulator, under the training op's sync scope
_COMPRESS = "compress_"  # the scope of a push's compression, on the worker, under the training op's sync scope
_ALWAYS_FRESH = 2 ** 62  # local_step that is never stale: the token protocol keeps workers in step
#: Ops of a conditional or a loop (graph-mode control flow, and the functional forms)
_CONTROL_FLOW = frozenset({"Switch", "RefSwitch", "Merge", "RefMerge", "Enter", "RefEnter", "Exit", "RefExit",
                           "NextIteration", "RefNextIteration", "If", "StatelessIf", "While", "StatelessWhile",
                           "Case", "StatelessCase"})
_CALLS = frozenset({"PartitionedCall", "StatefulPartitionedCall"})


def variables_by_train_op(graph_def, plan: Plan) -> list[tuple[str, list[VariablePlacement]]]:
    """The training ops with the variables (with a gradient) each one updates, in plan order.

    A training op that runs another one (a ``tf.group`` that the program also
    put in the ``train_op`` collection) adds nothing of its own: the inner
    one carries the protocol.

    Raises:
        RewriteError: a variable is updated by two training ops, or by none.
    """
    nodes = node_map(graph_def)
    owner = update_scope_owner([v.name for v in plan.variables])
    closures = {t: ancestors(nodes, [t]) for t in plan.train_ops}
    inner = [t for t in plan.train_ops if not any(o != t and o in closures[t] for o in plan.train_ops)]
    updated = {t: {owner(name) for name in closures[t]} - {None} for t in inner}
    groups = []
    for t in inner:
        mine = [v for v in plan.variables if v.gradient is not None and v.name in updated[t]]
        groups.append((t, mine))
    for v in plan.variables:
        if v.gradient is None:
            continue
        users = [t for t in inner if v.name in updated[t]]
        if len(users) > 1:
            raise RewriteError(f'variable "{v.name}" is updated by two training ops ({", ".join(users)}); '
                               "synchronous PS training needs each variable updated by one optimizer call. "
                               "Use one optimizer (or one apply_gradients) per variable, or run_option='MPI'")
        if not users:
            raise RewriteError(f'the update of variable "{v.name}" is reached from no training op '
                               f"({', '.join(plan.train_ops)}); build it with optimizer.minimize() or "
                               "apply_gradients()")
    return groups


def add_ps_sync(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec
                ) -> meta_graph_pb2.MetaGraphDef:
    """Add the synchronous PS protocol (see the module docstring). Returns a new MetaGraphDef.

    Raises:
        RewriteError: a variable is updated by two training ops, or a worker-side
            op reads the result of a server variable's update.
    """
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    if not plan.sync or not any(v.sync == "ps" and v.gradient is not None for v in plan.variables):
        return out
    chief = task.worker_index == 0
    worker = plan.workers[task.worker_index]
    waits: dict[str, str] = {}  # server variable -> the wait for the chief's token of its training op
    # a variable each worker keeps (a metric's state, parallax.tf2.summed): every worker runs the training op
    kept = any(v.summed for v in plan.variables)
    mixed_plan = kept or any(v.gradient is not None and v.sync != "ps" for v in plan.variables)
    for train_op, variables in variables_by_train_op(out.graph_def, plan):
        synced = [v for v in variables if v.sync == "ps"]
        if synced:
            mixed = kept or len(synced) < len(variables)
            _add_protocol(out, plan, task, train_op, synced, mixed)
            waits.update({v.name: f"{sync_scope(train_op)}wait" for v in synced})
    after_step, outside = program_writes(out, plan)
    if outside and plan.num_workers > 1:
        _add_writes_barrier(out, plan, task, outside)
    if not chief:
        # in a mixed plan this worker's wait follows its own training op, which holds the dropped updates
        _drop_server_updates(out, plan, waits, worker.shared_device, wait=not mixed_plan)
        _drop_server_writes(out, plan, worker.shared_device, after_step, outside)
    return out


def _add_protocol(out: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec, train_op: str,
                  variables: list[VariablePlacement], mixed: bool) -> None:
    """The accumulators, tokens and renamed training op of one training op."""
    num_workers = plan.num_workers
    chief = task.worker_index == 0
    worker = plan.workers[task.worker_index]
    hosts = list(dict.fromkeys(w.host for w in plan.workers))
    original_name = unsynchronised_train_op(train_op)
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
    names.append(f"^{original_name}")  # a control input on the original training op
    dtypes.append(tf.float32)
    in_step = chief and plan.ps.release_in_step and not written_after(out, plan, train_op)
    # (the training op itself, when it writes one, by the name it is about to take)
    writes = [original_name if w == train_op else w
              for w in (_server_writes(out.graph_def, plan, train_op) if in_step else [])]
    names.extend(f"^{w}" for w in writes)
    dtypes.extend([tf.float32] * len(writes))
    names.extend(listen)
    dtypes.extend([tf.float32] * len(listen))
    step_scope = sync_scope(train_op)
    server_of = {v.name: plan.server_devices[v.server] for v in variables}
    packed, _ = _push_groups(variables, server_of)
    packed_of = {v.name: k for k, group in enumerate(packed) for v in group}

    pushes = itertools.count()

    def sent(tensor: tf.Tensor) -> tf.Tensor:
        """``tensor`` compressed on the worker (``CommSpec.compression``) and decompressed in the caller's
        scope, on the server: what crosses between them is the compressed tensor."""
        with tf.name_scope(f"{step_scope}{_COMPRESS}{next(pushes)}/"):
            wire, scale = for_push(tensor, plan.comm.compression)
        return decompress(wire, tensor.dtype, scale)

    def builder(inputs):
        applies, takes = [], {}
        position = 0
        pushed: dict[str, list[tf.Tensor]] = {}  # a packed variable's gradient from each sender
        for v in variables:
            scope = variable_sync_scope(v.name)
            if v.name in packed_of:
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
                            takes[v.name] = _take_rows(rows, required, shape)
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
            scope = f"{step_scope}{_PACKED}{k}/"
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
        original = inputs[position]
        written = [t.op for t in inputs[position + 1:position + 1 + len(writes)]]
        heard = [t.op for t in inputs[position + 1 + len(writes):]]
        with tf.name_scope(step_scope):
            if chief:  # every worker's gradients are in (see _writes_after_takes)
                tf.group(*[t for v in variables for t in takes[v.name]], name=_TAKEN)
            queues = {w: tf.queue.FIFOQueue(-1, [tf.int64], shapes=[[]], shared_name=f"{step_scope}token_{w}",
                                            name=f"token_{w}") for w in range(1, num_workers)
                      if chief or w == task.worker_index}
            if chief and in_step:
                # Released as soon as the update is done: nothing writes a server variable after it. After
                # the step's writes of server variables, on the servers, where they can (_server_writes):
                # not after the training op on this worker, a round trip later.
                released = tf.group(*_releases(queues, after=written or [original.op]), name="release_in_step")
                done = tf.group(original.op, released, name="synchronised")
            elif chief:
                # Released by the session after the whole step (see release_op), not here: an op run
                # after the update (an EMA, moving statistics) must be done when the others go on.
                tf.group(*_releases(queues), name="release")
                done = tf.group(original.op, name="synchronised")
            else:
                # Mixed plans: this worker also runs the training op, for its own copies of
                # the all-reduced variables (the server variables' updates are taken out), beside the
                # wait for its token (on the server: after the training op, it would be a round trip later).
                with tf.control_dependencies(applies + heard):
                    token = queues[task.worker_index].dequeue(name="wait")
                done = tf.group(token, *([original.op] if mixed else []), name="synchronised")
        return [done] + [t for v in variables if chief for t in takes[v.name]]

    nodes, outputs = build_subgraph(builder, dtypes, names, "")
    for node in nodes:
        if node.name.startswith(step_scope):
            rest = node.name[len(step_scope):]
            queue_side = rest.startswith(("token_", "release_")) or rest == "wait"
            if rest.startswith(_PACKED):  # a packed accumulator and its ops: on the group's server
                node.device = server_of[packed[int(rest[len(_PACKED):].split("/")[0])][0].name]
            else:
                node.device = plan.server_devices[0] if queue_side else worker.shared_device
            continue
        scope = node.name[len(SYNC_PREFIX) + 1:]
        var = enclosing_scope(scope, server_of)
        node.device = server_of[var] if var is not None else worker.shared_device
    _rename_train_op(out, train_op, original_name, nodes, parse_input(outputs[0])[0])
    if chief:
        _writes_after_takes(out.graph_def, plan, original_name, [n for n in names if not n.startswith("^")],
                            f"{step_scope}{_TAKEN}")
    # The chief's update ops read the summed gradients the accumulators return.
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
            if is_parallax_op(node.name):
                continue
            for i, text in enumerate(node.input):
                op, index, control = parse_input(text)
                key = f"{op}:{index}"
                if not control and key in rewire:
                    node.input[i] = rewire[key]
    add_nodes(out.graph_def, nodes)


def _writes_after_takes(graph_def, plan: Plan, step: str, gradients: list[str], taken: str) -> None:
    """On the chief, the step's writes of server variables that no gradient waits for (a decoupled weight
    decay, ``var.assign_sub(var * wd * lr)`` in Keras 3's AdamW before its update; a traced step's own
    ``assign``) wait for ``taken``, every worker's gradients: until then another worker may still read the
    variable for its forward pass, and would read it written (on one device every read of a step comes
    before its writes). Writes that a gradient waits for (batch-norm statistics under
    ``control_dependencies``) already come before the chief's gradient, and no other worker reads them.
    Writes that read a gradient (the updates) will read the sums the takes return, which come after every
    worker's gradient and so after its forward pass, and writes of optimizer slots, which only the chief's
    update reads: no wait for ``taken`` (on the worker, a round trip from the servers and back on the
    chain of every step)."""
    nodes = node_map(graph_def)
    # an optimizer's slots only the chief's update reads (Adam's sparse update scales its moments first)
    servers = _server_variables(plan, slots=False)
    sources = [parse_input(g)[0] for g in gradients]
    before = ancestors(nodes, sources)
    updates = descendants(consumers(graph_def), sources)  # they will read the takes (the chief's rewiring)
    for name in sorted(ancestors(nodes, [step]) - before - updates):
        if written_variable(nodes[name], nodes) in servers:
            nodes[name].input.append(f"^{taken}")


def _take_rows(rows: tf.queue.FIFOQueue, required: int, shape: tf.TensorShape) -> list[tf.Tensor]:
    """The chief's take of a sparse gradient: the ``required`` senders' rows, one after the other
    (``take_<i>``), as one gradient ``[values, indices]`` (``take_values``, ``take``). Rows of equal
    index stay separate, as in a single device's gradient of the union batch: the update sums them
    (TensorFlow's sparse updates do). Linear in the rows, where a ``SparseConditionalAccumulator``
    copies every row it holds at each apply (quadratic in the senders; docs/benchmarks.md)."""
    taken = [rows.dequeue(name=f"take_{i}") for i in range(required)]
    values = [tf.ensure_shape(t[0], [None] + shape.as_list()[1:]) for t in taken]
    return [tf.concat(values, 0, name="take_values"), tf.concat([t[1] for t in taken], 0, name="take")]


def _server_variables(plan: Plan, slots: bool = True) -> set[str]:
    """The names of the variables on the servers (with ``slots=False``, not the optimizers' slots)."""
    return {v.name for v in plan.variables if v.server is not None and (slots or v.slot_of is None)}


def _server_writes(graph_def, plan: Plan, train_op: str) -> list[str]:
    """The ops of ``train_op``'s step that write server variables (the updates on the servers, a global step
    there), which the chief's release may follow instead of the training op; none (release after the
    training op) when the step has control flow, where an op not run would never release anyone, or calls a
    function, whose writes are not ops of the graph."""
    nodes = node_map(graph_def)
    step = ancestors(nodes, [train_op])
    calls = _CALLS | {f.signature.name for f in graph_def.library.function}
    if any(nodes[n].op in _CONTROL_FLOW or nodes[n].op in calls for n in step):
        return []
    servers = _server_variables(plan)
    return sorted(n for n in step if written_variable(nodes[n], nodes) in servers)


def _releases(queues: dict, after: list[tf.Operation] = ()) -> list[tf.Operation]:
    """The chief's token for each other worker (``release_<w>``), each put after ``after``."""
    token = tf.constant(0, tf.int64)
    with tf.control_dependencies(list(after)):
        return [q.enqueue(token, name=f"release_{w}") for w, q in queues.items()]


def written_after(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, train_op: str) -> list[str]:
    """Server variables that an op outside ``train_op``'s update writes (an EMA, moving statistics
    in a ``tf.group`` with it, another training op), by name.

    While there are none, the chief may release the others as soon as the update is done: a
    worker that reads any server variable after its step sees the chief's whole step all the same.
    """
    nodes = node_map(meta_graph.graph_def)
    step = ancestors(nodes, [train_op])
    on_servers = _server_variables(plan)
    initializers, saver_scope = _initializers_and_saver(meta_graph)
    restores = _restore_writes(meta_graph.graph_def, nodes)
    return sorted({written_variable(n, nodes) for n in meta_graph.graph_def.node
                   if n.name not in step and n.name not in initializers and n.name not in restores
                   and not (saver_scope and n.name.startswith(saver_scope))} & on_servers)


def _push_groups(variables: list[VariablePlacement], server_of: dict[str, str]
                 ) -> tuple[list[list[VariablePlacement]], list[VariablePlacement]]:
    """The dense gradients each worker pushes packed into one buffer (:mod:`parallax.comm.packing`):
    small ones of the same dtype bound for the same server, in plan order; and the rest."""
    dense = [v for v in variables if not v.sparse]
    packed, alone = packed_groups(
        dense, key=lambda v: (server_of[v.name], v.gradient.dtype),
        nbytes=lambda v: static_nbytes(v.gradient_shape, v.gradient.dtype))
    return packed, alone + [v for v in variables if v.sparse]


def _rename_train_op(meta_graph: meta_graph_pb2.MetaGraphDef, train_op: str, original_name: str,
                     protocol: list, synchronised: str) -> None:
    """The training op becomes ``original_name``; the protocol's op ``synchronised`` takes its name.

    Raises:
        RewriteError: an op reads the training op's output as data (only control
            dependencies on a training op can be kept).
    """
    for node in meta_graph.graph_def.node:
        if node.name == train_op:
            node.name = original_name
            continue
        for text in node.input:
            op, _, control = parse_input(text)
            if op == train_op and not control:
                raise RewriteError(f'op "{node.name}" reads the output of the training op "{train_op}"; with '
                                   "parameter servers only control dependencies on a training op are kept. "
                                   "Use tf.control_dependencies([train_op]) or tf.group(train_op, ...)")
    for node in protocol:
        if node.name == synchronised:
            node.name = train_op


def _drop_server_updates(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, waits: dict[str, str],
                         device: str, wait: bool) -> None:
    """On a worker other than the chief, the ops of the server variables' ``update_<var>`` scopes (``waits``
    maps each variable to its training op's wait for the chief's token) run nothing: the chief updates those
    variables. With ``wait``, each waits for the token too, so whatever this worker's graph orders after an
    update (a traced step's outputs and later reads, under TensorFlow 2's automatic control dependencies)
    sees the chief's update."""
    owner = update_scope_owner([v.name for v in plan.variables])
    dropped = {node.name: waits[var] for node in meta_graph.graph_def.node
               if (var := owner(node.name)) in waits}
    make_no_op(meta_graph.graph_def, set(dropped), device,
               "an update of a variable on the parameter servers, which only the chief runs; read the variable "
               "instead", after=dropped if wait else None)


def program_writes(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan) -> tuple[set[str], set[str]]:
    """The program's own writes of server variables (outside the optimizer's updates, initializers and the
    exported saver): those ordered after a training op (under its ``control_dependencies``), and the others."""
    servers = _server_variables(plan)
    graph_def = meta_graph.graph_def
    nodes = node_map(graph_def)
    initializers, saver_scope = _initializers_and_saver(meta_graph)
    owner = update_scope_owner([v.name for v in plan.variables])  # the optimizer's updates: see add_ps_sync
    kept_scopes = (f"{SYNC_PREFIX}/",) + ((saver_scope,) if saver_scope else ())
    writes = {n.name for n in graph_def.node
              if n.name not in initializers and not n.name.startswith(kept_scopes)
              and owner(n.name) is None and written_variable(n, nodes) in servers}
    after_step = descendants(consumers(graph_def), [t for t in plan.train_ops if t in nodes]) & writes
    return after_step, writes - after_step


def _add_writes_barrier(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec,
                        outside: set[str]) -> None:
    """The barrier that orders the program's writes of server variables outside a step (see
    :func:`_drop_server_writes`): ``token_<w>`` queues on server 0, the chief's ``release`` (a token to
    each) and each other worker's ``wait``; the writes' names in the collection :data:`PROGRAM_WRITES`."""
    chief = task.worker_index == 0

    def builder(_inputs):
        with tf.name_scope(WRITES_SCOPE):
            queues = {w: tf.queue.FIFOQueue(-1, [tf.int64], shapes=[[]], shared_name=f"{WRITES_SCOPE}token_{w}",
                                            name=f"token_{w}") for w in range(1, plan.num_workers)
                      if chief or w == task.worker_index}
            if chief:
                token = tf.constant(0, tf.int64)
                tf.group(*[q.enqueue(token) for q in queues.values()], name="release")
            else:
                tf.group(queues[task.worker_index].dequeue(), name="wait")
        return []

    nodes, _ = build_subgraph(builder, [], [], "")
    for node in nodes:
        node.device = plan.server_devices[0]  # the queues and their tokens
    add_nodes(meta_graph.graph_def, nodes)
    meta_graph.collection_def[PROGRAM_WRITES].bytes_list.value.extend(n.encode() for n in sorted(outside))


def _drop_server_writes(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, device: str,
                        after_step: set[str], outside: set[str]) -> None:
    """On a worker other than the chief, the program's writes of server variables (an EMA of the weights,
    moving statistics, its own increment of the global step or assignment of a learning rate, a saver's
    restore; :func:`program_writes`) run nothing: the chief runs them, once per step as on one device.

    What a write gives a program that fetches it stays (:func:`parallax.rewrite.graph_ops.make_no_op`),
    with the value one device gives:

    * a write ordered after a training op (under its ``control_dependencies``): the variable, read after
      this worker's token, so once the chief's whole step is done;
    * an assignment of a value that reads no variable (a learning rate from a placeholder): that value (a
      resource variable's ``read_value`` too);
    * any other write outside a step: the variable. A ``run`` that writes outside a step waits, before it
      runs, for the chief's run of the same writes (:func:`_add_writes_barrier`; the session runs the
      barrier, :class:`parallax.session.ParallaxSession`), so every later read sees the chief's write. In a
      run that also trains, the variable is read without waiting for the chief: its name goes into the
      collection :data:`UNSYNCHRONISED`, and the session refuses such a fetch on this worker.
    """
    graph_def = meta_graph.graph_def
    nodes = node_map(graph_def)
    dropped = after_step | outside
    values, unsynchronised = {}, []
    for name in sorted(outside):
        node = nodes[name]
        value = node.input[1] if node.op in ("Assign", "AssignVariableOp") and len(node.input) > 1 else None
        if value is not None and not _reads_a_variable(nodes, value):
            values[name] = value
        else:
            unsynchronised.append(name)
    reads = _read_values(graph_def, nodes, dropped)
    make_no_op(graph_def, dropped, device,
               "a write of a variable on the parameter servers, which only the chief worker runs; read the "
               "variable itself instead", values=values)
    for read, write in reads.items():  # a resource variable's read_value of a dropped assignment
        if write in values:
            node = nodes[read]
            dtype = node.attr["dtype"].type
            waits = [t for t in node.input if t.startswith("^")]
            node.op = "Identity"
            del node.input[:]
            node.input.extend([values[write]] + waits)
            del node.attr["dtype"]
            node.attr["T"].type = dtype
        elif write in unsynchronised:
            unsynchronised.append(read)
    if unsynchronised:
        meta_graph.collection_def[UNSYNCHRONISED].bytes_list.value.extend(n.encode() for n in sorted(unsynchronised))


def _reads_a_variable(nodes: dict, tensor: str) -> bool:
    """Whether the value ``tensor`` is computed from a variable (walking its data inputs)."""
    seen, stack = set(), [parse_input(tensor)[0]]
    while stack:
        name = stack.pop()
        if name in seen or name not in nodes:
            continue
        seen.add(name)
        if nodes[name].op in VARIABLE_OP_TYPES:
            return True
        stack.extend(parse_input(t)[0] for t in nodes[name].input if not t.startswith("^"))
    return False


def _read_values(graph_def, nodes: dict, writes: set[str]) -> dict[str, str]:
    """The reads of a resource variable that wait for one of ``writes`` of it (what ``assign(...)``
    returns: a ``ReadVariableOp`` under the write's control dependency), each with its write."""
    found = {}
    for node in graph_def.node:
        if node.op != "ReadVariableOp" or not node.input:
            continue
        for text in node.input[1:]:
            write = parse_input(text)[0]
            if text.startswith("^") and write in writes and parse_input(node.input[0])[0] == \
                    parse_input(nodes[write].input[0])[0]:
                found[node.name] = write
    return found


def _restore_writes(graph_def, nodes: dict) -> set[str]:
    """The writes of a saver's restore (their value comes from a ``RestoreV2``), by name."""
    return {n.name for n in graph_def.node if is_variable_write(n.op) and len(n.input) > 1
            and _from_restore(nodes, n.input[1])}


def _from_restore(nodes: dict, tensor: str) -> bool:
    name = parse_input(tensor)[0]
    for _ in range(8):  # RestoreV2, maybe through an Identity or a reshape of its output
        node = nodes.get(name)
        if node is None:
            return False
        if node.op in ("RestoreV2", "Restore", "RestoreSlice"):
            return True
        data = [t for t in node.input if not t.startswith("^")]
        if not data:
            return False
        name = parse_input(data[0])[0]
    return False


def _initializers_and_saver(meta_graph: meta_graph_pb2.MetaGraphDef) -> tuple[set[str], str | None]:
    """The writes that are no training step: the variables' initializer ops (by name) and the
    saver's name scope (``save/``), or ``None`` when the graph has no saver."""
    from tensorflow.core.framework import variable_pb2

    initializers = set()
    for collection in meta_graph.collection_def.values():
        for raw in collection.bytes_list.value:
            proto = variable_pb2.VariableDef()
            try:
                proto.ParseFromString(raw)
            except Exception:  # noqa: BLE001 - not a VariableDef
                continue
            if proto.initializer_name:
                initializers.add(parse_input(proto.initializer_name)[0])
    restore = meta_graph.saver_def.restore_op_name
    return initializers, (restore.split("/")[0] + "/") if restore else None
