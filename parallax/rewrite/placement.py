"""Pass: put variables (and what must live with them) on their parameter servers.

No ops are added. Every variable the plan assigns to a server gets that
server's device, and so does every op colocated with it (``_class`` =
``loc:@<variable>``): its initializer, its optimizer slots, and its update
ops, so the update runs where the variable is.

With ``boundary_among_servers`` (``PSConfig``, default on), the other ops
between the gradients and the update (clipping, scaling) also move to a
server: the server of the variable whose update they feed, or, for ops that
feed several (a global norm), of the first such variable by name. Otherwise
they stay on the worker. Does nothing for plans without servers.
"""

from __future__ import annotations

from tensorflow.core.protobuf import meta_graph_pb2

from parallax.plan.model import Plan, TaskSpec
from parallax.rewrite.classify import classify
from parallax.rewrite.graph_ops import consumers, descendants
from parallax.rewrite.names import AGGREGATE_PREFIX, SYNC_PREFIX

__all__ = ["place_variables"]


def place_variables(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, task: TaskSpec
                    ) -> meta_graph_pb2.MetaGraphDef:
    """Assign server devices (see the module docstring). Returns a new MetaGraphDef."""
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    if not plan.server_devices:
        return out
    device_of = {v.name: plan.server_devices[v.server] for v in plan.variables if v.server is not None}
    for node in out.graph_def.node:
        if node.name in device_of:
            node.device = device_of[node.name]
            continue
        if "_class" in node.attr:
            for loc in node.attr["_class"].list.s:
                target = loc.decode()[5:] if loc.startswith(b"loc:@") else None
                if target in device_of:
                    node.device = device_of[target]
                    break
    if plan.ps.boundary_among_servers:
        _place_boundary_ops(out, plan, device_of)
    return out


def _place_boundary_ops(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, device_of: dict[str, str]) -> None:
    update_ops = {}
    for n in meta_graph.graph_def.node:
        for loc in (n.attr["_class"].list.s if "_class" in n.attr else ()):
            target = loc.decode()[5:] if loc.startswith(b"loc:@") else None
            if target in device_of:
                update_ops[n.name] = target
    cons = consumers(meta_graph.graph_def)
    nodes = {n.name: n for n in meta_graph.graph_def.node}
    for name in sorted(classify(meta_graph.graph_def, plan).update_path):
        if name in device_of or name in update_ops or name.startswith((f"{AGGREGATE_PREFIX}/", f"{SYNC_PREFIX}/")):
            continue
        fed = sorted({update_ops[d] for d in descendants(cons, [name]) if d in update_ops})
        if fed:
            nodes[name].device = device_of[fed[0]]
            if "_class" in nodes[name].attr:  # colocated with a worker-side gradient: no longer
                del nodes[name].attr["_class"]
