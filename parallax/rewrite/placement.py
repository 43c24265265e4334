"""Pass: put variables (and what must live with them) on their parameter servers.

No ops are added. Every variable the plan assigns to a server gets that
server's device, and so does every op colocated with it (``_class`` =
``loc:@<variable>``): its initializer, its optimizer slots, and its update
ops, so the update runs where the variable is. Does nothing for plans
without servers.
"""

from __future__ import annotations

from tensorflow.core.protobuf import meta_graph_pb2

from parallax.plan.model import Plan, TaskSpec

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
    return out
