"""Cutting the forward pass into pipeline stages, and giving each replica its stage devices.

The forward ops are taken in the order the model made them (its layers' order,
:attr:`parallax.analysis.GraphAnalysis.forward`). A cut is the first op of a
stage: either where the estimated cost (:class:`parallax.analysis.ForwardOp`)
of the ops before it reaches ``s/k`` of the whole, or at the first op of a
scope or op the user names (``Config.pipeline_cuts``). A variable lives on the
stage of the first forward op that reads it; its optimizer slots follow it.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Sequence

from parallax.analysis import ForwardOp, GraphAnalysis
from parallax.errors import PlanError
from parallax.plan.model import PipelineSpec

__all__ = ["cut_forward", "stage_of", "variable_stages", "pipeline_spec", "group_devices", "fit_stages",
           "memory_weights", "stage_memory"]


def _matches(name: str, cut: str) -> bool:
    return name == cut or name.startswith(cut.rstrip("/") + "/")


def cut_forward(forward: Sequence[ForwardOp], stages: int, user_cuts: Sequence[str] = (),
                weights: Sequence[int] | None = None) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The cuts (first op of stages ``1 .. k-1``) and each stage's estimated cost.

    >>> ops = [ForwardOp("a", 10), ForwardOp("b", 1), ForwardOp("c", 10), ForwardOp("d", 1)]
    >>> cut_forward(ops, 2)
    (('c',), (11, 11))
    >>> cut_forward(ops, 2, ["d"])
    (('d',), (21, 1))

    ``weights``: what to balance instead of the ops' estimated cost (bytes, to fit memory).

    Raises:
        PlanError: a named cut matches no forward op, the cuts are out of the forward order,
            or there are fewer forward ops than stages.
    """
    names = [op.name for op in forward]
    weights = list(weights) if weights is not None else [op.cost for op in forward]
    if stages <= 1:
        return (), (sum(op.cost for op in forward),)
    if len(names) < stages:
        raise PlanError(f"pipeline_stages={stages}, but the forward pass has only {len(names)} op(s) to share")
    if user_cuts:
        positions = []
        for cut in user_cuts:
            at = next((i for i, n in enumerate(names) if _matches(n, cut)), None)
            if at is None:
                raise PlanError(f"pipeline_cuts: {cut!r} names no op or scope of the forward pass (ops that the "
                                f"gradients are computed from); its first ops are {', '.join(names[:5])}")
            positions.append(at)
        if positions != sorted(positions) or len(set(positions)) != len(positions) or positions[0] == 0:
            raise PlanError(f"pipeline_cuts {list(user_cuts)} must name scopes in the order the model makes them, "
                            "each after the first op and after the one before (their first ops are at positions "
                            f"{positions} of the forward pass)")
    else:
        positions = _balanced_cuts(weights, stages)
    cuts = tuple(names[i] for i in positions)
    bounds = [0, *positions, len(names)]
    costs = tuple(sum(op.cost for op in forward[bounds[s]:bounds[s + 1]]) for s in range(stages))
    return cuts, costs


def _packed(weights: Sequence[int], capacity: int) -> list[int]:
    """Cut positions packing the ops in order into stages of at most ``capacity`` (an op over it alone)."""
    cuts, running = [], 0
    for i, weight in enumerate(weights):
        if running and running + weight > capacity:
            cuts.append(i)
            running = 0
        running += weight
    return cuts


def _balanced_cuts(weights: Sequence[int], stages: int) -> list[int]:
    """The ``stages - 1`` cut positions whose heaviest stage is lightest (a binary search on the
    heaviest stage's weight, packing greedily); stages left over take the last ops one each.

    >>> _balanced_cuts([1, 5, 1, 1, 5, 1], 2), _balanced_cuts([9, 1, 1, 1], 3)
    ([3], [1, 3])
    """
    low, high = max(weights), sum(weights)
    while low < high:
        middle = (low + high) // 2
        if len(_packed(weights, middle)) <= stages - 1:
            high = middle
        else:
            low = middle + 1
    cuts = _packed(weights, low)
    spare = [i for i in range(len(weights) - 1, 0, -1) if i not in cuts]
    return sorted(cuts + spare[:stages - 1 - len(cuts)])


def memory_weights(analysis: GraphAnalysis) -> list[int]:
    """Per forward op: the bytes of the variables (and their slots) it is the first to read."""
    slots: dict[str, int] = {}
    for v in analysis.variables:
        if v.slot_of is not None:
            slots[v.slot_of] = slots.get(v.slot_of, 0) + v.num_bytes
    sizes = {v.name: v.num_bytes + slots.get(v.name, 0) for v in analysis.variables}
    seen: set[str] = set()
    weights = []
    for op in analysis.forward:
        new = [name for name in op.reads if name not in seen]
        seen.update(new)
        weights.append(1 + sum(sizes.get(name, 0) for name in new))
    return weights


def stage_memory(analysis: GraphAnalysis, stages: dict[str, int], count: int) -> list[int]:
    """Bytes of variables and slots on each of ``count`` stages (unplaced variables on stage 0)."""
    held = [0] * count
    for v in analysis.variables:
        held[stages.get(v.name, 0)] += v.num_bytes
    return held


