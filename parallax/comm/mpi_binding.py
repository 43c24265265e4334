"""A rewritten graph's ``mpi`` ops bound to this process's communicators, and released again.

The graph names the Python function of each ``PyFunc`` by a fixed token; :func:`bind_py_functions`
registers, per communicator (a duplicate of it), the functions of :mod:`parallax.comm.mpi_calls` in
TensorFlow's ``numpy_function`` registry, points the graph's tokens at them (the dense all-reduces
at the compiled op instead, where it is available: :mod:`parallax.comm.mpi_lowering`), and returns
what removes them when the session closes.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable

import tensorflow as tf
from tensorflow.core.framework import graph_pb2

from parallax.comm.arrival import FIRST_NAP_SECONDS, LONGEST_NAP_SECONDS
from parallax.comm.mpi_calls import _ALLREDUCE, TOKEN_PREFIX, _functions, _group_suffix
from parallax.comm.mpi_lowering import _lower, _native_for, _skip_owned

__all__ = ["bind_py_functions"]

_BINDINGS = itertools.count()


def _py_func_registry():
    """TensorFlow's registry of ``numpy_function`` bodies (private API: checked, not assumed)."""
    from tensorflow.python.ops import script_ops

    registry = getattr(script_ops, "_py_funcs", None)
    if registry is None or not hasattr(registry, "insert") or not hasattr(registry, "remove"):
        raise RuntimeError(
            f"Parallax's mpi backend needs TensorFlow's numpy_function registry (script_ops._py_funcs with "
            f"insert/remove), which TensorFlow {tf.__version__} does not have; use MPIConfig(backend='collective') "
            "or a TensorFlow version Parallax supports (see setup.py)")
    return registry


def bind_py_functions(graph_def: graph_pb2.GraphDef, comm=None, groups: dict | None = None,
                      native_ops: bool = True, spin: float | None = None, huge_pages: bool = True,
                      cache_root: str | None = None) -> tuple[graph_pb2.GraphDef, Callable[[], None]]:
    """Point the graph's Parallax MPI ops at this process's functions.

    Registers one set of functions per communicator in TensorFlow's
    ``numpy_function`` registry and returns a copy of ``graph_def`` whose
    ``PyFunc`` nodes use the registry's tokens, with a function that removes
    them again (the registry holds functions weakly: the returned function
    keeps them alive until it is called). The dense all-reduces become the
    compiled op of :mod:`parallax.comm.native` where it is available.

    Args:
        graph_def: a rewritten graph.
        comm: the mpi4py communicator of the default group (``COMM_WORLD``
            when ``None``); the functions use a duplicate of each communicator.
        groups: communicators of named groups (``{"host": ...}``).
        native_ops: ``False`` keeps the all-reduces in Python (benchmarks compare the two).
        spin: ``None``: the calls are the collectives alone; seconds: each call first waits for
            every member asleep, after this long awake (:mod:`parallax.comm.arrival`). The members
            of each communicator agree here on the longest spin any of them asked for (an
            ``Allreduce``; so all make the same calls even when their hosts decide differently).
        huge_pages: the compiled op's large buffers ask for huge pages (``PARALLAX_HUGE_PAGES``).
        cache_root: where the compiled op is kept (``PARALLAX_CACHE_DIR``; ``None``: the default cache).

    Returns:
        ``(bound graph_def, release)``.
    """
    registry = _py_func_registry()
    native = _native_for(graph_def, cache_root) if native_ops else None
    bound: dict[str, tuple[str, Callable]] = {}
    lowered: dict[str, str] = {}  # all-reduce token -> the compiled op's communicator key
    kept = []
    for group, group_comm in {"": comm, **(groups or {})}.items():
        if group_comm is None:
            from mpi4py import MPI

            group_comm = MPI.COMM_WORLD
        own = group_comm.Dup()
        kept.append(own)
        agreed = _agreed_spin(own, spin)
        for key, fn in _functions(own, agreed).items():
            bound[key + _group_suffix(group)] = (registry.insert(fn), fn)
        if native is not None:
            lowered[_ALLREDUCE + _group_suffix(group)] = key = f"{os.getpid()}.{next(_BINDINGS)}{_group_suffix(group)}"
            native.register(key, own, agreed, FIRST_NAP_SECONDS, LONGEST_NAP_SECONDS)
    out = graph_pb2.GraphDef()
    out.CopyFrom(graph_def)
    for node in out.node:
        if node.op in ("PyFunc", "PyFuncStateless"):
            token = node.attr["token"].s.decode()
            if token in lowered:
                _lower(node, lowered[token], huge_pages)
            elif token.startswith(TOKEN_PREFIX):
                if token not in bound:
                    raise RuntimeError(f"no Parallax MPI function for token {token!r} (groups bound: "
                                       f"{sorted(groups or {})})")
                node.attr["token"].s = bound[token][0].encode()
    if lowered:
        _skip_owned(out)

    def release() -> None:
        for token, _ in bound.values():
            registry.remove(token)
        bound.clear()
        for key in lowered.values():
            native.unregister(key)
        lowered.clear()
        kept.clear()

    return out, release


def _agreed_spin(comm, spin: float | None) -> float | None:
    """The longest ``spin`` any member of ``comm`` asked for (``None``: none asked for one)."""
    from mpi4py import MPI

    longest = comm.allreduce(-1.0 if spin is None else float(spin), op=MPI.MAX)
    return None if longest < 0 else longest

