"""Whether a function of batches works row by row: each output row a function of the inputs' same row alone.

A ``tf.data`` map after ``batch()`` sees whole batches. Where it works row by row (a cast, a rescaling, a
normalisation by constants, a one-hot label, a lookup, a crop or resize of each image), applying it to a block of
a batch's rows gives that block's rows of applying it to the batch, so a worker may map its own block alone
(:mod:`parallax.tf2.input_split`). Where it may look across rows (a reduction over the batch, padding to the
longest row, a reshape that moves rows, the batch's size used as a value), it may not.

Decided on the function's graph by following where its inputs' rows go, op by op (those its outputs are computed
from): each tensor is
:attr:`State.ROWS` (its axis 0 is the inputs' rows), :attr:`State.FIXED` (the same whatever the rows: constants,
captured tables and variables, what is computed from them alone) or :attr:`State.SIZED` (the batch's shape,
which holds its size). An op is followed only where it is known to keep rows apart (element-wise ops,
broadcasting against values of lower rank, reshapes, slices, concatenations, stacks and gathers along other axes,
one-hot, lookups, image resizing); anything else that takes rows, or the size as a value, makes the answer "no",
with the op named. Nested functions and control flow are not followed (no).

Strings split into words (``StringSplitV2``: ``tf.strings.split``, ``TextVectorization``) make a ragged batch: its
values (every row's words, one row after another), each value's row, and the number of rows, each tied to the
split. Element-wise ops and lookups of the values keep them apart by row; ``RaggedTensorToTensor`` of one split's
parts to a fixed length (``[-1, L]``) gives rows again. The longest row's length (the split's shape), a padding
to it, or any other use of the parts looks across rows.
"""

from __future__ import annotations

import enum
import math
from collections.abc import Iterable
from typing import Any

import numpy as np
from tensorflow.python.framework import tensor_util

__all__ = ["State", "row_wise"]


class State(enum.Enum):
    """What a tensor of the function holds, as far as the batch's rows go."""

    ROWS = "rows"  # axis 0 is the inputs' rows
    FIXED = "fixed"  # the same whatever the rows
    SIZED = "sized"  # the shape of something with rows: it holds the batch's size
    # a ragged split of rows of strings (StringSplitV2): its parts, each tied to the split that made it
    SPLIT_INDICES = "split indices"  # [value, (row, position)]
    SPLIT_SHAPE = "split shape"  # (rows, the longest row's length): the latter looks across rows
    VALUES = "values"  # every row's values, one row after another
    ROW_IDS = "row ids"  # each value's row
    NROWS = "nrows"  # how many rows


_RAGGED = frozenset({State.SPLIT_INDICES, State.SPLIT_SHAPE, State.VALUES, State.ROW_IDS, State.NROWS})


_UNARY = frozenset({
    "Identity", "Snapshot", "StopGradient", "PreventGradient", "Cast", "Abs", "Neg", "Sign", "Reciprocal", "Inv",
    "Square", "Sqrt", "Rsqrt", "Exp", "Expm1", "Log", "Log1p", "Sin", "Cos", "Tan", "Tanh", "Sigmoid", "Relu",
    "Relu6", "Elu", "Selu", "Softplus", "Softsign", "Floor", "Ceil", "Round", "Rint", "IsNan", "IsInf",
    "IsFinite", "LogicalNot", "Invert", "Erf", "Erfc", "ZerosLike", "OnesLike", "CheckNumerics", "Real", "Imag",
    "StringLower", "StringUpper", "StaticRegexReplace", "StaticRegexFullMatch", "StringStrip",
    "StringToHashBucketFast", "StringToHashBucketStrong", "StringToHashBucket", "StringToNumber", "AsString",
    "StringLength", "DecodeBase64", "EncodeBase64", "Bitcast",
})
#: element-wise ops of several operands that broadcast (numpy's rules)
_BROADCAST = frozenset({
    "Add", "AddV2", "Sub", "Mul", "MulNoNan", "Div", "DivNoNan", "RealDiv", "FloorDiv", "FloorMod", "TruncateDiv",
    "TruncateMod", "Mod", "Maximum", "Minimum", "Pow", "SquaredDifference", "Atan2", "Xdivy", "Xlogy",
    "Less", "LessEqual", "Greater", "GreaterEqual", "Equal", "NotEqual", "LogicalAnd", "LogicalOr",
    "BitwiseAnd", "BitwiseOr", "BitwiseXor", "LeftShift", "RightShift", "SelectV2", "ClipByValue", "BiasAdd",
    "RegexReplace", "RegexFullMatch", "StringJoin",
})
#: ops that take a batch of images (axis 0) and treat each alone
_PER_IMAGE = frozenset({"ResizeBilinear", "ResizeNearestNeighbor", "ResizeBicubic", "ResizeArea",
                        "AdjustContrastv2", "AdjustHue", "AdjustSaturation", "RGBToHSV", "HSVToRGB"})


