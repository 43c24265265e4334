"""Split a single-device graph into per-replica ops and shared ops.

* **Shared** ops exist once per worker: variables, their initializers, the
  update path (the ops between the gradients and the training op), and
  everything the training op needs that does not come from the gradient
  computation (learning-rate schedules, global-step increments, a
  learning-rate placeholder).
* **Replicated** ops are copied onto every replica: the ancestors of the
  gradients (forward and backward pass, variable reads, input pipeline) and
  every other op fed by the input (placeholders, iterators, datasets), such
  as an accuracy metric or batch-norm moving statistics (also when the
  training op needs them: a metric's write grouped into it), but not through
  the update: ops that run after the training op (an
  ``ExponentialMovingAverage`` applied under its control dependency) are
  shared and run once.

Ops that are neither (a saver, ``init``) stay shared. So do lookup tables, a TF1 input pipeline's
queues (each replica's dequeue takes the next batch from the one queue that the
program's queue runners fill) and a placeholder that only sets variables (a
learning rate assigned from a feed: the write runs once).
"""

from __future__ import annotations

from dataclasses import dataclass

from tensorflow.core.framework import graph_pb2

from parallax.analysis import VARIABLE_OP_TYPES
from parallax.errors import RewriteError
from parallax.graph.graph_ops import (
    ancestors,
    consumers,
    descendants,
    is_variable_write,
    node_map,
    op_of,
    written_variable,
)
from parallax.plan.model import Plan

__all__ = ["Classification", "classify", "is_input_op"]

_INPUT_OP_TYPES = frozenset({"Placeholder", "PlaceholderV2", "PlaceholderWithDefault"})


def is_input_op(op_type: str) -> bool:
    """Whether an op type feeds data into a replica (placeholder, iterator, dataset, a queue's dequeue)."""
    return op_type in _INPUT_OP_TYPES or "Iterator" in op_type or "Dataset" in op_type \
        or op_type.startswith("QueueDequeue")


#: Lookup tables (a ``StringLookup``'s, carried into a traced step by :mod:`parallax.tf2.tables`): shared like
#: variables, one per worker, filled once by the tables' initializer; every replica looks up in it.
_TABLE_OP_TYPES = frozenset({"HashTable", "HashTableV2", "MutableHashTable", "MutableHashTableV2",
                             "MutableHashTableOfTensors", "MutableHashTableOfTensorsV2", "MutableDenseHashTable",
                             "MutableDenseHashTableV2"})
_QUEUE_OP_TYPES = frozenset({"FIFOQueue", "FIFOQueueV2", "PaddingFIFOQueue", "PaddingFIFOQueueV2",
                             "RandomShuffleQueue", "RandomShuffleQueueV2", "PriorityQueue", "PriorityQueueV2"})


def _assigned_only(nodes: dict, cons: dict[str, list[str]], forward: set[str], variables: set[str],
                   summed: set[str]) -> set[str]:
    """The placeholders that only set variables (a learning rate assigned from a feed each epoch, a pretrained
    table loaded once): everything they reach is on the way to a variable write and meets no replica's
    computation. They are shared, not per-replica inputs: the write runs once, with the one value fed. Not
    those that reach a summed variable (a metric's weights), to which each replica adds its own part."""
    near_replicas = forward | descendants(cons, forward, stop=variables)
    found = set()
    for name, node in nodes.items():
        if node.op not in _INPUT_OP_TYPES:
            continue
        reached = descendants(cons, [name], stop=variables)
        writes = {n for n in reached if is_variable_write(nodes[n].op)}
        if any(written_variable(nodes[w], nodes) in summed for w in writes):
            continue
        written = ancestors(nodes, writes, stop=variables) | descendants(cons, writes, stop=variables)
        if writes and not reached & near_replicas and reached <= written:  # after a write: its value returned
            found.add(name)
    return found


