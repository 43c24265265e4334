"""Build a :class:`Plan` from the graph analysis, the workers and the config."""

from __future__ import annotations

from parallax.analysis import GraphAnalysis
from parallax.plan.model import CommSpec, GradientRef, Plan, VariablePlacement, WorkerPlan

__all__ = ["build_plan"]


def build_plan(analysis: GraphAnalysis, workers: list[tuple[str, tuple[str, ...], str]], *,
               run_option: str, sync: bool, average_sparse: bool, cross_worker: str = "local",
               comm: CommSpec | None = None) -> Plan:
    """Decide the layout of every variable and replica.

    Dense gradients are averaged over the replicas; sparse ones are summed,
    or averaged when ``average_sparse`` is set (the seed system's semantics).

    Args:
        analysis: the single-device graph's analysis.
        workers: ``(host, replica devices, shared device)`` of every worker
            task, in worker-id order, as TensorFlow device names.
        run_option: the resolved run option.
        sync: synchronous training.
        average_sparse: average sparse gradients instead of summing them.
        cross_worker: how gradients cross workers: ``"local"`` (one worker)
            or ``"allreduce"``.
        comm: the all-reduce settings (defaults when ``None``).

    Returns:
        The plan.
    """
    worker_plans = tuple(WorkerPlan(host, tuple(devices), shared) for host, devices, shared in workers)
    sync_method = cross_worker if len(worker_plans) > 1 else "local"
    variables = []
    for v in analysis.variables:
        g = analysis.gradient(v.name)
        ref = None if g is None else GradientRef(*g.aggregation_tensors, g.dtype, g.indices_dtype)
        aggregation = "sum" if (g is not None and g.sparse and not average_sparse) else "mean"
        variables.append(VariablePlacement(v.name, v.shape, v.dtype, v.trainable, ref, aggregation,
                                           sync_method if g is not None else "local"))
    return Plan(run_option=run_option, sync=sync, workers=worker_plans, variables=tuple(variables),
                train_ops=analysis.train_ops, comm=comm or CommSpec())
