"""The first step checks itself: is the step's gradient a mean over its examples?

Data-parallel training equals one device only when the step's gradient on a batch is the mean of the
gradients of its parts (weighted by their sizes): then the replicas' mean gradient is the union batch's. A
step that normalises by its batch's statistics (batch normalisation), sums over the batch
(``ops.tensordot(a, b, 2)`` added to every example) or draws random numbers (dropout, noise drawn at a fixed
batch size) breaks that, and no data-parallel system says so.

So before its first step, worker 0 computes, in its own replica's copy of the single-device graph and with the
variables as they start, the gradients of its first replica's part and of the part's two halves, and compares
the part's with the halves' mean weighted by their sizes (:func:`compare`): three forward and backward passes,
no update, nothing kept. Where they differ beyond float rounding, a WARNING names the variables that differ
most and the likely causes. ``Config(check_first_step=False)`` turns it off.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from parallax.graph.graph_ops import STATEFUL_DRAWS, STATELESS_DRAWS, is_variable_write
from parallax.graph.names import EXACT_DRAWS
from parallax.logs import log as logger
from parallax.tf2.draws import PART_MARKS
from parallax.tf2.regions import GRADIENT_SCOPE

__all__ = ["check_first_step", "compare", "kernel_draws", "TOLERANCE", "FLOOR"]

#: The relative difference (largest element over the largest magnitude) above which a gradient is no mean over
#: its examples: float32 sums of a few hundred terms stay far below it; float16 gradients get 100 times more.
TOLERANCE = 1e-3
#: The smallest scale a gradient is measured against, as a fraction of the largest gradient element of the step.
FLOOR = 1e-4


def compare(part: dict[str, Any], halves: tuple[dict[str, Any], dict[str, Any]], sizes: tuple[int, int],
            summed: bool = False) -> dict[str, float]:
    """Each gradient's relative difference between ``part`` and the mean of ``halves`` weighted by ``sizes`` (or
    their sum: ``summed``) (dense arrays, or ``(values, indices)`` of a sparse one, summed by row first). A
    gradient much smaller than the largest (one that is zero in exact arithmetic, as an attention layer's key
    bias) is measured against :data:`FLOOR` times the largest, not against its own rounding noise.

    >>> compare({"w": np.array([2.0, 4.0])}, ({"w": np.array([1.0, 4.0])}, {"w": np.array([3.0, 4.0])}), (1, 1))
    {'w': 0.0}
    """
    total = sum(sizes)
    pairs = {}
    for name, whole in part.items():
        mean = sum(_dense(h[name]) * (1.0 if summed else n / total) for h, n in zip(halves, sizes))
        mine = _dense(whole)
        if isinstance(mean, dict) or isinstance(mine, dict):
            mine, mean = _aligned(mine, mean)
        pairs[name] = (mine, mean)
    largest = max((float(np.max(np.abs(m))) for m, _ in pairs.values() if np.size(m)), default=0.0)
    out = {}
    for name, (mine, mean) in pairs.items():
        scale = max(float(np.max(np.abs(mine))) if np.size(mine) else 0.0, FLOOR * largest)
        out[name] = float(np.max(np.abs(mine - mean))) / scale if scale > 0 else 0.0
    return out


def _dense(gradient: Any) -> Any:
    """A dense gradient as it is; a sparse one as ``{row: summed values}``."""
    if isinstance(gradient, tuple):
        values, indices = gradient
        rows: dict[int, np.ndarray] = {}
        for value, index in zip(np.asarray(values, np.float64), np.asarray(indices).reshape(-1)):
            rows[int(index)] = rows.get(int(index), 0.0) + value
        return _Rows(rows)
    return np.asarray(gradient, np.float64)


class _Rows(dict):
    """A sparse gradient's rows, summed by index; scaled and added as a gradient is."""

    def __mul__(self, factor: float) -> _Rows:
        return _Rows({k: v * factor for k, v in self.items()})

    __rmul__ = __mul__

    def __add__(self, other: Any) -> _Rows:
        if not isinstance(other, _Rows):
            return self
        merged = _Rows(self)
        for k, v in other.items():
            merged[k] = merged.get(k, 0.0) + v
        return merged

    __radd__ = __add__


