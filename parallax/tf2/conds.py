"""A traced step's functional conditionals that write variables, lowered into the graph (``Switch``/``Merge``).

TensorFlow 2 builds a ``tf.cond`` in a ``tf.function`` as one ``If`` op whose branches
are functions of the graph's library. A Keras ``LossScaleOptimizer`` applies every
gradient inside one (``cond(all gradients finite, apply, skip)``), so the updates are
hidden in a function the rest of Parallax does not read. :func:`lower_conds` replaces
each ``If`` whose branches write a variable by the same computation in the graph
itself, as TensorFlow's own runtime lowering does (``_lower_using_switch_merge``) and
as a ``tf.compat.v1`` ``tf.cond`` is built. For an ``If`` named ``<c>``:

* ``<c>/pred``: ``Switch(pred, pred)``; ``<c>/pivot_t`` and ``<c>/pivot_f``: ``Identity``
  of its true and false outputs, which the branches' ops without inputs wait for;
* ``<c>/switch_<i>``: ``Switch(input_i, pred)`` for every input of the ``If`` (the
  gradients, the variables' handles), each taking the ``If``'s control inputs;
* ``<c>/then/<op>``, ``<c>/else/<op>``: the branches' ops, reading output 1 (then) or
  0 (else) of the switches where they read their arguments; the branch not taken is
  dead, and its ops do not run;
* ``<c>/then_done``, ``<c>/else_done``: ``Identity`` of the pivot, waiting for every op
  of its branch; ``<c>/branch_executed``: their ``Merge``;
* ``<c>/output_<k>``: ``Identity`` of ``Merge(else's k-th result, then's k-th result)``,
  after ``branch_executed``: output ``k`` of the ``If``, whose readers read it instead;
* ``<c>`` itself becomes a ``NoOp`` after ``branch_executed``, so what waited for the
  ``If`` waits for the whole branch taken, as it waited for the function.

Nested conditionals that write variables are lowered in turn. The result computes
what the functional ``If`` computed; the updates in it are ops of the graph, read as
any optimizer's (:mod:`parallax.tf2.regions`, :mod:`parallax.analysis`).
"""

from __future__ import annotations

from tensorflow.core.framework import attr_value_pb2, function_pb2, graph_pb2, node_def_pb2
from tensorflow.python.framework.function_def_to_graph import function_def_to_graph_def

from parallax.errors import AnalysisError
from parallax.graph.graph_ops import colocated_with, colocation_group, format_input, is_variable_write, parse_input

__all__ = ["lower_conds", "COND_OPS"]

#: Functional conditionals lowered when their branches write a variable.
COND_OPS = frozenset({"If", "StatelessIf"})
_BOOL = 10  # DT_BOOL: a predicate a Switch takes (an If's may be a number or a string, true when not zero or empty)
_CALLS = {"If": ("then_branch", "else_branch"), "StatelessIf": ("then_branch", "else_branch"),
          "While": ("cond", "body"), "StatelessWhile": ("cond", "body"), "Case": ("branches",),
          "StatefulPartitionedCall": ("f",), "PartitionedCall": ("f",)}


def lower_conds(graph_def: graph_pb2.GraphDef) -> tuple[graph_pb2.GraphDef, dict[str, str]]:
    """``graph_def`` (not modified) with every ``If`` whose branches write a variable lowered (see the
    module docstring; the library keeps the functions), and the tensor that stands for each output of a
    lowered ``If`` (``"<c>:<k>"`` -> ``"<c>/output_<k>:0"``)."""
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    library = {f.signature.name: f for f in graph_def.library.function}
    writes: dict[str, bool] = {}
    outputs: dict[str, str] = {}
    while True:
        conds = [n for n in out.node if n.op in COND_OPS and n.attr["Tcond"].type == _BOOL  # (else: left, refused)
                 and any(_writes(library, _branch(n, a), writes) for a in ("then_branch", "else_branch"))]
        if not conds:
            return out, outputs
        for node in conds:
            out = _lower(out, node.name, library)
            outputs.update({f"{node.name}:{k}": f"{node.name}/output_{k}:0"
                            for k in range(len(node.attr["Tout"].list.type))})


def _branch(node: node_def_pb2.NodeDef, attr: str) -> str:
    return node.attr[attr].func.name


def _writes(library: dict, function: str, cache: dict[str, bool]) -> bool:
    """Whether ``function`` (or one it calls) writes a variable."""
    if function not in cache:
        cache[function] = False  # a recursive call adds nothing
        fdef = library.get(function)
        found = False
        for node in fdef.node_def if fdef is not None else ():
            if is_variable_write(node.op):
                found = True
            for attr in _CALLS.get(node.op, ()):
                if attr not in node.attr:  # (reading a missing key of a map would add it to the library)
                    continue
                value = node.attr[attr]
                names = [f.name for f in value.list.func] if value.list.func else [value.func.name]
                found = found or any(_writes(library, name, cache) for name in names)
        cache[function] = found
    return cache[function]


