"""A loss averaged over the unmasked values of a batch, made the union batch's average.

Keras divides a masked loss by the batch's own count of unmasked values: Keras 3's
``keras.src.losses.loss.apply_mask`` weighs each value by ``total / valid`` (``divide_no_nan`` of the batch's count
of loss values by its count of unmasked ones) before the mean over the batch's values, and tf_keras's
``losses_utils.apply_valid_mask`` the same with ``total / valid``. That is the loss of a model whose mask reaches
its output (an ``Embedding(mask_zero=True)`` before an LSTM or an attention layer, as keras-io's translation and
NER examples) and of a loss with ``ignore_class``. On a replica's part the counts are the part's, so the
replicas' mean loss is not the batch's where the parts hold different numbers of unmasked values.

Parallax makes both counts sums over every replica of the job, as a synchronised batch normalisation's
statistics (:mod:`parallax.tf2.replica_sums`): :func:`sum_masked_counts` puts an ``IdentityN`` between the
counts and the division, which the graph's :data:`~parallax.analysis.batch_statistics.REPLICA_SUMS` names. Each
replica then weighs its values by the union batch's ``total / valid``, averages over its part's values, and
the replicas' mean (``parallax.fit`` weighs each part by its examples) is ``sum(loss * mask) / valid`` over the
union batch: one device's loss, and its gradient. The counts are no function of a variable: no gradient flows
through the sums.

The divisions are found where they are made, by the Python frames TensorFlow keeps with each op of a traced
function (:func:`masked_means`).
"""

from __future__ import annotations

from typing import Any

from tensorflow.core.framework import graph_pb2

from parallax.graph.graph_ops import node_map

__all__ = ["masked_means", "sum_masked_counts", "is_masked_count", "own_counts", "COUNTS_SUFFIX"]

#: The functions of Keras 3 and tf_keras that weigh a masked loss's values by ``total / valid``, and their files.
MASK_WEIGHTS = (("apply_mask", "losses/loss.py"), ("apply_valid_mask", "utils/losses_utils.py"))
#: The name of the ``IdentityN`` that stands for the counts' sums, under the division's.
COUNTS_SUFFIX = "parallax_masked_counts"


def masked_means(graph: Any) -> list[tuple[int, str]]:
    """The divisions ``total / valid`` of the masked losses of ``graph`` (a traced function's graph): each op's
    position in the graph's order and its name."""
    found = []
    for position, op in enumerate(graph.get_operations()):
        if op.type not in ("DivNoNan", "RealDiv") or len(op.inputs) != 2:
            continue
        frames = [(f.name, f.filename.replace("\\", "/")) for f in op.traceback]
        if any(name == fn and filename.endswith(suffix) for name, filename in frames for fn, suffix in MASK_WEIGHTS):
            found.append((position, op.name))
    return found


def sum_masked_counts(graph_def: graph_pb2.GraphDef, divisions: list[str]) -> list[str]:
    """Make the counts each of ``divisions`` divides sums over the replicas (see the module docstring): an
    ``IdentityN`` of ``[total, valid, total, valid]`` (the form of a sum over the replicas the rewrite knows) whose
    first two outputs the division reads. Returns the ``IdentityN`` ops' names, in the order of ``divisions``."""
    nodes = node_map(graph_def)
    made = []
    for name in divisions:
        division = nodes.get(name)
        if division is None:  # inside a function the graph calls: left as it is
            continue
        counts = list(division.input[:2])
        summed = graph_def.node.add(name=f"{name}/{COUNTS_SUFFIX}", op="IdentityN")
        summed.input.extend(counts + counts)
        summed.attr["T"].list.type.extend([division.attr["T"].type] * 4)
        division.input[0], division.input[1] = f"{summed.name}:0", f"{summed.name}:1"
        made.append(summed.name)
    return made


def is_masked_count(name: str) -> bool:
    """Whether the replica sum ``name`` (an op of :data:`REPLICA_SUMS`) is a masked loss's counts."""
    return name.endswith("/" + COUNTS_SUFFIX)


def own_counts(graph: Any, rewritten: Any, names: list[str]) -> list[tuple[str, str]]:
    """For the counts' sums ``names`` (of the single-device ``graph``): each count of a replica's own part (a
    tensor of ``graph``) and the job's total the division of the ``rewritten`` graph reads instead. Fed with the
    part's own, the step computes the part's loss as one device would (the first step's check)."""
    pairs = []
    for name in names:
        own = graph.get_operation_by_name(name).inputs
        division = rewritten.get_operation_by_name(name[:-len(COUNTS_SUFFIX) - 1])
        pairs += [(own[0].name, division.inputs[0].name), (own[1].name, division.inputs[1].name)]
    return pairs