class _NotRowWise(Exception):
    pass


def row_wise(graph: Any, inputs: Iterable[Any], outputs: Iterable[Any]) -> str:
    """Why ``graph``'s function (``inputs``: its arguments, each with the rows on axis 0; every other placeholder a
    capture) may look across rows, or ``""`` where each row of every one of ``outputs`` depends only on the
    inputs' same row."""
    outputs = list(outputs)
    states: dict[Any, tuple[State, str]] = {t.ref(): (State.ROWS, "") for t in inputs}
    needed = _needed(outputs)
    try:
        for op in graph.get_operations():
            if op in needed:
                _follow(op, states)
        for t in outputs:
            state, _ = states.get(t.ref(), (State.FIXED, ""))
            if state is not State.ROWS:
                raise _NotRowWise(f"its output {t.name} has no rows of its own (it is the same for every row, or the "
                                  "batch's size)")
    except _NotRowWise as e:
        return str(e)
    return ""


def _needed(outputs: list) -> set:
    """The ops whose values ``outputs`` are computed from (what else the function computes does not matter)."""
    needed, todo = set(), [t.op for t in outputs]
    while todo:
        op = todo.pop()
        if op not in needed:
            needed.add(op)
            todo.extend(t.op for t in op.inputs)
    return needed


def _follow(op: Any, states: dict) -> None:
    """Each output of ``op``'s state (and the ragged split it belongs to), from its inputs'; :class:`_NotRowWise`
    where ``op`` may mix rows."""
    if op.type == "Placeholder" and op.outputs[0].ref() in states:
        return
    given, splits = zip(*[states.get(t.ref(), (State.FIXED, "")) for t in op.inputs]) if op.inputs else ((), ())
    if all(s is State.FIXED for s in given):
        return  # computed from what is the same for every batch (an input-less op too)
    rule = _RULES.get(op.type)
    if rule is None:
        taken = "the batch's size" if State.SIZED in given else "the rows"
        raise _NotRowWise(f"{op.type} ({op.name}) takes {taken}, and it is not known to keep rows apart")
    if len(set(splits) - {""}) > 1:
        raise _refuse(op, "takes the parts of two ragged splits, whose values need not line up")
    result = rule(op, list(given))
    split = op.name if op.type == "StringSplitV2" else max(splits)
    for t, s in zip(op.outputs, result if isinstance(result, list) else [result] * len(op.outputs)):
        states[t.ref()] = (s, split if s in _RAGGED else "")


def _refuse(op: Any, why: str) -> _NotRowWise:
    return _NotRowWise(f"{op.type} ({op.name}) {why}")


def _rank(t: Any) -> int:
    rank = t.shape.rank
    if rank is None:
        raise _NotRowWise(f"{t.name} has no known rank")
    return rank


def _const(op: Any, t: Any) -> np.ndarray:
    value = tensor_util.constant_value(t)
    if value is None:
        raise _refuse(op, f"takes {t.name}, which is not a constant")
    return np.asarray(value)


def _only_rows(op: Any, given: list[State]) -> None:
    if State.SIZED in given or State.NROWS in given:
        raise _refuse(op, "takes the batch's size as a value")
    if _RAGGED & set(given):
        raise _refuse(op, "takes a ragged split's parts, and it is not known to keep their rows apart")


