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

__all__ = ["cut_forward", "stage_of", "variable_stages", "pipeline_spec", "group_devices"]


def _matches(name: str, cut: str) -> bool:
    return name == cut or name.startswith(cut.rstrip("/") + "/")


def cut_forward(forward: Sequence[ForwardOp], stages: int, user_cuts: Sequence[str] = ()
                ) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """The cuts (first op of stages ``1 .. k-1``) and each stage's estimated cost.

    >>> ops = [ForwardOp("a", 10), ForwardOp("b", 1), ForwardOp("c", 10), ForwardOp("d", 1)]
    >>> cut_forward(ops, 2)
    (('c',), (11, 11))
    >>> cut_forward(ops, 2, ["d"])
    (('d',), (21, 1))

    Raises:
        PlanError: a named cut matches no forward op, the cuts are out of the forward order,
            or there are fewer forward ops than stages.
    """
    names = [op.name for op in forward]
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
        total = sum(op.cost for op in forward)
        positions, running, s = [], 0, 1
        for i, op in enumerate(forward):
            while s < stages and running >= total * s / stages and i > (positions[-1] if positions else 0):
                positions.append(i)
                s += 1
            running += op.cost
        if len(positions) < stages - 1:  # the last ops carry all the cost: cut by the number of ops
            positions = [len(names) * s // stages for s in range(1, stages)]
    cuts = tuple(names[i] for i in positions)
    bounds = [0, *positions, len(names)]
    costs = tuple(sum(op.cost for op in forward[bounds[s]:bounds[s + 1]]) for s in range(stages))
    return cuts, costs


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
                  micro_batches: int, user_cuts: Sequence[str] = ()) -> tuple[PipelineSpec, dict[str, int]]:
    """The pipeline of a job whose workers' replicas have ``devices[w][r]`` as stage devices,
    and the stage of each variable.

    Raises:
        PlanError: see :func:`cut_forward`; or a pipeline over a graph without gradients.
    """
    if stages > 1 and analysis.forward_only:
        raise PlanError(f"pipeline_stages={stages} cuts the forward and backward passes of training, but the graph "
                        "has no optimizer update")
    cuts, costs = cut_forward(analysis.forward, stages, user_cuts)
    spec = PipelineSpec(stages=stages, micro_batches=micro_batches, cuts=cuts,
                        devices=tuple(tuple(tuple(r) for r in w) for w in devices) if stages > 1 else (),
                        stage_costs=costs if stages > 1 else (), cut_by="user" if user_cuts else "cost")
    return spec, variable_stages(analysis, cuts) if stages > 1 else {}
