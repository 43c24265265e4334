"""Each optimizer update made of element-wise ops (Keras 3's optimizers) run as one op: one pass over the variable,
its slots and its gradient instead of a dozen (``Config(fuse_updates=True)``, the default).

Keras 3's Adam updates a 20,000 x 64 embedding table with ten element-wise ops over its whole shape each step,
a pass over 5 MB each (it must update every row's moments, as one device does); on one core that is about half
of a step of a small model. Here each such update (:func:`~parallax.rewrite.zero_regions.find_region`: the ops of
its ``update_<variable>/`` scope that read or write the variable and its slots) becomes one
``ParallaxFusedUpdate`` op (``parallax/rewrite/fused_update.cc``) that runs a loop compiled for the chain
(:mod:`parallax.rewrite.fused_programs`) and writes the variables in place. The loop makes each of TensorFlow's
operations the same IEEE operation on the same numbers, so training is the same to the bit; the region's ops
become ``NoOp`` ops that wait for the new op, so whatever waited for the update still does, and the new op waits
for whatever the region's ops waited for (the forward pass's reads of the variable).

TensorFlow's graph optimizer (grappler) rewrites some such chains before they run, not always exactly (Adagrad's
``x / sqrt(y)`` becomes ``x * rsqrt(y)``, an approximation), in ``model.fit``'s function as in Parallax's
session. So the graph is first optimized as the session would (:func:`optimized_nodes`), and a region whose
state ops the optimizer changes (another op, other inputs) keeps its ops: what runs is then what would have run.

Updates that run in this process are fused, and a parameter server's on this process's host (the server loads the
op when it starts, :func:`parallax.member.roles.role_setup`, and opens the loop's library from this host's cache;
a server on another host may not see that file, so its updates keep their ops); not a pipeline stage server's,
nor a ZeRO part's. Only on CPUs, of ``float32``/``float64`` variables. An update the loop cannot say
exactly (another kind of op: ``Rsqrt``, ``Pow``, ``Sign``, a ``Select``; an update inside a loss scale's
conditional) keeps its ops, which is logged at DEBUG. Where the op cannot be built (no compiler), nothing is
fused (logged at INFO).
"""

from __future__ import annotations

import time
from collections.abc import Callable

import tensorflow as tf
from tensorflow.core.framework import graph_pb2, node_def_pb2
from tensorflow.core.protobuf import meta_graph_pb2

from parallax.errors import RewriteError
from parallax.graph.graph_ops import add_nodes, consumers, descendants, is_variable_write, node_map, parse_input
from parallax.graph.names import FUSED_PREFIX
from parallax.logs import log
from parallax.plan.model import Plan
from parallax.rewrite.fused_programs import SYMBOL, Program, Unfused, compile_region, data_inputs, same_inputs
from parallax.rewrite.zero_regions import RegionUpdate, find_region, retire_region, static_shapes

__all__ = ["fuse_updates", "fused_graph", "OP_NAME"]

OP_NAME = "ParallaxFusedUpdate"


def fused_graph(meta_graph: meta_graph_pb2.MetaGraphDef, plan: Plan, cache_root: str | None, host: str | None = None
                ) -> meta_graph_pb2.MetaGraphDef:
    """``meta_graph`` with its updates fused (:func:`fuse_updates`), the op and each loop built under
    ``cache_root`` (:mod:`parallax.comm.native`); ``meta_graph`` itself where the op cannot be had. ``host``: this
    process's host (the servers on it have their updates fused too)."""
    from parallax.comm.native import build_loop, update_ops

    if update_ops(cache_root) is None:
        return meta_graph
    started = time.monotonic()
    try:
        optimized = optimized_nodes(meta_graph)
    except Exception as e:  # noqa: BLE001 - TensorFlow's own optimizer, whatever it raises: nothing is fused
        log.info("Parallax: no update is fused: TensorFlow's graph optimizer failed on the graph (%s)", e)
        return meta_graph
    graph_def, fused = fuse_updates(meta_graph.graph_def, plan, lambda source: build_loop(source, cache_root),
                                    optimized, host)
    log.debug("Parallax: fused the updates of %d variables in %.2f s: %s", len(fused), time.monotonic() - started,
              ", ".join(fused))
    if not fused:
        return meta_graph
    out = meta_graph_pb2.MetaGraphDef()
    out.CopyFrom(meta_graph)
    out.graph_def.CopyFrom(graph_def)
    return out


def optimized_nodes(meta_graph: meta_graph_pb2.MetaGraphDef) -> dict[str, node_def_pb2.NodeDef]:
    """The ops of ``meta_graph`` as TensorFlow's graph optimizer leaves them (its default settings, as a session
    has them), by name, with every variable write kept."""
    from tensorflow.core.protobuf import config_pb2
    from tensorflow.python.grappler import tf_optimizer

    copy = meta_graph_pb2.MetaGraphDef()
    copy.CopyFrom(meta_graph)
    fetches = copy.collection_def["train_op"].node_list
    del fetches.value[:]
    fetches.value.extend(n.name for n in copy.graph_def.node if is_variable_write(n.op))
    optimized = tf_optimizer.OptimizeGraph(config_pb2.ConfigProto(), copy)
    return {n.name: n for n in optimized.node}


