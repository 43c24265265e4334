"""An optimizer's element-wise update of one variable (:class:`~parallax.rewrite.zero_regions.RegionUpdate`) as
one loop of C++ over the elements, which :mod:`parallax.rewrite.fused_updates` compiles and runs in one op
(``parallax/rewrite/fused_update.cc``).

The region's state ops are read in their order: a read of the variable or a slot is its value so far (before
the update, or what the region last wrote to it), ``AssignAdd``/``AssignSub``/``Assign`` give it a new one, and
each element-wise op is the same IEEE operation TensorFlow's kernel makes of the same two numbers
(:data:`EXPRESSIONS`: only operations that are exact, so that the loop's results are TensorFlow's to the bit;
no approximations such as ``Rsqrt``, ``Exp`` or ``Pow``). The gradient and the other whole tensors are read
element by element, the scalars once.

What the loop cannot say the same way leaves the update as it is (:class:`Unfused` names why): another kind of
op, another dtype, reads and writes of one variable that the graph does not order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from tensorflow.core.framework import node_def_pb2, types_pb2
from tensorflow.python.framework import op_def_registry

from parallax.graph.graph_ops import canonical, parse_input, variable_behind
from parallax.rewrite.zero_regions import RegionUpdate

__all__ = ["Program", "Unfused", "compile_region", "same_value", "same_inputs", "data_inputs", "EXPRESSIONS", "SYMBOL"]

#: The C++ expression of each element-wise op TensorFlow computes exactly so (``{0}``, ``{1}``: its inputs).
#: ``Maximum``/``Minimum`` as TensorFlow's: NaN where either is NaN, else the first unless the second is
#: larger (smaller), so ``max(-0, 0)`` is ``-0``.
EXPRESSIONS = {
    "Neg": "-{0}", "Abs": "std::fabs({0})", "Square": "{0} * {0}", "Sqrt": "std::sqrt({0})",
    "Add": "{0} + {1}", "AddV2": "{0} + {1}", "Sub": "{0} - {1}", "Mul": "{0} * {1}", "RealDiv": "{0} / {1}",
    "Div": "{0} / {1}", "Maximum": "parallax_max({0}, {1})", "Minimum": "parallax_min({0}, {1})",
}
_PASS = frozenset({"Identity", "Snapshot"})
_WRITES = {"AssignAddVariableOp": "{0} + {1}", "AssignSubVariableOp": "{0} - {1}", "AssignVariableOp": "{1}"}
_READ = "ReadVariableOp"
_TYPES = {types_pb2.DT_FLOAT: "float", types_pb2.DT_DOUBLE: "double"}
#: The compiled function's name in its library.
SYMBOL = "parallax_update"


class Unfused(Exception):
    """Why a region stays as TensorFlow's ops."""


