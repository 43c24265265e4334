"""The kinds of ops the analysis tells apart: variables and their reads, lowered conditionals' switches, the
inputs that give each replica data of its own, and the ops of ``gradients`` scopes."""

from __future__ import annotations

import re

__all__ = ["VARIABLE_OP_TYPES", "_PURE_READS", "_GRADIENT_SCOPE_RE", "_SWITCHES", "_DATA_SOURCES", "_PLACEHOLDERS",
           "_op_name", "_is_batch_input", "_is_variable_read", "_behind_switches", "_in_gradient_scope"]


VARIABLE_OP_TYPES = frozenset({"VarHandleOp", "VariableV2", "Variable", "AutoReloadVariable",
                               "_VarHandlesOp"})
_PURE_READS = frozenset({"ReadVariableOp", "Identity", "Const", "Shape"})
_GRADIENT_SCOPE_RE = re.compile(r"(^|/)(gradients(_\d+)?|gradient_tape)/")  # tf.gradients, a GradientTape


_SWITCHES = frozenset({"Switch", "RefSwitch"})


#: Ops whose outputs are a replica's own part of the data: input pipelines and queues.
_DATA_SOURCES = frozenset({"IteratorGetNext", "IteratorGetNextSync", "IteratorGetNextAsOptional", "QueueDequeue",
                           "QueueDequeueV2", "QueueDequeueMany", "QueueDequeueManyV2", "QueueDequeueUpTo",
                           "QueueDequeueUpToV2", "ReaderRead", "ReaderReadV2", "ReaderReadUpTo",
                           "ReaderReadUpToV2"})


_PLACEHOLDERS = ("Placeholder", "PlaceholderV2", "PlaceholderWithDefault")


def _op_name(obj) -> str:
    op = getattr(obj, "op", None)
    return op.name if op is not None else obj.name.split(":")[0]


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


def _in_gradient_scope(op) -> bool:
    return bool(_GRADIENT_SCOPE_RE.search(op.name)) or _tape_sum(op)


def _tape_sum(op) -> bool:
    """Whether ``op`` is a ``GradientTape``'s sum of one variable's gradients from several uses: a top-level
    ``AddN`` of tensors the tape made (and of what it makes under the sum's own name: an ``IndexedSlices``
    gradient made dense beside a dense one, an embedding's lookup beside its regulariser)."""
    if op.type != "AddN" or "/" in op.name:
        return False
    return all(_GRADIENT_SCOPE_RE.search(t.op.name) or t.op.name.startswith(op.name + "/") for t in op.inputs)
