"""Small pure helpers over ``GraphDef`` node lists: inputs, consumers, closures."""

from __future__ import annotations

import functools
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from tensorflow.core.framework import attr_value_pb2, graph_pb2, node_def_pb2

__all__ = ["parse_input", "format_input", "op_of", "canonical", "rewire_inputs", "enclosing_scope", "replica_device",
           "copy_op", "node_map", "consumers", "ancestors",
           "descendants", "add_nodes", "is_variable_write", "written_variable", "variable_behind", "make_no_op",
           "STATEFUL_DRAWS", "STATELESS_DRAWS"]

_WRITE_OPS = frozenset({"Assign", "AssignAdd", "AssignSub", "AssignVariableOp", "AssignAddVariableOp",
                        "AssignSubVariableOp", "StridedSliceAssign", "ResourceStridedSliceAssign"})
_WRITE_PREFIXES = ("Scatter", "ResourceScatter", "Apply", "ResourceApply", "SparseApply", "ResourceSparseApply")
#: Ops that draw random numbers from a stateful kernel, seeded by their ``seed``/``seed2`` attributes.
STATEFUL_DRAWS = frozenset({"RandomUniform", "RandomUniformInt", "RandomStandardNormal", "TruncatedNormal",
                            "Multinomial", "RandomShuffle", "RandomGamma", "RandomPoisson", "RandomPoissonV2"})
#: Ops that draw random numbers from a seed input (Keras 3's dropout and ``keras.random`` draw with these).
STATELESS_DRAWS = frozenset({
    "StatelessRandomNormal", "StatelessRandomUniform", "StatelessRandomUniformInt", "StatelessRandomUniformFullInt",
    "StatelessTruncatedNormal", "StatelessRandomNormalV2", "StatelessRandomUniformV2", "StatelessRandomUniformIntV2",
    "StatelessRandomUniformFullIntV2", "StatelessTruncatedNormalV2", "StatelessParameterizedTruncatedNormal",
    "StatelessMultinomial", "StatelessRandomBinomial", "StatelessRandomGammaV2", "StatelessRandomGammaV3",
    "StatelessRandomPoisson", "StatelessShuffle"})
_VARIABLE_OPS = frozenset({"VarHandleOp", "VariableV2", "Variable", "AutoReloadVariable", "_VarHandlesOp"})


@functools.lru_cache(maxsize=1 << 18)  # a rewrite parses each input many times (a graph's closures)
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


def canonical(tensor: str) -> str:
    """A tensor's name as ``op:index``, however it was written.

    >>> canonical("a/b"), canonical("a/b:1")
    ('a/b:0', 'a/b:1')
    """
    op, index, _ = parse_input(tensor)
    return f"{op}:{index}"


def rewire_inputs(nodes: Iterable[node_def_pb2.NodeDef], mapping: dict[str, str]) -> None:
    """Each data input of ``nodes`` that ``mapping`` names (a tensor, written either way) reads what it maps to
    instead (control inputs stay)."""
    keys = {canonical(k): v for k, v in mapping.items()}
    for node in nodes:
        for i, text in enumerate(node.input):
            if not text.startswith("^") and canonical(text) in keys:
                node.input[i] = keys[canonical(text)]


COLOCATION_PREFIX = "loc:@"


def colocated_with(groups) -> list[str]:
    """The op names a node's ``_class`` colocation groups name (bytes or str entries), in order.

    >>> colocated_with([b"loc:@emb", b"other", "loc:@emb/Adam"])
    ['emb', 'emb/Adam']
    """
    names = []
    for group in groups:
        text = group.decode() if isinstance(group, bytes) else group
        if text.startswith(COLOCATION_PREFIX):
            names.append(text[len(COLOCATION_PREFIX):])
    return names


def colocation_group(op_name: str) -> bytes:
    """The ``_class`` entry that colocates a node with op ``op_name``."""
    return (COLOCATION_PREFIX + op_name).encode()