def _aligned(a: _Rows, b: _Rows) -> tuple[np.ndarray, np.ndarray]:
    keys = sorted(set(a) | set(b))
    if not keys:
        return np.zeros(0), np.zeros(0)
    width = np.shape(next(iter(a.values())) if a else next(iter(b.values())))
    zero = np.zeros(width)
    return np.stack([a.get(k, zero) for k in keys]), np.stack([b.get(k, zero) for k in keys])


_DRAW_SCOPES = ("stateless_", "truncated")  # TensorFlow's own scopes of a draw (beside those naming "random")


def random_draws(graph: Any) -> list[str]:
    """The name scopes (a layer's, where Keras names them) of the ops of ``graph`` that draw random numbers, but those
    that take their part's rows of one device's draw (:mod:`parallax.tf2.draws`).

    >>> import tensorflow as tf
    >>> with tf.Graph().as_default() as g, tf.name_scope("vae/sampling"):
    ...     _ = tf.random.stateless_normal([2], seed=[1, 2])
    >>> random_draws(g)
    ['vae/sampling']
    """
    scopes: list[str] = []
    exact = {getattr(op, "name", op) for op in graph.get_collection(EXACT_DRAWS)}  # one device's numbers
    for op in graph.get_operations():
        if (op.type in STATEFUL_DRAWS or op.type in STATELESS_DRAWS) and op.name not in exact:
            parts = op.name.split("/")[:-1]
            while len(parts) > 1 and ("random" in parts[-1].lower() or parts[-1].startswith(_DRAW_SCOPES)):
                parts.pop()  # TensorFlow's own scopes of the draw, up to the layer's
            scope = "/".join(parts) or op.name
            if scope not in scopes:
                scopes.append(scope)
    return scopes


def _computed_gradient(tensors: tuple[str, str | None], graph: Any) -> list[str]:
    """What to fetch for a gradient the replicas aggregate at ``tensors``: those tensors, or, where they lie in a
    lowered conditional's branch (gradient accumulation applies the accumulated gradient in a ``tf.cond`` that
    does not run at the first step), the gradient computation's own outputs they are made from (one dense tensor,
    or an ``IndexedSlices``' values and indices: what the step computes from its batch, before the optimizer's
    accumulators)."""
    named = [t for t in tensors if t]
    if graph is None:
        return named
    found: list[Any] = []
    queue, seen, switched = [graph.get_tensor_by_name(t) for t in named], set(), False
    while queue:
        tensor = queue.pop()
        if tensor.name in seen:
            continue
        seen.add(tensor.name)
        op = tensor.op
        if GRADIENT_SCOPE.search(op.name):
            if op.type not in ("Shape", "Const") and tensor not in found:
                found.append(tensor)
        elif op.type in ("Switch", "RefSwitch"):
            switched = True
            queue.append(op.inputs[0])
        elif op.type == "IdentityN":
            queue.append(op.inputs[tensor.value_index])
        elif op.type not in ("Const", "ReadVariableOp", "VarHandleOp", "Placeholder"):
            queue.extend(op.inputs)
    if not switched or not 1 <= len(found) <= 2:
        return named
    found.sort(key=lambda t: t.dtype.is_integer)  # values, then indices
    return [t.name for t in found]


def _part_start(graph: Any) -> str | None:
    """The tensor that says where the step's part starts in the union batch (marked by
    :mod:`parallax.tf2.draws`: ``parallax.fit``'s step, a loop's that draws), by its name; ``None`` where the step
    has no such mark."""
    if graph is None:
        return None
    try:
        return graph.get_operation_by_name(PART_MARKS[1]).outputs[0].name
    except KeyError:
        return None


def kernel_draws(graph: Any) -> list[Any]:
    """The seeded stateful draws of ``graph`` that take their rows of one device's draw, in the graph's order (a
    draw's shape may depend on an earlier draw): their kernels advance with every run, so the check feeds them
    stand-ins instead (the replicas' kernels must stay in step with one device's)."""
    if graph is None:
        return []
    exact = {getattr(op, "name", op) for op in graph.get_collection(EXACT_DRAWS)}
    return [op for op in graph.get_operations() if op.name in exact and op.type in STATEFUL_DRAWS]  # in order


