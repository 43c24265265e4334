"""Pass: synchronous training through parameter servers.

Each variable the plan marks ``ps`` lives on its server (see
:mod:`parallax.rewrite.placement`). For ``sync=True`` this pass adds, with
names that every worker computes alike (the gradients' pushes and takes are
built by :mod:`parallax.rewrite.ps_gradients`):

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
    variable (:func:`parallax.rewrite.program_writes.written_after`). This
    saves the chief a second ``run`` per step. The tokens follow the step's
    writes on the servers (:func:`_server_writes`), not the training op on the
    chief, which would add a round trip between the chief and the servers to
    every step;
  - otherwise (an EMA or moving statistics run after the update), or with
    the user's hooks (``PSSpec.release_in_step`` off), by the session
    (:class:`parallax.runtime.session.ParallaxSession`), which runs ``release`` after
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

Only the chief writes server variables: on the other workers the updates of
server variables run nothing (:func:`_drop_server_updates`), and so do the
program's own writes of them (an EMA, moving statistics, its increment of the
global step, a saver's restore), which take the writes barrier outside a step
(:mod:`parallax.rewrite.program_writes`).

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

import tensorflow as tf
from tensorflow.core.protobuf import meta_graph_pb2

from parallax.analysis import update_scope_owner
from parallax.errors import RewriteError
from parallax.graph.graph_ops import (
    add_nodes,
    ancestors,
    consumers,
    descendants,
    enclosing_scope,
    format_input,
    make_no_op,
    node_map,
    parse_input,
    written_variable,
)
from parallax.graph.names import (
    SYNC_PREFIX,
    aggregate_outputs,
    is_parallax_op,
    sync_scope,
    unsynchronised_train_op,
)
from parallax.plan.model import Plan, Sync, TaskSpec, VariablePlacement
from parallax.rewrite.aggregate import build_subgraph
from parallax.rewrite.program_writes import (  # PROGRAM_WRITES, UNSYNCHRONISED, program_writes: from here too
    PROGRAM_WRITES,
    UNSYNCHRONISED,
    add_writes_barrier,
    drop_server_writes,
    program_writes,
    server_variables,
    written_after,
)
from parallax.rewrite.ps_gradients import (
    PACKED,
    compressed_push,
    gradient_senders,
    gradients_sent,
    push_and_take,
    push_groups,
)

__all__ = ["add_ps_sync", "variables_by_train_op", "program_writes", "UNSYNCHRONISED", "PROGRAM_WRITES"]

_TAKEN = "taken"  # the chief's group of its takes, under the training op's sync scope
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
    if not plan.sync or not any(v.sync is Sync.PS and v.gradient is not None for v in plan.variables):
        return out
    chief = task.worker_index == 0
    worker = plan.workers[task.worker_index]
    waits: dict[str, str] = {}  # server variable -> the wait for the chief's token of its training op
    # a variable each worker keeps (a metric's state, parallax.tf2.summed): every worker runs the training op
    kept = any(v.summed for v in plan.variables)
    mixed_plan = kept or any(v.gradient is not None and v.sync is not Sync.PS for v in plan.variables)
    for train_op, variables in variables_by_train_op(out.graph_def, plan):
        synced = [v for v in variables if v.sync is Sync.PS]
        if synced:
            mixed = kept or len(synced) < len(variables)
            _add_protocol(out, plan, task, train_op, synced, mixed)
            waits.update({v.name: f"{sync_scope(train_op)}wait" for v in synced})
    after_step, outside = program_writes(out, plan)
    if outside and plan.num_workers > 1:
        add_writes_barrier(out, plan, task, outside)
    if not chief:
        # in a mixed plan this worker's wait follows its own training op, which holds the dropped updates
        _drop_server_updates(out, plan, waits, worker.shared_device, wait=not mixed_plan)
        drop_server_writes(out, plan, worker.shared_device, after_step, outside)
    return out


def _add_protocol(out: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec, train_op: str,
                  variables: list[VariablePlacement], mixed: bool) -> None:
    """The accumulators, tokens and renamed training op of one training op: this worker's pushes of its
    gradients and the chief's takes of their sums (:func:`push_and_take`), the tokens (:func:`_add_tokens`),
    their devices (:func:`_place_protocol`), the training op's new name, and, on the chief, the updates
    reading the sums (:func:`_read_sums`)."""
    chief = task.worker_index == 0
    worker = plan.workers[task.worker_index]
    original_name = unsynchronised_train_op(train_op)
    senders, required, listen = gradient_senders(plan, task, variables)
    gradients, dtypes = gradients_sent(variables, senders)
    in_step = chief and plan.ps.release_in_step and not written_after(out, plan, train_op)
    # (the training op itself, when it writes one, by the name it is about to take)
    writes = [original_name if w == train_op else w
              for w in (_server_writes(out.graph_def, plan, train_op) if in_step else [])]
    # after the gradients: a control input on the original training op, on each of the step's writes of
    # server variables, and on each gradient this worker does not send
    controls = [f"^{original_name}"] + [f"^{w}" for w in writes] + listen
    names = gradients + controls
    dtypes = dtypes + [tf.float32] * len(controls)
    step_scope = sync_scope(train_op)
    server_of = {v.name: plan.server_devices[v.server] for v in variables}
    packed, _ = push_groups(variables, server_of)
    sent = compressed_push(step_scope, plan.comm.compression)

    def builder(inputs):
        applies, takes = push_and_take(inputs[:len(gradients)], variables, senders, required, packed,
                                       step_scope, chief, sent)
        original, *rest = inputs[len(gradients):]
        written = [t.op for t in rest[:len(writes)]]
        heard = [t.op for t in rest[len(writes):]]
        taken = [t for v in variables if chief for t in takes[v.name]]
        done = _add_tokens(plan, task, step_scope, in_step, mixed, original, written, heard, applies, taken)
        return [done] + taken

    nodes, outputs = build_subgraph(builder, dtypes, names, "")
    _place_protocol(nodes, plan, worker.shared_device, step_scope, server_of, packed)
    _rename_train_op(out, train_op, original_name, nodes, parse_input(outputs[0])[0])
    if chief:
        _writes_after_takes(out.graph_def, plan, original_name, gradients, f"{step_scope}{_TAKEN}")
        # The chief's update ops read the summed gradients the accumulators return.
        _read_sums(out.graph_def, variables, outputs[1:])
    add_nodes(out.graph_def, nodes)


def _add_tokens(plan: Plan, task: TaskSpec, step_scope: str, in_step: bool, mixed: bool, original: tf.Tensor,
                written: list[tf.Operation], heard: list[tf.Operation], applies: list[tf.Operation],
                taken: list[tf.Tensor]) -> tf.Operation:
    """Under the training op's sync scope: the chief's group of its takes (``taken``), the token queues, the
    chief's releases or this worker's ``wait`` (after its pushes, ``applies``, and the gradients it ``heard``
    of but does not send), and ``synchronised``, the op that will take the training op's name, returned.
    ``original`` stands for the original training op, ``written`` for the step's writes of server
    variables, which a release ``in_step`` follows."""
    chief = task.worker_index == 0
    with tf.name_scope(step_scope):
        if chief:  # every worker's gradients are in (see _writes_after_takes)
            tf.group(*taken, name=_TAKEN)
        queues = {w: tf.queue.FIFOQueue(-1, [tf.int64], shapes=[[]], shared_name=f"{step_scope}token_{w}",
                                        name=f"token_{w}") for w in range(1, plan.num_workers)
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
    return done


def _place_protocol(nodes: list, plan: Plan, shared_device: str, step_scope: str, server_of: dict[str, str],
                    packed: list[list[VariablePlacement]]) -> None:
    """The devices of the protocol's ops: a variable's accumulator or queue and its ops on its server, a packed
    accumulator and its ops on its group's server, the tokens on server 0, the rest on this worker."""
    for node in nodes:
        if node.name.startswith(step_scope):
            rest = node.name[len(step_scope):]
            queue_side = rest.startswith(("token_", "release_")) or rest == "wait"
            if rest.startswith(PACKED):  # a packed accumulator and its ops: on the group's server
                node.device = server_of[packed[int(rest[len(PACKED):].split("/")[0])][0].name]
            else:
                node.device = plan.server_devices[0] if queue_side else shared_device
            continue
        scope = node.name[len(SYNC_PREFIX) + 1:]
        var = enclosing_scope(scope, server_of)
        node.device = server_of[var] if var is not None else shared_device


