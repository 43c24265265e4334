"""Random draws of one device in ``parallax.fit``: each replica takes its rows of the union batch's draw.

A Keras 3 layer that draws at random in training (``Dropout``, ``GaussianNoise``, ``RandomFlip``, a VAE's sampling)
draws with a stateless op (``StatelessRandomUniformV2``...) whose seed its ``SeedGenerator`` keeps in a variable,
for a shape whose first axis is the batch's (``tf.shape(x)``). Those draws are counter-based: the value at a
position of a draw depends on the seed and the position alone, so a draw of the union batch's shape holds, in the
rows of a replica's part, what one device draws for those examples. Every replica reads the same seed (the
variable advances alike everywhere), so where each replica draws the union batch's shape and keeps its own rows,
its part gets exactly one device's numbers: dropout trains as on one device, not only alike in distribution.

``parallax.fit``'s step names where its part lies in the global batch (:func:`mark_part`: the batch's examples,
the part's first row, the part's rows); :func:`exact_draws` then rewrites, in the traced step's graph, every
stateless draw of a shape ``[n, ...]``: where ``n`` is the part's rows, the draw is made for
``[max(examples, start + n), ...]`` and its rows ``start .. start + n`` are taken; any other ``n`` (a draw of a
shape that is no batch's, as a per-time-step noise) is drawn as it is, with the seed one device has, so every
replica draws what one device draws once for all its examples. The rewrite of the replicas
(:mod:`parallax.rewrite.replicate`) leaves the seeds of those draws as they are
(:data:`parallax.graph.names.EXACT_DRAWS`), where it gives every other stateless draw a seed of each replica's own.
A step traced without those marks (a custom loop's ``tf.function``, a model's own ``train_step``) is marked by
:func:`mark_replica_parts` where it draws: its parts are taken to be equal, the ``g``-th of the union batch for the
replica of global index ``g`` (``worker_id * num_replicas + k``, as :func:`parallax.shard` deals them), so the
union has ``replicas x rows`` examples and the part starts at ``g x rows``; the replicate rewrite sets ``g`` and the
replicas in each replica's copy (:data:`parallax.graph.names.REPLICA_INDEX`, ``REPLICA_COUNT``), and the step
feeds the part's rows (:attr:`parallax.tf2.trace.TracedStep.part_rows`).

A seeded stateful draw (``tf.random.normal(...)`` after ``tf.random.set_seed``: its kernel keeps a counter that
each draw advances by what it draws) is rewritten alike: every replica draws what one device draws, so its kernel
advances as one device's does, and takes its rows. An unseeded one draws from a seed of its process: nothing to
be equal to, left as it is.
"""

from __future__ import annotations

from typing import Any

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2

from parallax.graph.graph_ops import consumers, format_input, node_map, parse_input
from parallax.graph.names import PART_MARKS

__all__ = ["mark_part", "mark_replica_parts", "exact_draws", "PART_MARKS"]


#: Stateless draws whose first input is the shape drawn (V1 ops take the seed as their second input; V2 ops a key
#: and a counter, made from the seed by ``StatelessRandomGetKeyCounter``).
_SHAPED = frozenset({
    "StatelessRandomUniform", "StatelessRandomNormal", "StatelessTruncatedNormal", "StatelessRandomUniformInt",
    "StatelessRandomUniformFullInt", "StatelessRandomUniformV2", "StatelessRandomNormalV2",
    "StatelessTruncatedNormalV2", "StatelessRandomUniformIntV2", "StatelessRandomUniformFullIntV2"})
_KEY_OPS = ("StatelessRandomGetKeyCounter", "StatelessRandomGetKeyCounterAlg")
#: Stateful draws whose first input is the shape drawn: rewritten where their ``seed`` or ``seed2`` is set.
_STATEFUL_SHAPED = frozenset({"RandomUniform", "RandomStandardNormal", "TruncatedNormal", "RandomUniformInt"})


def mark_part(examples: tf.Tensor, start: tf.Tensor, rows: tf.Tensor) -> None:
    """Name, in the step being traced, the global batch's ``examples``, the first row of this replica's part in it
    (``start``) and the part's ``rows`` (int32 scalars), for :func:`exact_draws`."""
    for name, value in zip(PART_MARKS, (examples, start, rows)):
        tf.identity(tf.cast(value, tf.int32), name=name)


def _draws(graph_def: graph_pb2.GraphDef) -> list[node_def_pb2.NodeDef]:
    """The draws of ``graph_def`` whose rows can be one device's: stateless ones, and stateful ones with a seed."""
    return [n for n in graph_def.node if n.op in _SHAPED or (
        n.op in _STATEFUL_SHAPED and (n.attr["seed"].i or n.attr["seed2"].i))]