def _reads_after_writes(graph: Any, fetches: list[str]) -> tuple[dict[str, str], list[str]]:
    """What ``fetches`` reach that waits for a write of a variable (a ``SeedGenerator`` drawn from twice in a step
    reads its state after its first draw advanced it): each such read of a variable, with a read of it that waits
    for nothing (its value as the step starts, which the check feeds for it, so that the check writes nothing: the
    replicas' state must stay one device's); and the names of the ops that wait for a write but are no such read."""
    queue = [graph.get_tensor_by_name(name).op for name in fetches]
    seen: set[str] = set()
    reads: dict[str, str] = {}
    other: list[str] = []
    while queue:
        op = queue.pop()
        if op.name in seen:
            continue
        seen.add(op.name)
        if any(is_variable_write(c.type) for c in op.control_inputs):
            plain = next((u for u in op.inputs[0].consumers() if u.type == "ReadVariableOp" and not u.control_inputs),
                         None) if op.type == "ReadVariableOp" else None
            if plain is None:
                other.append(op.name)
            else:
                reads[op.outputs[0].name] = plain.outputs[0].name
            continue
        queue.extend(t.op for t in op.inputs)
        queue.extend(op.control_inputs)
    return reads, other


def _stand_in(op: Any, shape: Any, bounds: tuple = ()) -> np.ndarray:
    """Numbers of a stateful draw ``op``'s kind and ``shape``, from a fixed seed (a larger draw's leading rows are
    a smaller one's, as a counter-based draw's are)."""
    rng = np.random.RandomState(0)
    dtype = op.outputs[0].dtype.as_numpy_dtype
    if op.type == "RandomUniformInt":
        return rng.randint(int(bounds[0]), int(bounds[1]), size=shape).astype(dtype)
    if op.type == "RandomUniform":
        return rng.random_sample(shape).astype(dtype)
    normal = rng.standard_normal(shape)
    return (np.clip(normal, -2.0, 2.0) if op.type == "TruncatedNormal" else normal).astype(dtype)