def fit_stages(analysis: GraphAnalysis, limit: int, device_counts: Sequence[int]) -> int:
    """The fewest stages whose every stage holds at most ``limit`` bytes of variables and slots,
    cut by those bytes, among the counts that divide every worker line's ``device_counts``.

    Raises:
        PlanError: no such count fits, naming the largest variable.
    """
    weights = memory_weights(analysis)
    most = min(device_counts)
    for k in range(1, most + 1):
        if any(n % k for n in device_counts):
            continue
        if k > 1 and len(analysis.forward) < k:
            break
        cuts, _ = cut_forward(analysis.forward, k, weights=weights)
        if max(stage_memory(analysis, variable_stages(analysis, cuts), k)) <= limit:
            return k
    biggest = max(analysis.variables, key=lambda v: v.num_bytes, default=None)
    total = sum(v.num_bytes for v in analysis.variables)
    raise PlanError(f"device_memory={limit} bytes: the model's {total} bytes of variables and optimizer slots do "
                    "not fit in any number of stages that divides the devices of each resource-file line "
                    f"({min(device_counts)} at most)"
                    + (f" (the largest variable, {biggest.name}, holds {biggest.num_bytes} bytes)" if biggest else "")
                    + "; list more devices on each line or raise the limit")


def stage_of(positions: dict[str, int], cut_positions: Sequence[int], name: str) -> int:
    """The stage of forward op ``name`` (given every forward op's position and the cuts')."""
    return bisect_right(list(cut_positions), positions[name])


def variable_stages(analysis: GraphAnalysis, cuts: Sequence[str]) -> dict[str, int]:
    """The stage of each variable: of the first forward op reading it; a slot's is its variable's."""
    positions = {op.name: i for i, op in enumerate(analysis.forward)}
    cut_positions = [positions[c] for c in cuts]
    stages: dict[str, int] = {}
    for op in analysis.forward:
        for name in op.reads:
            stages.setdefault(name, stage_of(positions, cut_positions, op.name))
    for v in analysis.variables:
        if v.slot_of is not None:
            stages[v.name] = stages.get(v.slot_of, 0)
    return stages


def group_devices(devices: Sequence[str], stages: int, where: str) -> tuple[tuple[str, ...], ...]:
    """A worker's devices as replicas of ``stages`` consecutive devices each.

    >>> group_devices(["a", "b", "c", "d"], 2, "worker 0")
    (('a', 'b'), ('c', 'd'))

    Raises:
        PlanError: the devices do not divide into whole replicas.
    """
    if len(devices) % stages:
        raise PlanError(f"pipeline_stages={stages} puts each stage on a device of its own, but {where} has "
                        f"{len(devices)} device(s) ({', '.join(devices)}): list a multiple of {stages} on its "
                        "line of the resource file (for example cpu:0,cpu:1 for 2 stages on virtual CPUs)")
    return tuple(tuple(devices[i:i + stages]) for i in range(0, len(devices), stages))


def pipeline_spec(analysis: GraphAnalysis, devices: Sequence[tuple[tuple[str, ...], ...]], stages: int,
                  micro_batches: int, user_cuts: Sequence[str] = (), placed: dict[str, int] | None = None,
                  device_memory: int | None = None, by_memory: bool = False, schedule: str = "gpipe"
                  ) -> tuple[PipelineSpec, dict[str, int]]:
    """The pipeline of a job whose workers' replicas have ``devices[w][r]`` as stage devices,
    and the stage of each variable.

    Args:
        placed: stages the user gives variables (``plan_overrides``); their slots follow them.
        device_memory: refuse a stage holding more bytes of variables and slots than this.
        by_memory: cut where the bytes of variables, not the estimated cost, are balanced.
        schedule: ``"gpipe"`` or ``"1f1b"`` (:class:`PipelineSpec`).

    Raises:
        PlanError: see :func:`cut_forward`; a pipeline over a graph without gradients; a
            placed stage out of range; a stage over ``device_memory``.
    """
    if stages > 1 and analysis.forward_only:
        raise PlanError(f"pipeline_stages={stages} cuts the forward and backward passes of training, but the graph "
                        "has no optimizer update")
    weights = memory_weights(analysis) if by_memory and not user_cuts else None
    cuts, costs = cut_forward(analysis.forward, stages, user_cuts, weights)
    where = variable_stages(analysis, cuts) if stages > 1 else {}
    for name, stage in sorted((placed or {}).items()):
        if stage >= stages:
            raise PlanError(f"plan_overrides puts {name} on stage {stage}, but the pipeline has {stages} stage(s) "
                            f"(0 .. {stages - 1}); set pipeline_stages")
        where[name] = stage
    for v in analysis.variables:
        if v.slot_of is not None and v.slot_of in (placed or {}):
            where[v.name] = where[v.slot_of]
    if device_memory is not None:
        held = stage_memory(analysis, where, stages)
        over = [s for s in range(stages) if held[s] > device_memory]
        if over:
            raise PlanError(f"device_memory={device_memory} bytes, but stage {over[0]} holds {held[over[0]]} bytes "
                            f"of variables and optimizer slots (every stage: {held}); raise pipeline_stages, "
                            "move variables with plan_overrides {'name': {'stage': s}}, or leave pipeline_stages "
                            "at 1 for the plan to choose")
    spec = PipelineSpec(stages=stages, micro_batches=micro_batches, cuts=cuts,
                        devices=tuple(tuple(tuple(r) for r in w) for w in devices) if stages > 1 else (),
                        stage_costs=costs if stages > 1 else (),
                        cut_by="user" if user_cuts else ("memory" if weights else "cost"), schedule=schedule)
    return spec, where