def _lower(graph_def: graph_pb2.GraphDef, name: str, library: dict) -> graph_pb2.GraphDef:
    """``graph_def`` with the ``If`` called ``name`` lowered."""
    cond = next(n for n in graph_def.node if n.name == name)
    data = [t for t in cond.input if not t.startswith("^")]
    controls = [t for t in cond.input if t.startswith("^")]
    pred, args = data[0], data[1:]
    new: list[node_def_pb2.NodeDef] = []

    def add(op: str, suffix: str, inputs: list[str], **attrs) -> str:
        node = node_def_pb2.NodeDef(name=f"{name}/{suffix}", op=op, input=inputs)
        for key, value in attrs.items():
            node.attr[key].CopyFrom(value)
        new.append(node)
        return node.name

    def dtype(value: int) -> attr_value_pb2.AttrValue:
        return attr_value_pb2.AttrValue(type=value)

    boolean = dtype(_BOOL)
    switch_pred = add("Switch", "pred", [pred, pred, *controls], T=boolean)
    pivots = {True: add("Identity", "pivot_t", [f"{switch_pred}:1"], T=boolean),
              False: add("Identity", "pivot_f", [f"{switch_pred}:0"], T=boolean)}
    types = list(cond.attr["Tin"].list.type)
    switches = [add("Switch", f"switch_{i}", [arg, pred, *controls], T=dtype(types[i])) for i, arg in enumerate(args)]
    sources = [parse_input(arg)[0] for arg in args]
    results: dict[bool, list[str]] = {}
    done: dict[bool, str] = {}
    for taken, attr, label in ((True, "then_branch", "then"), (False, "else_branch", "else")):
        fdef = function_pb2.FunctionDef()
        fdef.CopyFrom(library[_branch(cond, attr)])  # function_def_to_graph_def adds to its arg_attr
        body, flat = function_def_to_graph_def(fdef)
        arg_names = [a.name for a in fdef.signature.input_arg]
        port = 1 if taken else 0
        bound = {a: f"{switches[i]}:{port}" for i, a in enumerate(arg_names)}
        colocate = {a: sources[i] for i, a in enumerate(arg_names)}
        prefix = f"{name}/{label}/"
        inner = [n for n in body.node if n.name not in bound]
        consumed = set()
        for node in inner:
            copy = node_def_pb2.NodeDef()
            copy.CopyFrom(node)
            copy.name = prefix + node.name
            copy.device = ""
            del copy.input[:]
            has_data = False
            for text in node.input:
                op, index, control = parse_input(text)
                consumed.add(op)
                if op in bound:  # an argument (one output): the switch's output on this branch
                    copy.input.append(f"^{pivots[taken]}" if control else bound[op])
                else:
                    copy.input.append(format_input(prefix + op, index, control))
                has_data = has_data or not control
            if not has_data:
                copy.input.append(f"^{pivots[taken]}")
            if "_class" in copy.attr:
                groups = [colocation_group(colocate.get(t[0]) or prefix + t[0]) if (t := colocated_with([g])) else g
                          for g in copy.attr["_class"].list.s]
                copy.attr["_class"].CopyFrom(attr_value_pb2.AttrValue(list=attr_value_pb2.AttrValue.ListValue(s=groups)))
            new.append(copy)
        outputs = []
        for arg in fdef.signature.output_arg:
            op, index, _ = parse_input(flat[fdef.ret[arg.name]])
            outputs.append(bound[op] if op in bound else format_input(prefix + op, index, False))  # an argument
        results[taken] = outputs
        sinks = [prefix + n.name for n in inner if n.name not in consumed]
        done[taken] = add("Identity", f"{label}_done", [pivots[taken], *(f"^{s}" for s in sinks)], T=boolean)
    executed = add("Merge", "branch_executed", [done[False], done[True]], T=boolean, N=attr_value_pb2.AttrValue(i=2))
    renamed = {}
    for k, out_type in enumerate(cond.attr["Tout"].list.type):
        merged = add("Merge", f"merge_{k}", [results[False][k], results[True][k]], T=dtype(out_type),
                     N=attr_value_pb2.AttrValue(i=2))
        renamed[k] = add("Identity", f"output_{k}", [merged, f"^{executed}"], T=dtype(out_type))
    clash = sorted({n.name for n in new} & {n.name for n in graph_def.node})
    if clash:
        raise AnalysisError(f'cannot lower the tf.cond "{name}" into the step\'s graph: its ops would take the names '
                            f"of ops the step has ({', '.join(clash[:3])}); rename the step's name scope {name!r}")
    out = graph_pb2.GraphDef()
    out.versions.CopyFrom(graph_def.versions)
    out.library.CopyFrom(graph_def.library)
    for node in graph_def.node:
        copy = out.node.add()
        if node.name == name:
            copy.name, copy.op = name, "NoOp"
            copy.input.append(f"^{executed}")
            continue
        copy.CopyFrom(node)
        for i, text in enumerate(copy.input):
            op, index, control = parse_input(text)
            if op == name and not control:
                copy.input[i] = renamed[index]
    out.node.extend(new)
    return out