@dataclass(frozen=True)
class Program:
    """A region's update as one loop.

    Attributes:
        dtype: ``"float"`` or ``"double"``.
        handles: each variable's handle (the graph tensor its state ops take), the updated variable first.
        inputs: the graph tensors the loop reads besides the variables.
        kinds: for each input, ``"x"`` where it has the variable's number of elements, ``"c"`` where it has one
            (a scalar), ``"s"`` where it is the rows of a sparse gradient that the graph sums into a tensor of the
            variable's shape (``UnsortedSegmentSum``): the loop sums them itself, as that op does (each element
            from zero, the rows in their order), into a row at a time.
        body: the loop's statements, after the loads of the variables and whole inputs.
        writes: ``(variable, expression)``: the variables (indices into ``handles``) the loop writes, and their
            new values.
        ops: the graph's ops the loop computes (the region's state ops, and the element-wise ops on the gradient
            before them).
        ids: the row indices of the ``"s"`` inputs (graph tensors, each once).
        sparse: for each ``"s"`` input, in their order, its ``ids`` index.
        index_type: the ``ids``' dtype (``"int32"``, ``"int64"``).
    """

    dtype: str
    handles: tuple[str, ...]
    inputs: tuple[str, ...]
    kinds: tuple[str, ...]
    body: tuple[str, ...]
    writes: tuple[tuple[int, str], ...]
    ops: tuple[str, ...] = ()
    ids: tuple[str, ...] = ()
    sparse: tuple[int, ...] = ()
    index_type: str = "int32"

    def source(self) -> str:
        """The C++ of the loop: ``parallax_update(sources, targets, rows, width, begin, end)`` (see
        fused_update.cc): elements ``[begin, end)``, whole rows of ``width`` where the loop sums sparse rows.

        >>> p = Program("float", ("v",), ("g", "lr"), ("x", "c"), ("const T r0 = x0 * c1;",), ((0, "v0 - r0"),))
        >>> print(p.source().split("{", 3)[3])  # doctest: +NORMALIZE_WHITESPACE
          const T* s0 = static_cast<const T*>(sources[0]);
          const T* s1 = static_cast<const T*>(sources[1]);
          const T c1 = static_cast<const T*>(sources[2])[0];
          T* t0 = static_cast<T*>(targets[0]);
        #pragma GCC ivdep
          for (int64_t i = begin; i < end; ++i) {
            const T v0 = s0[i];
            const T x0 = s1[i];
            const T r0 = x0 * c1;
            t0[i] = v0 - r0;
          }
        }
        """
        k = len(self.handles)
        setup = [f"  const T* s{v} = static_cast<const T*>(sources[{v}]);" for v in range(k)]
        loads = [f"const T v{v} = s{v}[i];" for v in range(k)]
        sums = []
        for i, kind in enumerate(self.kinds):
            if kind == "c":
                setup.append(f"  const T c{i} = static_cast<const T*>(sources[{k + i}])[0];")
                continue
            setup.append(f"  const T* s{k + i} = static_cast<const T*>(sources[{k + i}]);")
            if kind == "x":
                loads.append(f"const T x{i} = s{k + i}[i];")
                continue
            j = self.kinds[:i].count("s")  # the j-th sparse input: its rows' sums, a row at a time, in b<i>
            setup += [f"  const int64_t* o{i} = rows[{2 * j}];  // where each row's positions start",
                      f"  const int64_t* p{i} = rows[{2 * j + 1}];  // the positions summed into each row",
                      f"  std::vector<T> b{i}(width);"]
            sums += [f"    std::fill(b{i}.begin(), b{i}.end(), T(0));",
                     f"    for (int64_t q = o{i}[row]; q < o{i}[row + 1]; ++q) {{",
                     f"      const T* d = s{k + i} + p{i}[q] * width;",
                     f"      for (int64_t c = 0; c < width; ++c) b{i}[c] += d[c];",
                     "    }"]
            loads.append(f"const T x{i} = b{i}[c];")
        setup += [f"  T* t{j} = static_cast<T*>(targets[{j}]);" for j in range(len(self.writes))]
        step = [*loads, *self.body, *(f"t{j}[i] = {value};" for j, (_, value) in enumerate(self.writes))]
        if sums:  # a row at a time
            loop = ["  for (int64_t row = begin / width; row < end / width; ++row) {", *sums,
                    "#pragma GCC ivdep",
                    "    for (int64_t c = 0; c < width; ++c) {", "      const int64_t i = row * width + c;",
                    *(f"      {line}" for line in step), "    }", "  }"]
        else:
            loop = ["#pragma GCC ivdep", "  for (int64_t i = begin; i < end; ++i) {",
                    *(f"    {line}" for line in step), "  }"]
        return "\n".join([
            "// Written by parallax/rewrite/fused_programs.py: one optimizer update, element by element.",
            "#include <algorithm>", "#include <cmath>", "#include <cstdint>", "#include <vector>",
            f"typedef {self.dtype} T;",
            "static inline T parallax_max(T a, T b) {",
            "  return std::isnan(a) ? a : std::isnan(b) ? b : (a < b ? b : a);", "}",
            "static inline T parallax_min(T a, T b) {",
            "  return std::isnan(a) ? a : std::isnan(b) ? b : (b < a ? b : a);", "}",
            f'extern "C" void {SYMBOL}(const void* const* sources, void* const* targets,',
            "                          const int64_t* const* rows, int64_t width, int64_t begin, int64_t end) {",
            *setup,
            # each element's sources are loaded before its targets are stored: in place is safe
            *loop, "}", ""])


