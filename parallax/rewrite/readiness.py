"""In which order the backward pass makes gradients ready.

With ``MPIConfig.overlap`` (the default) the dense gradients are all-reduced in the order they
become ready, in buckets, each bucket as soon as its gradients are there, while the backward pass
goes on computing the others: Horovod's tensor fusion fills its buffers with the tensors that are
ready, PyTorch DDP's buckets follow the parameters backwards. A rewrite cannot watch the clock, so
it reads the order off the graph (:func:`readiness_order`): a gradient's *depth* is the length of
the longest path of ops from the graph's sources to the op that makes it. The backward pass is a
chain that runs from the loss back to the first layer, and every op runs after its inputs, so a
gradient deeper in the graph is ready no earlier than the ops on its path: the last layer's
gradient is shallow, the first layer's deep. Every worker rewrites the same graph and gets the
same order, which matters: the ``mpi`` backend's calls must come in one order on every worker.

:func:`parallax.plan.buckets.overlap_buckets` then cuts the ordered gradients into buckets.
Pure functions over ``GraphDef``s.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from tensorflow.core.framework import graph_pb2

from parallax.graph.graph_ops import op_of, parse_input

__all__ = ["op_depths", "readiness_order"]

#: Ops whose inputs close a loop of a TF1 ``while_loop`` (the edge back is not a dependency of the first turn).
_BACK_EDGE_OPS = frozenset({"NextIteration", "RefNextIteration"})


def op_depths(graph_def: graph_pb2.GraphDef) -> dict[str, int]:
    """Each op's depth: the number of ops on the longest path to it from an op without inputs (0).

    Data and control inputs both count; the back edge of a TF1 loop (an input from
    ``NextIteration``) does not, and inputs from ops the graph does not hold are ignored. An op on a
    cycle that no back edge explains gets one more than the deepest op reached.

    >>> from tensorflow.core.framework import graph_pb2
    >>> g = graph_pb2.GraphDef()
    >>> for name, inputs in [("x", []), ("a", ["x"]), ("b", ["a", "^x"]), ("c", ["x"])]:
    ...     node = g.node.add(name=name, op="Identity"); node.input.extend(inputs)
    >>> sorted(op_depths(g).items())
    [('a', 1), ('b', 2), ('c', 1), ('x', 0)]
    """
    kinds = {node.name: node.op for node in graph_def.node}
    inputs: dict[str, list[str]] = {}
    for node in graph_def.node:
        names = {parse_input(text)[0] for text in node.input}
        inputs[node.name] = sorted(n for n in names if n in kinds and kinds[n] not in _BACK_EDGE_OPS)
    waiting = {name: len(ins) for name, ins in inputs.items()}
    users: dict[str, list[str]] = {name: [] for name in inputs}
    for name, ins in inputs.items():
        for source in ins:
            users[source].append(name)
    depth = dict.fromkeys((name for name, count in waiting.items() if count == 0), 0)
    ready = deque(sorted(depth))
    while ready:
        name = ready.popleft()
        for user in users[name]:
            depth[user] = max(depth.get(user, 0), depth[name] + 1)
            waiting[user] -= 1
            if waiting[user] == 0:
                ready.append(user)
    deepest = max(depth.values(), default=-1)
    for name in inputs:
        depth.setdefault(name, deepest + 1)
    return depth


def readiness_order(graph_def: graph_pb2.GraphDef, tensors: Mapping[str, Sequence[str]]) -> list[str]:
    """The keys of ``tensors`` (say variable names, each with the tensors its gradient needs: one
    per replica) in the order the graph can make them ready: by the depth of their deepest tensor's
    op (:func:`op_depths`), then by key.

    >>> from tensorflow.core.framework import graph_pb2
    >>> g = graph_pb2.GraphDef()
    >>> for name, inputs in [("loss", []), ("g2", ["loss"]), ("back", ["loss"]), ("g1", ["back"])]:
    ...     node = g.node.add(name=name, op="Identity"); node.input.extend(inputs)
    >>> readiness_order(g, {"layer1": ["g1:0"], "layer2": ["g2:0"]})
    ['layer2', 'layer1']
    """
    depth = op_depths(graph_def)
    deepest = max(depth.values(), default=0) + 1
    key = {name: max((depth.get(op_of(t), deepest) for t in ts), default=deepest) for name, ts in tensors.items()}
    return sorted(tensors, key=lambda name: (key[name], name))