def fuse_updates(graph_def: graph_pb2.GraphDef, plan: Plan, build: Callable[[str], str],
                 optimized: dict[str, node_def_pb2.NodeDef] | None, host: str | None = None
                 ) -> tuple[graph_pb2.GraphDef, list[str]]:
    """A copy of ``graph_def`` in which the update of each variable of ``plan`` that can be fused is one op, and
    those variables' names.

    Args:
        build: compiles a loop's C++ source into a shared library and returns its path (a ``RuntimeError``
            leaves that update as it is).
        optimized: :func:`optimized_nodes` of the graph: a region the optimizer rewrites is not fused (``None``:
            no check, for graphs that run without the optimizer).
        host: this process's host: the updates of the parameter servers on it are fused too (``None``: none).
    """
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    nodes = node_map(out)
    users = consumers(out)
    shapes = None
    fused: list[str] = []
    made: list[node_def_pb2.NodeDef] = []
    for v in plan.variables:
        if v.gradient is None or v.sharded or v.slot_of is not None or not _fused_here(v.server, plan, host):
            continue
        if shapes is None:
            shapes = static_shapes(out)  # before the first op of ours is in the graph: it imports it
        try:
            region = find_region(out, nodes, v, [s.name for s in plan.variables if s.slot_of == v.name], shapes,
                                 users)
            if region is None:
                continue
            program = compile_region(region, nodes, shapes,
                                     lambda op: optimized is None or _unchanged(op, nodes, optimized))
            if optimized is not None:
                _check_optimized(program, nodes, optimized)
            device = nodes[region.writes[0]].device
            if "GPU" in device.upper():
                raise Unfused("it runs on a GPU")
            if "/job:stage" in device:  # a pipeline stage's server, which has not loaded the op
                raise Unfused("it runs in a pipeline stage's process")
            carried = _carried(region, nodes, users)
            library = build(program.source())
        except (RewriteError, Unfused, RuntimeError) as e:
            log.debug('Parallax: the update of "%s" keeps its ops: %s', v.name, e)
            continue
        node = _fused_op(f"{FUSED_PREFIX}/{v.name}/update", program, region, carried, library, device)
        retire_region(region, nodes, node.name)
        made.append(node)
        nodes[node.name] = node
        for text in node.input:
            users.setdefault(parse_input(text)[0], []).append(node.name)
        users[node.name] = list(region.state)
        fused.append(v.name)
    add_nodes(out, made)
    return out, fused


def _fused_here(server: int | None, plan: Plan, host: str | None) -> bool:
    """Whether an update that runs in this process (``server`` ``None``) or on parameter server ``server`` is
    fused by this process: a server's where it runs on ``host``."""
    if server is None:
        return True
    return host is not None and server < len(plan.server_hosts) and plan.server_hosts[server] == host


def _carried(u: RegionUpdate, nodes: dict[str, node_def_pb2.NodeDef], users: dict[str, list[str]]) -> list[str]:
    """What the region's state ops wait for from outside them (the forward pass's reads of the variable), which
    the fused op waits for.

    Raises:
        Unfused: one of them waits for the update itself (one op in its place would wait for itself).
    """
    state = set(u.state)
    carried = sorted({parse_input(t)[0] for name in u.state for t in nodes[name].input
                      if t.startswith("^") and parse_input(t)[0] not in state})
    later = descendants(users, [c for s in u.state for c in users.get(s, ()) if c not in state])
    if later & set(carried):
        raise Unfused(f'"{sorted(later & set(carried))[0]}" waits for part of the update and another part for it')
    return carried


def _check_optimized(program: Program, nodes: dict[str, node_def_pb2.NodeDef],
                     optimized: dict[str, node_def_pb2.NodeDef]) -> None:
    """Each op the loop computes (but those that pass a value on) is, after the graph optimizer, the same op on the
    same values (:func:`~parallax.rewrite.fused_programs.same_inputs`).

    Raises:
        Unfused: the op the optimizer rewrote.
    """
    for name in program.ops:
        if not _unchanged(name, nodes, optimized):
            node, other = nodes[name], optimized.get(name)
            now = f"{other.op} of {data_inputs(other, optimized)}" if other is not None else "removed"
            raise Unfused(f'TensorFlow\'s graph optimizer rewrites "{name}" ({node.op} of '
                          f"{data_inputs(node, nodes)}: {now}), as it does on one device")


def _unchanged(name: str, nodes: dict[str, node_def_pb2.NodeDef], optimized: dict[str, node_def_pb2.NodeDef]) -> bool:
    node, other = nodes[name], optimized.get(name)
    return node.op in ("Identity", "Snapshot") or other is not None and other.op == node.op \
        and same_inputs(node, other, nodes, optimized)


def _fused_op(name: str, program: Program, u: RegionUpdate, carried: list[str], library: str, device: str
              ) -> node_def_pb2.NodeDef:
    node = node_def_pb2.NodeDef(name=name, op=OP_NAME, device=device)
    node.input.extend([*program.handles, *program.inputs, *program.ids, *("^" + c for c in carried)])
    node.attr["T"].type = u.dtype.as_datatype_enum
    node.attr["Tindices"].type = tf.as_dtype(program.index_type).as_datatype_enum
    node.attr["K"].i = len(program.handles)
    node.attr["N"].i = len(program.inputs)
    node.attr["M"].i = len(program.ids)
    node.attr["kinds"].list.i.extend({"c": 0, "x": 1, "s": 2}[k] for k in program.kinds)
    node.attr["sparse"].list.i.extend(program.sparse)
    node.attr["writes"].list.i.extend(k for k, _ in program.writes)
    node.attr["library"].s = library.encode()
    node.attr["symbol"].s = SYMBOL.encode()
    return node