def compile_region(u: RegionUpdate, nodes: dict[str, node_def_pb2.NodeDef], shapes: dict[str, tuple | None],
                   absorb: Callable[[str], bool] = lambda op: True) -> Program:
    """``u``'s state ops as one loop (see the module docstring); ``shapes``: the graph's static shapes. An
    element-wise op of the region that computes a whole tensor from the gradient (``Square`` of it) is computed in
    the loop too where ``absorb`` says so (else the loop reads its result); equal whole tensors (two
    ``UnsortedSegmentSum`` of one sparse gradient) are read once.

    Raises:
        Unfused: what in the region the loop cannot say.
    """
    dtype = _TYPES.get(u.dtype.as_datatype_enum)
    if dtype is None:
        raise Unfused(f"its dtype is {u.dtype.name}")
    _check_order(u, nodes)
    handles: dict[str, int] = {}
    handle_inputs: list[str] = []
    inputs: dict[str, int] = {}
    kinds: dict[str, str | None] = {}  # "x": a whole tensor, "c": a scalar, "s": sparse rows summed
    ids: dict[str, int] = {}
    sparse: list[int] = []
    index_types: set[int] = set()
    current: dict[str, str] = {}  # each variable's value so far
    values: dict[str, str] = {}  # each tensor's expression in the loop
    body: list[str] = []
    compiled: list[str] = []
    full = tuple(u.var.shape)

    def variable(node: node_def_pb2.NodeDef) -> str:
        name = variable_behind(parse_input(node.input[0])[0], nodes)
        if name not in handles:
            handles[name] = len(handles)
            handle_inputs.append(node.input[0])
            current[name] = f"v{handles[name]}"
        return name

    def kind(tensor: str) -> str | None:
        if tensor not in kinds:
            op = parse_input(tensor)[0]
            shape = shapes.get(tensor)
            if tensor in u.whole or shape is not None and tuple(shape) == full:
                kinds[tensor] = "x"
            elif shape is not None and None not in shape and int(np.prod(shape)) == 1:
                kinds[tensor] = "c"
            elif op in u.ops and nodes[op].op in EXPRESSIONS:
                found = {kind(canonical(t)) for t in nodes[op].input if not t.startswith("^")}
                kinds[tensor] = "x" if "x" in found and None not in found else None
            else:
                kinds[tensor] = None
        return kinds[tensor]

    def register(expression: str) -> str:
        name = f"r{len(body)}"
        body.append(f"const T {name} = {expression};")
        return name

    def operand(text: str) -> str:
        tensor = canonical(text)
        if tensor in values:
            return values[tensor]
        op = parse_input(tensor)[0]
        node = nodes[op]
        if op not in u.state and op in u.ops and kind(tensor) == "x" and _typed(node, dtype) and (
                node.op in _PASS or node.op in EXPRESSIONS) and absorb(op):  # from the gradient: in the loop too
            data = [t for t in node.input if not t.startswith("^")]
            values[tensor] = operand(data[0]) if node.op in _PASS else \
                register(EXPRESSIONS[node.op].format(*(operand(t) for t in data)))
            compiled.append(op)
            return values[tensor]
        same = next((t for t in inputs if kinds.get(t) == "x" and same_value(t, tensor, nodes, nodes)), None)
        if same is None:
            if kind(tensor) is None:
                raise Unfused(f'"{tensor}" is neither of the variable\'s shape nor one element')
            same = tensor
            summed = u.summed.get(tensor)
            if summed is not None and _TYPES.get(nodes[op].attr["T"].type) == dtype:  # rows the loop sums
                rows, indices = summed
                if rows in inputs:  # the same rows summed twice
                    if kinds[rows] != "s" or sparse[[t for t in inputs if kinds[t] == "s"].index(rows)] != ids.get(
                            indices):
                        raise Unfused(f'"{rows}" is summed by two sets of indices')
                    values[tensor] = f"x{inputs[rows]}"
                    return values[tensor]
                inputs[rows] = len(inputs)
                kinds[rows] = "s"
                sparse.append(ids.setdefault(indices, len(ids)))
                index_types.add(nodes[op].attr["Tindices"].type)
                values[tensor] = f"x{inputs[rows]}"
                return values[tensor]
            inputs[tensor] = len(inputs)
        values[tensor] = f"{'c' if kinds[same] == 'c' else 'x'}{inputs[same]}"
        return values[tensor]

    variable(nodes[u.writes[0]])  # the updated variable's own first: the op takes its size
    for name in u.state:
        node = nodes[name]
        data = [t for t in node.input if not t.startswith("^")]
        if not _typed(node, dtype):
            raise Unfused(f'"{name}" ({node.op}) computes in another type than {dtype}')
        compiled.append(name)
        if node.op == _READ:
            values[f"{name}:0"] = current[variable(node)]
        elif node.op in _WRITES:
            target = variable(node)
            current[target] = register(_WRITES[node.op].format(current[target], operand(data[1])))
        elif node.op in _PASS:
            values[f"{name}:0"] = operand(data[0])
        elif node.op in EXPRESSIONS:
            values[f"{name}:0"] = register(EXPRESSIONS[node.op].format(*(operand(t) for t in data)))
        else:
            raise Unfused(f'"{name}" ({node.op}) is not one of the exact element-wise ops')
    writes = tuple((handles[v], current[v]) for v in handles if current[v] != f"v{handles[v]}")
    ordered = sorted(inputs, key=inputs.get)
    if len(index_types) > 1:
        raise Unfused("its sparse gradients' indices are of two types")
    index_type = types_pb2.DataType.Name(index_types.pop()).removeprefix("DT_").lower() if index_types else "int32"
    return Program(dtype, tuple(handle_inputs), tuple(ordered), tuple(kinds[t] for t in ordered), tuple(body), writes,
                   tuple(compiled), tuple(sorted(ids, key=ids.get)), tuple(sparse), index_type)