def enclosing_scope(name: str, scopes) -> str | None:
    """The longest of ``scopes`` that is ``name`` or a name scope of it (``a/b`` for ``a/b/c``), or
    ``None``; linear in the name's depth, not in the number of scopes.

    >>> enclosing_scope("v/part_1/apply", {"v", "v/part_1", "w"}), enclosing_scope("x/y", {"v"})
    ('v/part_1', None)
    """
    parts = name.split("/")
    for end in range(len(parts), 0, -1):
        prefix = "/".join(parts[:end])
        if prefix in scopes:
            return prefix
    return None


def replica_device(original: str, device: str) -> str:
    """The device of a replica's (or stage's) copy of an op placed at ``original`` by the user:
    ``device``, except that an op pinned to the CPU stays there when ``device`` is a GPU.

    >>> replica_device("/device:CPU:0", "/device:GPU:1"), replica_device("/device:GPU:0", "/device:GPU:1")
    ('/device:CPU:0', '/device:GPU:1')
    """
    if original and "CPU" in original.upper() and "GPU" in device.upper():
        return original
    return device


def copy_op(node: node_def_pb2.NodeDef, name: str, rename: Callable[[str], str | None],
            frame: Callable[[str], str], tensor: Callable[[str, int], str | None] = lambda op, index: None
            ) -> node_def_pb2.NodeDef:
    """A copy of ``node`` called ``name`` (a replica's or a micro-batch's): an input or colocation
    target that ``rename`` renames is the copy's own, a data input ``tensor`` gives another
    tensor for reads that tensor (a micro-batch's part of the batch), and a loop's ``Enter`` takes
    the frame ``frame`` names."""
    copy = node_def_pb2.NodeDef()
    copy.CopyFrom(node)
    copy.name = name
    del copy.input[:]
    for text in node.input:
        op, index, control = parse_input(text)
        target = rename(op)
        replaced = None if control or target is not None else tensor(op, index)
        copy.input.append(format_input(target, index, control) if target is not None else replaced or text)
    if "_class" in copy.attr:
        groups = [colocation_group(renamed) if (t := colocated_with([g])) and (renamed := rename(t[0])) else g
                  for g in copy.attr["_class"].list.s]
        copy.attr["_class"].CopyFrom(attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(s=groups)))
    if copy.op in ("Enter", "RefEnter") and "frame_name" in copy.attr:
        copy.attr["frame_name"].s = frame(copy.attr["frame_name"].s.decode()).encode()
    return copy


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


def computed_from(nodes: dict[str, node_def_pb2.NodeDef], tensor: str, found: Callable[[str], bool]) -> bool:
    """Whether the value ``tensor`` (an op's or a tensor's name) is computed from an op for which ``found`` holds
    (walking data inputs only, ``tensor``'s own op included; ops not in ``nodes`` are looked at, not walked)."""
    seen, stack = set(), [parse_input(tensor)[0]]
    while stack:
        name = stack.pop()
        if name in seen:
            continue
        seen.add(name)
        if found(name):
            return True
        if name in nodes:
            stack.extend(parse_input(t)[0] for t in nodes[name].input if not t.startswith("^"))
    return False


def descendants(consumer_map: dict[str, list[str]], starts: Iterable[str],
                stop: frozenset[str] | set[str] = frozenset()) -> set[str]:
    """Ops reachable forwards from ``starts`` (included) over data and control edges.

    Ops in ``stop`` are neither included nor walked through.
    """
    seen = {s for s in starts if s not in stop}
    queue = deque(seen)
    while queue:
        for name in consumer_map.get(queue.popleft(), ()):
            if name not in seen and name not in stop:
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


def is_variable_write(op_type: str) -> bool:
    """Whether ops of this type write the variable given as their first input.

    >>> is_variable_write("AssignSubVariableOp"), is_variable_write("ResourceApplyAdam"), is_variable_write("Add")
    (True, True, False)
    """
    return op_type in _WRITE_OPS or op_type.startswith(_WRITE_PREFIXES)


def written_variable(node: node_def_pb2.NodeDef, nodes: dict[str, node_def_pb2.NodeDef]) -> str | None:
    """The variable op that ``node`` writes (through ``Identity`` or a conditional's ``Switch`` of a handle or
    ref), or ``None``."""
    if not is_variable_write(node.op) or not node.input:
        return None
    name = parse_input(node.input[0])[0]
    seen = set()
    while name in nodes and name not in seen:
        seen.add(name)
        source = nodes[name]
        if source.op in _VARIABLE_OPS:
            return name
        if source.op not in _PASS_HANDLE or not source.input:
            return None
        name = parse_input(source.input[0])[0]
    return None