def check_first_step(session: Any, gradients: list, feeds: dict, num_replicas: int, graph: Any = None,
                     counts: list[tuple[str, str]] = ()) -> None:
    """Compare, on this worker's first replica, the gradient of its part with its halves' (see the module
    docstring); say at WARNING where they differ.

    Args:
        session: the step's :class:`parallax.runtime.session.ParallaxSession`.
        gradients: the single-device graph's gradients (:class:`parallax.analysis.GradientInfo`).
        feeds: the step's feeds (placeholder -> one value per replica), as for the first step.
        num_replicas: the local replicas.
        graph: the single-device graph, whose random draws the WARNING names.
        counts: the counts a masked loss divides by, each the part's own (a tensor of the single-device graph) and
            the job's total the step reads instead (:func:`parallax.tf2.masked_means.own_counts`): the part's are
            read and fed for the total in every pass, so that the halves' losses are weighed as the part's and
            no other worker is waited for.
    """
    first = {p: np.asarray(v[0]) for p, v in feeds.items()}
    batch = [len(v) for p, v in first.items() if np.ndim(v) >= 1]
    if not batch or min(batch) < 2 or len(set(batch)) > 1:
        return
    n = batch[0]
    cut = n // 2

    fetches = [_computed_gradient(g.aggregation_tensors, graph) for g in gradients]

    if graph is not None:
        reads, other = _reads_after_writes(graph, [t for names in fetches for t in names]
                                           + [own for own, _ in counts])
        if other:
            logger.info("Parallax: the first step's check did not run: %s wait for a write of a variable in the "
                        "step, which the check would make", ", ".join(other[:3]))
            return
        kept = dict(zip(reads, session.read(list(reads.values())))) if reads else {}
    else:
        kept = {}
    start = _part_start(graph)  # the part's first row in the union batch: a half's is the part's plus its own
    kernels = kernel_draws(graph)
    plain = {**{p: [v] * num_replicas for p, v in first.items()}, **{t: [v] * num_replicas for t, v in kept.items()}}
    began = int(session.read(start, plain)) if start else 0

    def fed(part: slice) -> dict[Any, Any]:
        feeds = {p: [v[part] if np.ndim(v) >= 1 else v] * num_replicas for p, v in first.items()}
        feeds.update({t: [v] * num_replicas for t, v in kept.items()})
        if start:
            feeds[start] = [np.int32(began + (part.start or 0))] * num_replicas
        for op in kernels:  # each draw's shape (and an int draw's bounds) for this part, the draws before it fed
            shape, *bounds = session.read([t.name for t in op.inputs], feeds)
            feeds[op.outputs[0].name] = [_stand_in(op, tuple(shape), tuple(bounds))] * num_replicas
        return feeds

    totals = dict(zip([total for _, total in counts], session.read([own for own, _ in counts], fed(slice(None)))))

    def grads(part: slice) -> dict[str, Any]:
        fetched = session.read(fetches, {**fed(part), **totals})
        return {g.variable: (tuple(values) if len(values) == 2 else values[0]) for g, values in zip(gradients, fetched)}

    timer = time.monotonic()
    whole, halves = grads(slice(None)), (grads(slice(0, cut)), grads(slice(cut, None)))
    differences = compare(whole, halves, (cut, n - cut))
    logger.info("Parallax: the first step's check took %.3f s", time.monotonic() - timer)
    tolerance = {g.variable: TOLERANCE * (100 if g.dtype in ("float16", "bfloat16") else 1) for g in gradients}
    off = sorted(((d, v) for v, d in differences.items() if d > tolerance[v]), reverse=True)
    draws = random_draws(graph) if graph is not None else []
    if draws and not off:  # small draws (GaussianNoise(1e-4)) move the gradients less than the tolerance
        logger.warning("Parallax: the step draws random numbers in %s: each replica draws its own for its part of "
                       "the batch, where one device draws once for the whole batch, so training differs from one "
                       "device's (by little here: the first step's gradients of a part and of its halves agree "
                       "within %.0e). For the same training, train without the draws (a rate or stddev of 0)",
                       ", ".join(draws[:5]) + (f" and {len(draws) - 5} more" if len(draws) > 5 else ""), TOLERANCE)
    if off:
        named = ", ".join(f"{v} ({d:.1%})" for d, v in off[:5]) + (f" and {len(off) - 5} more" if len(off) > 5 else "")
        as_sum = compare(whole, halves, (cut, n - cut), summed=True)
        if all(as_sum[v] <= tolerance[v] for _, v in off):
            named += (". The part's gradient is the sum of its halves': the loss sums over the batch's examples (a "
                      "sum divided by a fixed batch size, as tf.nn.compute_average_loss(..., global_batch_size=...); "
                      "Keras 3 sums what a layer gives add_loss, so a loss of one value per example, as keras-io's CTC "
                      "layer adds, is a sum), and Parallax averages the replicas' gradients (as Horovod does; "
                      "tf.distribute sums them, which its loops' division by the global batch expects), so each "
                      "update is a fraction of one device's: make it a mean over the part's "
                      "examples (tf.reduce_mean, ops.mean), with a learning rate to match (parallax.fit weighs a "
                      "compiled loss with reduction=\"sum\", and what a Keras 3 layer adds per example, itself)")
        elif draws:
            named += (". The step draws random numbers in " + ", ".join(draws[:5])
                      + (f" and {len(draws) - 5} more" if len(draws) > 5 else "")
                      + ": each replica draws its own, one device draws once for the whole batch")
        logger.warning(
            "Parallax: the first step's check: on worker 0 the gradient of its part (%d examples) is not the mean "
            "of its two halves' for %s: the step's result depends on how its batch is cut, so training on several "
            "replicas differs from one device. Likely causes: batch normalisation (the statistics of each part), "
            "an op that sums or averages over the batch (ops.tensordot(a, b, 2), a loss normalised by the batch's "
            "own statistics), random draws in the step (dropout, noise drawn at a fixed batch size). "
            "Config(check_first_step=False) turns this check off", n, named)