@dataclass(frozen=True)
class Classification:
    """Op names by role. ``update_path`` is a subset of the shared ops."""

    replicated: frozenset[str]
    shared: frozenset[str]
    update_path: frozenset[str]


def _summed_writes(nodes: dict, summed: set[str], variables: set[str], step: set[str]) -> set[str]:
    """The ``step``'s writes of summed variables (a metric's state) and what their values are computed from (data
    inputs, back to variables): each replica makes them, adding its own part (``count += 1`` too, which reads no
    batch)."""
    out: set[str] = set()
    todo = [name for name in step if written_variable(nodes[name], nodes) in summed]
    while todo:
        name = todo.pop()
        if name in out or name in variables or name not in nodes:
            continue
        out.add(name)
        todo.extend(op_of(i) for i in nodes[name].input if not i.startswith("^"))
    return out


def classify(graph_def: graph_pb2.GraphDef, plan: Plan, extra_inputs: frozenset[str] = frozenset()
             ) -> Classification:
    """Classify every op of ``graph_def`` (see the module docstring).

    Args:
        graph_def: the single-device graph.
        plan: names the gradients and training ops.
        extra_inputs: op names to treat as per-replica inputs (shard ids).

    Raises:
        RewriteError: a gradient or training op named by the plan is missing.
    """
    nodes = node_map(graph_def)
    for t in plan.train_ops:
        if t not in nodes:
            raise RewriteError(f'training op "{t}" named by the plan is not in the graph')
    grad_ops = set()
    for v in plan.variables:
        if v.gradient is None:
            continue
        for tensor in (v.gradient.tensor, v.gradient.indices):
            if tensor is None:
                continue
            if op_of(tensor) not in nodes:
                raise RewriteError(f'gradient tensor "{tensor}" of variable "{v.name}" is not in the graph')
            grad_ops.add(op_of(tensor))
    # a queue (a TF1 input pipeline's batch queue) is shared like a variable: every replica's copy of the
    # dequeue takes the next batch from it, and the program's queue runners fill it
    variables = {n.name for n in graph_def.node
                 if n.op in VARIABLE_OP_TYPES or n.op in _QUEUE_OP_TYPES or n.op in _TABLE_OP_TYPES}
    cons = consumers(graph_def)
    forward = ancestors(nodes, grad_ops, stop=variables)
    train_closure = ancestors(nodes, plan.train_ops)
    # the ops after a gradient on the way to the update, not those of the backward pass that read it too (batch
    # normalisation's beta gradient is also the upstream gradient of its mean): a replica's own backward pass keeps
    # reading its own gradient, and only the update reads the aggregated one
    update_path = (descendants(cons, grad_ops) - grad_ops - forward) & train_closure
    summed = {v.name for v in plan.variables if v.summed}
    inputs = {n.name for n in graph_def.node if is_input_op(n.op)} - _assigned_only(nodes, cons, forward, variables,
                                                                                   summed)
    inputs |= set(extra_inputs)
    # What the training op needs from a replica's forward pass but not through the gradients (a loss or an
    # accuracy a metric's write accumulates, a batch statistic a moving average takes) is that replica's: it
    # stays with the replica (its writes of shared variables are then made by replica 0 alone), and is not
    # taken for a hyper-parameter computed once.
    activations = forward & descendants(cons, inputs, stop=variables)
    per_replica = descendants(cons, activations, stop=variables | update_path | set(plan.train_ops)) - forward
    hyper = train_closure - forward - per_replica
    shared = variables | update_path | hyper
    # What runs after the update (an EMA under control_dependencies([train_op])) is not fed
    # through it: it runs once, on the updated variables.
    fed = descendants(cons, inputs, stop=shared | set(plan.train_ops))
    replicated = (forward | fed) - shared
    replicated |= _summed_writes(nodes, summed, variables, train_closure)
    everything = set(nodes)
    return Classification(frozenset(replicated), frozenset(everything - replicated),
                          frozenset(update_path))