def _unary(op: Any, given: list[State]) -> State:
    if op.type in ("Identity", "Snapshot") or (given[0] is State.VALUES and len(given) == 1):
        return given[0]  # an element-wise op of a split's values: each row's values alone
    _only_rows(op, given)
    if any(s is State.ROWS for s in given[1:]):
        raise _refuse(op, "takes rows beside its first operand")
    return given[0]


def _broadcast(op: Any, given: list[State]) -> State:
    """Rows broadcast against operands of lower rank (aligned on their last axes) or a leading axis of 1; operands
    with rows all of one rank. A split's values likewise (of one split: :func:`_follow`)."""
    kind = State.VALUES if State.VALUES in given else State.ROWS
    _only_rows(op, [State.ROWS if s is kind else s for s in given])
    rows = [t for t, s in zip(op.inputs, given) if s is kind]
    rank = _rank(rows[0])
    if any(_rank(t) != rank for t in rows):
        raise _refuse(op, "aligns operands with rows of different ranks (one's rows meet another's other axis)")
    for t, s in zip(op.inputs, given):
        if s is State.FIXED and (_rank(t) > rank or (_rank(t) == rank and t.shape[0] != 1)):
            raise _refuse(op, f"broadcasts rows against {t.name} of shape {t.shape}, whose axis 0 meets theirs")
    return kind


def _select(op: Any, given: list[State]) -> State:
    """``Select`` (v1): a condition of rank 1 picks whole rows, one row each."""
    if given[0] is State.ROWS and _rank(op.inputs[0]) == 1 and given[1:] == [State.ROWS, State.ROWS]:
        return State.ROWS
    return _broadcast(op, given)


def _first_only(op: Any, given: list[State]) -> None:
    """Rows only in the first operand; the others (shapes, axes, sizes) constants."""
    _only_rows(op, given)
    if any(s is not State.FIXED for s in given[1:]):
        raise _refuse(op, "takes rows in an operand other than its first")


def _axis(op: Any, axis: int, rank: int) -> int:
    """``axis`` in ``[0, rank)``."""
    return axis + rank if axis < 0 else axis


def _reshape(op: Any, given: list[State]) -> State:
    """``[-1, d1, ...]`` of rows whose other axes hold as many values as ``d1 * ...``."""
    _first_only(op, given)
    shape = _const(op, op.inputs[1]).tolist()
    inner = op.inputs[0].shape[1:]
    if not shape or shape[0] != -1 or any(d < 0 for d in shape[1:]) or not inner.is_fully_defined() \
            or math.prod(inner.as_list()) != math.prod(shape[1:]):
        raise _refuse(op, f"reshapes rows of shape {op.inputs[0].shape} to {shape}: rows may move")
    return State.ROWS


def _expand_dims(op: Any, given: list[State]) -> State:
    _first_only(op, given)
    if _axis(op, int(_const(op, op.inputs[1])), _rank(op.inputs[0]) + 1) == 0:
        raise _refuse(op, "puts a new axis before the rows")
    return State.ROWS


def _squeeze(op: Any, given: list[State]) -> State:
    _first_only(op, given)
    rank = _rank(op.inputs[0])
    dims = [_axis(op, d, rank) for d in op.get_attr("squeeze_dims")]
    if not dims or 0 in dims:
        raise _refuse(op, "may squeeze the rows' axis (a batch of one row)")
    return State.ROWS


def _transpose(op: Any, given: list[State]) -> State:
    _first_only(op, given)
    if int(_const(op, op.inputs[1])[0]) != 0:
        raise _refuse(op, "moves the rows' axis")
    return State.ROWS