def same_value(a: str, b: str, nodes: dict[str, node_def_pb2.NodeDef], others: dict[str, node_def_pb2.NodeDef],
               depth: int = 0) -> bool:
    """Whether tensor ``a`` of the graph ``nodes`` and ``b`` of ``others`` (the same graph, or the graph optimizer's
    version of it) hold the same value: the same tensor, two constants of one value, or (up to a few ops back) the
    same op of the same attributes on the same values (an optimizer keeps one of equal computations)."""
    if a == b:
        return True
    (op_a, index_a, _), (op_b, index_b, _) = parse_input(a), parse_input(b)
    x, y = nodes.get(op_a), others.get(op_b)
    if x is None or y is None or index_a != index_b or x.op != y.op or depth >= _DEPTH:
        return False
    if nodes is others and _stateful(x.op):  # two reads of a variable may read two values; the optimizer keeps
        return False  # one of two only where they are the same
    if x.op == "Const":
        return _constant(x) == _constant(y)
    names = {k for k in set(x.attr) | set(y.attr) if not k.startswith("_")}
    if any(k not in x.attr or k not in y.attr or x.attr[k] != y.attr[k] for k in names):
        return False
    return same_inputs(x, y, nodes, others, depth + 1)


def same_inputs(x: node_def_pb2.NodeDef, y: node_def_pb2.NodeDef, nodes: dict, others: dict, depth: int = 0) -> bool:
    """Whether the ops ``x`` (of ``nodes``) and ``y`` (of ``others``) take the same values (:func:`same_value`;
    in either order for an op whose order does not matter)."""
    ours, theirs = data_inputs(x, nodes), data_inputs(y, others)
    if len(ours) != len(theirs):
        return False
    if x.op in _COMMUTATIVE and len(ours) == 2 and not all(
            same_value(a, b, nodes, others, depth) for a, b in zip(ours, theirs)):
        theirs = theirs[::-1]
    return all(same_value(a, b, nodes, others, depth) for a, b in zip(ours, theirs))


def data_inputs(node: node_def_pb2.NodeDef, nodes: dict[str, node_def_pb2.NodeDef]) -> list[str]:
    """``node``'s data inputs, each followed back through the ops that pass a value on (``Identity``, an
    ``IdentityN``'s output ``k``: its input ``k``)."""
    found = []
    for text in node.input:
        if text.startswith("^"):
            continue
        op, index, _ = parse_input(text)
        while op in nodes and (nodes[op].op in _PASS and index == 0 or nodes[op].op == "IdentityN") \
                and len(nodes[op].input) > index:
            op, index, _ = parse_input(nodes[op].input[index])
        found.append(f"{op}:{index}")
    return found


_COMMUTATIVE = frozenset({"Add", "AddV2", "Mul", "Maximum", "Minimum"})
_DEPTH = 8


def _stateful(op: str) -> bool:
    found = op_def_registry.get(op)
    return found is None or found.is_stateful


def _constant(node: node_def_pb2.NodeDef) -> tuple:
    value = tf.make_ndarray(node.attr["value"].tensor)
    return value.dtype.str, value.shape, value.tobytes()


def _typed(node: node_def_pb2.NodeDef, dtype: str) -> bool:
    key = "dtype" if node.op == _READ or node.op in _WRITES else "T"
    return _TYPES.get(node.attr[key].type) == dtype


def _check_order(u: RegionUpdate, nodes: dict[str, node_def_pb2.NodeDef]) -> None:
    """Each write of a variable in the region and every other read or write of it must follow one another in the
    graph (as a traced function's automatic control dependencies order them): the loop runs them in the order of
    ``u.state``."""
    before: dict[str, frozenset[str]] = {}

    def earlier(name: str) -> frozenset[str]:  # the region's ops ``name`` waits for
        if name not in before:
            sources = {parse_input(t)[0] for t in nodes[name].input} & u.ops
            before[name] = frozenset(sources).union(*(earlier(s) for s in sources))
        return before[name]

    touching: dict[str, list[str]] = {}
    for name in u.state:
        node = nodes[name]
        if node.op == _READ or node.op in _WRITES:
            touching.setdefault(variable_behind(parse_input(node.input[0])[0], nodes), []).append(name)
    for variable, ops in touching.items():
        for i, a in enumerate(ops):
            for b in ops[i + 1:]:
                if (nodes[a].op in _WRITES or nodes[b].op in _WRITES) and a not in earlier(b):
                    raise Unfused(f'"{a}" and "{b}" read and write "{variable}" in no order the graph gives')
