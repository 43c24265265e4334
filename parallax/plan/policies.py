"""Build a :class:`Plan` from the graph analysis, the cluster and the config."""

from __future__ import annotations

from parallax.analysis import GraphAnalysis
from parallax.plan.model import GradientRef, Plan, VariablePlacement, WorkerPlan
from parallax.resources import Device

__all__ = ["build_plan"]


def build_plan(analysis: GraphAnalysis, worker_devices: list[tuple[str, tuple[Device, ...]]], *,
               run_option: str, sync: bool, average_sparse: bool) -> Plan:
    """Decide the layout of every variable and replica.

    Dense gradients are averaged over the replicas; sparse ones are summed,
    or averaged when ``average_sparse`` is set (the seed system's semantics).

    Args:
        analysis: the single-device graph's analysis.
        worker_devices: ``(host, devices)`` of every worker task, in worker-id
            order, with the devices already resolved.
        run_option: the resolved run option.
        sync: synchronous training.
        average_sparse: average sparse gradients instead of summing them.

    Returns:
        The plan.
    """
    workers = []
    for host, devices in worker_devices:
        replica_devices = tuple(d.tf_name for d in devices)
        workers.append(WorkerPlan(host, replica_devices, shared_device="/device:CPU:0"))
    variables = []
    for v in analysis.variables:
        g = analysis.gradient(v.name)
        ref = None if g is None else GradientRef(g.tensor, g.indices, g.dtype, g.indices_dtype)
        aggregation = "sum" if (g is not None and g.sparse and not average_sparse) else "mean"
        variables.append(VariablePlacement(v.name, v.shape, v.dtype, v.trainable, ref, aggregation))
    return Plan(run_option=run_option, sync=sync, workers=tuple(workers),
                variables=tuple(variables), train_ops=analysis.train_ops)
