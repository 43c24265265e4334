"""Small pure helpers over ``GraphDef`` node lists: inputs, consumers, closures."""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable

from tensorflow.core.framework import graph_pb2, node_def_pb2

__all__ = ["parse_input", "format_input", "op_of", "node_map", "consumers", "ancestors",
           "descendants", "add_nodes"]


def parse_input(text: str) -> tuple[str, int, bool]:
    """Split a NodeDef input into ``(op name, output index, is control)``.

    >>> parse_input("a/b:1"), parse_input("^c"), parse_input("d")
    (('a/b', 1, False), ('c', 0, True), ('d', 0, False))
    """
    if text.startswith("^"):
        return text[1:], 0, True
    op, sep, index = text.rpartition(":")
    if sep and index.isdigit():
        return op, int(index), False
    return text, 0, False


def format_input(op: str, index: int, control: bool) -> str:
    """Inverse of :func:`parse_input`."""
    if control:
        return "^" + op
    return op if index == 0 else f"{op}:{index}"


def op_of(tensor_or_op: str) -> str:
    """The op name of a tensor name (``a:1`` -> ``a``), or the name itself."""
    return parse_input(tensor_or_op)[0]


def node_map(graph_def: graph_pb2.GraphDef) -> dict[str, node_def_pb2.NodeDef]:
    return {n.name: n for n in graph_def.node}


def consumers(graph_def: graph_pb2.GraphDef) -> dict[str, list[str]]:
    """Map an op name to the names of the ops that take it as a data or control input."""
    out: dict[str, list[str]] = {}
    for n in graph_def.node:
        for i in n.input:
            out.setdefault(parse_input(i)[0], []).append(n.name)
    return out


def ancestors(nodes: dict[str, node_def_pb2.NodeDef], starts: Iterable[str],
              stop: frozenset[str] | set[str] = frozenset()) -> set[str]:
    """Ops reachable backwards from ``starts`` (included) over data and control edges.

    Ops in ``stop`` are neither included nor walked through.
    """
    seen = {s for s in starts if s not in stop}
    queue = deque(seen)
    while queue:
        for text in nodes[queue.popleft()].input:
            name = parse_input(text)[0]
            if name not in seen and name not in stop:
                seen.add(name)
                queue.append(name)
    return seen


def descendants(consumer_map: dict[str, list[str]], starts: Iterable[str]) -> set[str]:
    """Ops reachable forwards from ``starts`` (included) over data and control edges."""
    seen = set(starts)
    queue = deque(seen)
    while queue:
        for name in consumer_map.get(queue.popleft(), ()):
            if name not in seen:
                seen.add(name)
                queue.append(name)
    return seen


def add_nodes(graph_def: graph_pb2.GraphDef, nodes) -> None:
    """Append ``nodes`` to ``graph_def``, refusing a name the graph already has.

    Raises:
        RewriteError: naming the clashing op.
    """
    from parallax.errors import RewriteError

    existing = {n.name for n in graph_def.node}
    for node in nodes:
        if node.name in existing:
            raise RewriteError(f'op "{node.name}" that Parallax adds already exists in the graph; '
                               "rename the graph's op (names under parallax_* are reserved)")
        existing.add(node.name)
    graph_def.node.extend(nodes)
