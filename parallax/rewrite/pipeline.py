"""The ordered list of rewrite passes, and :func:`rewrite_for_task`."""

from __future__ import annotations

import os
from collections.abc import Callable

from tensorflow.core.protobuf import meta_graph_pb2

from parallax.graph.names import AGGREGATE_PREFIX, SYNC_PREFIX, sync_scope
from parallax.plan.model import Plan, Sync, TaskSpec
from parallax.rewrite.aggregate import aggregate_gradients
from parallax.rewrite.local_copies import use_local_copies
from parallax.rewrite.micro_batches import split_micro_batches
from parallax.rewrite.packed_reads import pack_server_reads
from parallax.rewrite.placement import place_variables
from parallax.rewrite.ps_sync import add_ps_sync
from parallax.rewrite.replicate import replicate_graph
from parallax.rewrite.zero import shard_optimizer_states

__all__ = ["PASSES", "rewrite_for_task", "wait_points"]

Pass = Callable[[meta_graph_pb2.MetaGraphDef, Plan, TaskSpec], meta_graph_pb2.MetaGraphDef]

PASSES: tuple[Pass, ...] = (split_micro_batches, replicate_graph, aggregate_gradients, shard_optimizer_states,
                            place_variables, add_ps_sync, use_local_copies, pack_server_reads)


def rewrite_for_task(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec,
                     debug_dir: str | None = None) -> meta_graph_pb2.MetaGraphDef:
    """Turn the single-device graph into the graph ``task`` runs.

    Args:
        meta_graph: the single-device graph (not modified).
        plan: the job's plan.
        task: the process to rewrite for.
        debug_dir: if given, each pass's output is written there as a text
            proto, ``<NN>_<pass>.pbtxt``.

    Returns:
        The rewritten MetaGraphDef.
    """
    current = meta_graph
    for number, rewrite_pass in enumerate(PASSES, start=1):
        current = rewrite_pass(current, plan, task)
        if debug_dir is not None:
            os.makedirs(debug_dir, exist_ok=True)
            path = os.path.join(debug_dir, f"{number:02d}_{rewrite_pass.__name__}.pbtxt")
            with open(path, "w", encoding="utf-8") as f:
                f.write(str(current))
    for node in current.graph_def.node:
        # Recorded shapes of the single-device graph no longer hold where gradients of
        # several replicas are joined; TensorFlow infers them again on import.
        if "_output_shapes" in node.attr:
            del node.attr["_output_shapes"]
    return current


def wait_points(plan: Plan, task: TaskSpec) -> str:
    """Where a step of ``task`` waits for other processes, in words, for the stall check.

    >>> from parallax.plan.model import WorkerPlan
    >>> w = WorkerPlan("h", ("/cpu:0",), "/cpu:0")
    >>> wait_points(Plan("MPI", True, (w, w), (), ("Adam",)), TaskSpec(1))
    ''
    """
    syncs = {v.sync for v in plan.variables if v.gradient is not None}
    points = []
    if plan.sums_replicas_across_workers:
        points.append(f"in the sums of synchronised batch statistics ({AGGREGATE_PREFIX}/replica_sums)")
    if syncs & {Sync.ALLREDUCE, Sync.ALLGATHER}:
        points.append(f"in the all-reduce of the gradients ({AGGREGATE_PREFIX}/allreduce, /allgather)")
    if Sync.PS in syncs and plan.sync:
        if task.worker_index == 0:
            points.append(f"in the PS protocol, where the chief takes every worker's gradients "
                          f"({SYNC_PREFIX}/<variable>/take, or {SYNC_PREFIX}/step/<op>/packed_<k>/take for "
                          "small dense gradients pushed packed)")
        else:
            points.append("in the PS protocol, waiting for the chief's token "
                          f"({', '.join(sync_scope(t) + 'wait' for t in plan.train_ops)})")
    return " or ".join(points)