def _strided_slice(op: Any, given: list[State]) -> State:
    """Every row (an ellipsis first, or axis 0 taken whole, in order); of a shape, its axes after the first."""
    _first_only(op, [State.ROWS, *given[1:]])  # a shape's slice: below
    ellipsis, new_axis, shrink = (op.get_attr(a) for a in ("ellipsis_mask", "new_axis_mask", "shrink_axis_mask"))
    begin, end = op.get_attr("begin_mask"), op.get_attr("end_mask")
    starts, strides = _const(op, op.inputs[1]), _const(op, op.inputs[3])
    if given[0] in (State.SPLIT_INDICES, State.SPLIT_SHAPE):
        return _split_part(op, given[0], starts, strides, (ellipsis, new_axis, shrink, begin, end))
    if given[0] is State.SIZED:  # the shape of rows: its axes after the first are the same for every batch
        first, length = (int(starts[0]) if starts.size else 0), op.inputs[0].shape[0]
        first += length if first < 0 and length is not None else 0
        if not ellipsis & 1 and not new_axis & 1 and not begin & 1 and first >= 1 and int(strides[0]) > 0:
            return State.FIXED
        raise _refuse(op, "takes the batch's size from a shape")
    _only_rows(op, given)
    if ellipsis & 1 and not new_axis & 1:
        return State.ROWS
    whole = begin & 1 and end & 1 and not (shrink & 1) and not (new_axis & 1) and int(strides[0]) == 1
    if not whole:
        raise _refuse(op, "slices the rows' axis")
    return State.ROWS


def _split_part(op: Any, part: State, starts: np.ndarray, strides: np.ndarray, masks: tuple[int, ...]) -> State:
    """``indices[:, 0]`` of a split (each value's row) and ``shape[0]`` (its rows); nothing else of them."""
    ellipsis, new_axis, shrink, begin, end = masks
    plain = not ellipsis and not new_axis and all(int(v) == 1 for v in strides)
    if part is State.SPLIT_INDICES and plain and begin & 1 and end & 1 and shrink == 2 and int(starts[1]) == 0:
        return State.ROW_IDS
    if part is State.SPLIT_SHAPE and plain and not begin & 1 and shrink == 1 and int(starts[0]) == 0:
        return State.NROWS
    raise _refuse(op, "takes a ragged split's positions or its longest row's length, which look across rows")


def _string_split(op: Any, given: list[State]) -> list[State]:
    """Rows of strings split into ragged rows: (indices, values, shape)."""
    _first_only(op, given)
    if _rank(op.inputs[0]) != 1:
        raise _refuse(op, "splits rows of more than one string each")
    return [State.SPLIT_INDICES, State.VALUES, State.SPLIT_SHAPE]


def _ragged_to_tensor(op: Any, given: list[State]) -> State:
    """A split's rows, each cut or padded to one fixed length (not the batch's longest row's)."""
    shape, values, default, *partitions = given
    kinds = [k.decode() if isinstance(k, bytes) else k for k in op.get_attr("row_partition_types")]
    if values is not State.VALUES or default is not State.FIXED or shape is not State.FIXED \
            or list(zip(kinds, partitions)) != [("FIRST_DIM_SIZE", State.NROWS), ("VALUE_ROWIDS", State.ROW_IDS)]:
        raise _refuse(op, "makes a tensor of other parts than one split's values, row ids and rows")
    size = tensor_util.constant_value(op.inputs[0])
    if size is None or size.ndim != 1 or len(size) != 2 or int(size[0]) != -1 or int(size[1]) < 0:
        raise _refuse(op, f"pads each row to the batch's longest (shape {size}): give the rows a fixed length")
    return State.ROWS


def _slice(op: Any, given: list[State]) -> State:
    _first_only(op, given)
    if int(_const(op, op.inputs[1])[0]) != 0 or int(_const(op, op.inputs[2])[0]) != -1:
        raise _refuse(op, "slices the rows' axis")
    return State.ROWS


def _concat(op: Any, given: list[State]) -> State:
    """Along an axis after the rows, of operands that all have rows."""
    _only_rows(op, given)
    values, states = op.inputs[:-1], given[:-1]
    if given[-1] is not State.FIXED or any(s is not State.ROWS for s in states):
        raise _refuse(op, "joins rows with values that have none")
    if _axis(op, int(_const(op, op.inputs[-1])), _rank(values[0])) == 0:
        raise _refuse(op, "joins along the rows' axis")
    return State.ROWS