def _read_sums(graph_def, variables: list[VariablePlacement], takes: list[str]) -> None:
    """On the chief, the program's readers of each variable's gradient (its update) read the sum the chief
    takes instead (``takes``: the takes' outputs, in the order of ``variables``)."""
    rewire = {}
    position = 0
    for v in variables:
        for original in aggregate_outputs(v.name, v.sparse):
            op, index, _ = parse_input(takes[position])
            rewire[original] = format_input(op, index, False)
            position += 1
    for node in graph_def.node:
        if is_parallax_op(node.name):
            continue
        for i, text in enumerate(node.input):
            op, index, control = parse_input(text)
            key = f"{op}:{index}"
            if not control and key in rewire:
                node.input[i] = rewire[key]


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
    servers = server_variables(plan, slots=False)
    sources = [parse_input(g)[0] for g in gradients]
    before = ancestors(nodes, sources)
    updates = descendants(consumers(graph_def), sources)  # they will read the takes (the chief's rewiring)
    for name in sorted(ancestors(nodes, [step]) - before - updates):
        if written_variable(nodes[name], nodes) in servers:
            nodes[name].input.append(f"^{taken}")


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
    servers = server_variables(plan)
    return sorted(n for n in step if written_variable(nodes[n], nodes) in servers)


def _releases(queues: dict, after: list[tf.Operation] = ()) -> list[tf.Operation]:
    """The chief's token for each other worker (``release_<w>``), each put after ``after``."""
    token = tf.constant(0, tf.int64)
    with tf.control_dependencies(list(after)):
        return [q.enqueue(token, name=f"release_{w}") for w, q in queues.items()]


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
