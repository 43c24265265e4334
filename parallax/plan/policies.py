"""Build a :class:`Plan` from the graph analysis, the workers and the config."""

from __future__ import annotations

from parallax.analysis import GraphAnalysis
from parallax.plan.model import CommSpec, GradientRef, Plan, PSSpec, VariablePlacement, WorkerPlan

__all__ = ["build_plan", "place_by_bytes"]


def place_by_bytes(analysis: GraphAnalysis, num_servers: int) -> dict[str, int]:
    """Assign every variable to a server, balancing bytes (not round-robin).

    A variable and the variables colocated with it (its optimizer slots) form
    one group; groups are taken largest first (ties by name) and each goes to
    the server holding the fewest bytes so far (ties: the lowest index). The
    result depends only on the variables, never on creation order.

    Example: groups of 400, 300 and 200 bytes on two servers give
    ``{400}`` on server 0 and ``{300, 200}`` on server 1.
    """
    names = {v.name for v in analysis.variables}

    def root(name: str) -> str:
        seen = set()
        while True:
            target = analysis.variable(name).colocate_with
            if target is None or target not in names or target in seen:
                return name
            seen.add(name)
            name = target

    groups: dict[str, list[str]] = {}
    for v in analysis.variables:
        groups.setdefault(root(v.name), []).append(v.name)
    sizes = {r: sum(analysis.variable(n).num_bytes for n in members) for r, members in groups.items()}
    loads = [0] * num_servers
    placement: dict[str, int] = {}
    for r in sorted(groups, key=lambda g: (-sizes[g], g)):
        server = min(range(num_servers), key=lambda i: (loads[i], i))
        loads[server] += sizes[r]
        for name in groups[r]:
            placement[name] = server
    return placement


def build_plan(analysis: GraphAnalysis, workers: list[tuple[str, tuple[str, ...], str]], *,
               run_option: str, sync: bool, average_sparse: bool, cross_worker: str = "local",
               comm: CommSpec | None = None, server_devices: tuple[str, ...] = (),
               ps: PSSpec | None = None) -> Plan:
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
        cross_worker: how gradients cross workers: ``"local"`` (one worker),
            ``"allreduce"`` or ``"ps"`` (variables on ``server_devices``,
            placed by :func:`place_by_bytes`).
        comm: the all-reduce settings (defaults when ``None``).
        server_devices: TensorFlow devices of the parameter servers (PS).
        ps: the PS communication settings (defaults when ``None``).

    Returns:
        The plan.
    """
    worker_plans = tuple(WorkerPlan(host, tuple(devices), shared) for host, devices, shared in workers)
    sync_method = cross_worker if (len(worker_plans) > 1 or cross_worker == "ps") else "local"
    placement = place_by_bytes(analysis, len(server_devices)) if server_devices else {}
    variables = []
    for v in analysis.variables:
        g = analysis.gradient(v.name)
        ref = None if g is None else GradientRef(*g.aggregation_tensors, g.dtype, g.indices_dtype)
        aggregation = "sum" if (g is not None and g.sparse and not average_sparse) else "mean"
        variables.append(VariablePlacement(v.name, v.shape, v.dtype, v.trainable, ref, aggregation,
                                           sync_method if g is not None else "local", placement.get(v.name)))
    return Plan(run_option=run_option, sync=sync, workers=worker_plans, variables=tuple(variables),
                train_ops=analysis.train_ops, comm=comm or CommSpec(), server_devices=tuple(server_devices),
                ps=ps or PSSpec())