def _pack(op: Any, given: list[State]) -> State:
    _only_rows(op, given)
    if any(s is not State.ROWS for s in given):
        raise _refuse(op, "stacks rows with values that have none")
    if _axis(op, op.get_attr("axis"), _rank(op.inputs[0]) + 1) == 0:
        raise _refuse(op, "stacks along a new first axis")
    return State.ROWS


def _unpack(op: Any, given: list[State]) -> State:
    _first_only(op, given)
    if _axis(op, op.get_attr("axis"), _rank(op.inputs[0])) == 0:
        raise _refuse(op, "cuts the rows apart")
    return State.ROWS


def _gather(op: Any, given: list[State]) -> State:
    """Rows of a constant table looked up by rows of indices (axis 0), or rows' values picked along another
    axis by constant indices."""
    _only_rows(op, given)
    params, indices, axis = given
    if axis is not State.FIXED or op.get_attr("batch_dims") != 0:
        raise _refuse(op, "gathers with a batch dimension or an axis that is not a constant")
    at = _axis(op, int(_const(op, op.inputs[2])), _rank(op.inputs[0]))
    if params is State.FIXED and indices is State.ROWS and at == 0 and _rank(op.inputs[1]) >= 1:
        return State.ROWS
    if params is State.ROWS and indices is State.FIXED and at > 0:
        return State.ROWS
    raise _refuse(op, "gathers along the rows' axis")


def _gather_rows(op: Any, given: list[State]) -> State:
    """``Gather`` and ``ResourceGather`` (a variable's rows): a constant table's rows for indices with rows."""
    _only_rows(op, given)
    if given[0] is not State.FIXED or given[1] is not State.ROWS or _rank(op.inputs[1]) < 1 \
            or (op.type == "ResourceGather" and op.get_attr("batch_dims") != 0):
        raise _refuse(op, "gathers along the rows' axis")
    return State.ROWS


def _one_hot(op: Any, given: list[State]) -> State:
    _first_only(op, given)
    if _axis(op, op.get_attr("axis"), _rank(op.inputs[0]) + 1) == 0 or _rank(op.inputs[0]) == 0:
        raise _refuse(op, "puts its classes before the rows")
    return State.ROWS


def _lookup(op: Any, given: list[State]) -> State:
    """A table's values for keys with rows, or for a split's values (each key looked up alone)."""
    table, keys, default = given
    if keys is State.VALUES and table is default is State.FIXED:
        return State.VALUES
    _only_rows(op, given)
    if table is not State.FIXED or default is not State.FIXED or keys is not State.ROWS or _rank(op.inputs[1]) < 1:
        raise _refuse(op, "looks up keys without rows, or with a table or default that has rows")
    return State.ROWS


def _per_image(op: Any, given: list[State]) -> State:
    _first_only(op, given)
    return State.ROWS


def _shape(op: Any, given: list[State]) -> State | list[State]:
    states = [State.FIXED if s is State.FIXED else State.SIZED for s in given]
    return states if op.type == "ShapeN" else states[0]


def _identity_n(op: Any, given: list[State]) -> list[State]:
    return list(given)


_RULES = {
    **dict.fromkeys(_UNARY, _unary), **dict.fromkeys(_BROADCAST, _broadcast), **dict.fromkeys(_PER_IMAGE, _per_image),
    "Select": _select, "Reshape": _reshape, "ExpandDims": _expand_dims, "Squeeze": _squeeze,
    "Transpose": _transpose, "StridedSlice": _strided_slice, "Slice": _slice, "ConcatV2": _concat, "Pack": _pack,
    "Unpack": _unpack, "GatherV2": _gather, "Gather": _gather_rows, "ResourceGather": _gather_rows,
    "OneHot": _one_hot, "LookupTableFindV2": _lookup, "LookupTableFind": _lookup, "Shape": _shape, "ShapeN": _shape,
    "IdentityN": _identity_n, "StringSplitV2": _string_split, "RaggedTensorToTensor": _ragged_to_tensor,
}