def mark_replica_parts(graph_def: graph_pb2.GraphDef, batch: str) -> tuple[str, str, str] | None:
    """Mark, in ``graph_def`` (a custom loop's step, in place), where a replica's part lies in the union batch
    (see the module docstring): its rows are its input ``batch``'s (an op's name), and the part's first row and
    the union's examples are the replica's global index and the job's replicas times the part's rows as the step
    is given them (a scalar placeholder the step feeds: a micro-batch's rows are fewer). The names of the
    constants that hold the index and the replicas (0 and 1 here, one device's) and of that placeholder. ``None``,
    and nothing marked, where the step has marks already or no draw that could take them."""
    nodes = node_map(graph_def)
    if any(mark in nodes for mark in PART_MARKS) or not _draws(graph_def):
        return None
    graph = tf.Graph()
    with graph.as_default():
        rows_of = tf.compat.v1.placeholder(tf.as_dtype(nodes[batch].attr["dtype"].type), None, name="BATCH")
        given = tf.compat.v1.placeholder(tf.int32, [], name="parallax_part/given_rows")
        with tf.name_scope("parallax_part/"):
            index = tf.constant(0, tf.int32, name="replica")
            count = tf.constant(1, tf.int32, name="replicas")
            examples, start, rows = count * given, index * given, tf.shape(rows_of, out_type=tf.int32)[0]
        mark_part(examples, start, rows)
    graph_def.node.extend(_bound(graph, {"BATCH": batch}, nodes[batch].device, keep=given.op.name))
    return index.op.name, count.op.name, given.op.name


def exact_draws(graph_def: graph_pb2.GraphDef) -> list[str]:
    """Rewrite ``graph_def`` in place (see the module docstring) where it holds :data:`PART_MARKS`; the names of
    the draws rewritten and of the ops that make their keys from their seeds (whose seeds every replica keeps)."""
    nodes = node_map(graph_def)
    if not all(mark in nodes for mark in PART_MARKS):
        return []
    users = consumers(graph_def)
    draws = _draws(graph_def)
    added: list[node_def_pb2.NodeDef] = []
    kept: list[str] = []
    for draw in draws:
        scope = f"parallax_exact/{draw.name}"
        made = _sliced(scope, draw, nodes)
        for user in users.get(draw.name, []):  # the draw's value, read by its users as the part's rows
            node = nodes[user]
            for i, name in enumerate(node.input):
                op, index, control = parse_input(name)
                if op == draw.name and not control:
                    node.input[i] = format_input(f"{scope}/part", index, False)
        draw.input[0] = f"{scope}/shape"
        added.extend(made)
        kept.append(draw.name)
        if draw.op.endswith("V2"):  # its key and counter: made from the seed by an op of its own
            key, _, _ = parse_input(draw.input[1])
            if nodes.get(key) is not None and nodes[key].op in _KEY_OPS and \
                    all(nodes[u].op in _SHAPED for u in users.get(key, [])):
                kept.append(key)
    graph_def.node.extend(added)
    return kept


def _sliced(scope: str, draw: node_def_pb2.NodeDef, nodes: dict[str, Any]) -> list[node_def_pb2.NodeDef]:
    """The ops that give ``draw`` the union batch's shape and take the part's rows of it, under ``scope``: made in
    a graph of their own from stand-ins for the draw's shape and value and the part's marks, then bound to them."""
    shape_type = tf.as_dtype(draw.attr["Tshape" if "Tshape" in draw.attr else "T"].type)  # V2's name; V1's
    value_type = tf.as_dtype(draw.attr["Tout" if "Tout" in draw.attr else "dtype"].type)  # RandomUniformInt's
    graph = tf.Graph()
    with graph.as_default():
        shape = tf.compat.v1.placeholder(shape_type, [None], name="SHAPE")
        drawn = tf.compat.v1.placeholder(value_type, None, name="DRAWN")
        examples, start, rows = (tf.compat.v1.placeholder(tf.int32, [], name=f"MARK{i}") for i in range(3))
        with tf.name_scope(scope):
            n = shape[0]
            examples, start, rows = (tf.cast(t, shape_type) for t in (examples, start, rows))
            batch = tf.equal(n, rows)  # a draw of the part's rows: drawn for the whole batch
            first = tf.where(batch, start, tf.zeros_like(start))
            whole = tf.where(batch, tf.maximum(examples, start + n), n)
            tf.concat([tf.reshape(whole, [1]), shape[1:]], 0, name="shape")
            tf.identity(drawn[first:first + n], name="part")
    return _bound(graph, {"SHAPE": draw.input[0], "DRAWN": draw.name,
                          **{f"MARK{i}": mark for i, mark in enumerate(PART_MARKS)}}, draw.device)


def _bound(graph: tf.Graph, bound: dict[str, str], device: str, keep: str = "") -> list[node_def_pb2.NodeDef]:
    """The ops of ``graph`` but its placeholders (other than ``keep``), each placeholder's uses bound to the tensor
    ``bound`` names for it (a placeholder ``DRAWN`` keeps the output index its users read), on ``device``."""
    made = []
    for node in graph.as_graph_def().node:
        if node.op == "Placeholder" and node.name != keep:
            continue
        for i, name in enumerate(node.input):
            op, index, control = parse_input(name)
            if op in bound:
                real, real_index, _ = parse_input(bound[op])
                node.input[i] = format_input(real, real_index if op != "DRAWN" else index, control)
        node.device = device
        made.append(node)
    return made