#: Ops whose output is their first input's handle or ref (a conditional's ``Switch`` on either branch).
_PASS_HANDLE = frozenset({"Identity", "RefIdentity", "Switch", "RefSwitch"})


def variable_behind(name: str, nodes: dict[str, node_def_pb2.NodeDef]) -> str:
    """The op ``name`` passes on the handle or ref of, through ``Identity`` and ``Switch`` (``name`` itself when
    it passes none on)."""
    seen = set()
    while name in nodes and name not in seen and nodes[name].op in _PASS_HANDLE and nodes[name].input:
        seen.add(name)
        name = parse_input(nodes[name].input[0])[0]
    return name


def added_to_itself(node: node_def_pb2.NodeDef, nodes: dict[str, node_def_pb2.NodeDef]) -> str | None:
    """Where ``node`` is ``assign(v, read(v) + x)`` of a resource variable (how a Keras 3 metric adds to its
    state), the input ``x`` (as the add names it); else ``None``."""
    if node.op != "AssignVariableOp" or len(node.input) < 2:
        return None
    value = nodes.get(parse_input(node.input[1])[0])
    if value is None or value.op not in ("AddV2", "Add"):
        return None
    variable = variable_behind(parse_input(node.input[0])[0], nodes)
    for mine, other in ((0, 1), (1, 0)):
        read = nodes.get(parse_input(value.input[mine])[0])
        if read is not None and read.op == "ReadVariableOp" and \
                variable_behind(parse_input(read.input[0])[0], nodes) == variable:
            return value.input[other]
    return None


def make_no_op(graph_def: graph_pb2.GraphDef, names: set[str], device: str, what: str,
               values: Mapping[str, str] | None = None, after: Mapping[str, str] | None = None) -> None:
    """Make the ops ``names`` run nothing on ``device``, still waiting for what they waited for (their
    inputs become control inputs, and ``after[name]`` is waited for too).

    A write that returns its variable (``Assign``, ``AssignAdd``, ``ScatterUpdate``... of a ref
    variable) becomes an ``Identity`` of the same name, so its output still exists for a fetch, a reader
    or a graph collection: of ``values[name]`` (a tensor name: what the write would have given) or else
    of the variable, read once the waits are done. Every other op becomes a ``NoOp``.

    Raises:
        RewriteError: another op reads the output of an op that became a ``NoOp``; ``what`` says
            what the dropped op is.
    """
    from parallax.errors import RewriteError

    values, after = values or {}, after or {}
    nodes = node_map(graph_def)
    no_ops = set()
    for node in graph_def.node:
        if node.name not in names:
            continue
        ref = _returns_its_ref(node, nodes)
        keep = (values.get(node.name) or node.input[0]) if ref else None  # the Identity's input
        waits = [parse_input(t)[0] for t in node.input] + ([after[node.name]] if node.name in after else [])
        kept_op = parse_input(keep)[0] if keep is not None else None
        dtype = node.attr["T"].type if ref else None
        for key in list(node.attr):
            del node.attr[key]
        del node.input[:]
        if keep is not None:
            node.op = "Identity"
            node.attr["T"].type = dtype
            node.input.append(keep)
        else:
            node.op = "NoOp"
            no_ops.add(node.name)
        node.input.extend(format_input(w, 0, True) for w in dict.fromkeys(waits) if w != kept_op)
        node.device = device
    for node in graph_def.node:
        if node.name in names:
            continue
        for text in node.input:
            op, _, control = parse_input(text)
            if op in no_ops and not control:
                raise RewriteError(f'op "{node.name}" reads the output of "{op}", {what}')


def _returns_its_ref(node: node_def_pb2.NodeDef, nodes: dict[str, node_def_pb2.NodeDef]) -> bool:
    """Whether ``node`` is a write of a ref variable whose output is that variable (``T`` its dtype)."""
    if not is_variable_write(node.op) or "T" not in node.attr or not node.input:
        return False
    source = written_variable(node, nodes)
    return source is not None and nodes[source].op in ("VariableV2", "Variable")
