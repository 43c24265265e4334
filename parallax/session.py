"""The session ``parallel_run`` returns.

It holds a TensorFlow session over the rewritten graph and translates the
single-device graph's names, per the seed API: a fetch of an op or tensor of
the single-device graph (or its name, also inside lists, tuples and dicts)
comes back as a list with one value per local replica (``None`` for an op);
a feed takes a list with one value per local replica (or, as in the original
Parallax, an ndarray whose first axis is the replicas; a placeholder shared by
all replicas, such as a learning rate, also takes a single value). Nothing of
TensorFlow's session classes is patched.
"""

from __future__ import annotations

import collections
import contextlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from parallax.rewrite.graph_ops import ancestors, node_map, parse_input
from parallax.rewrite.names import replica_op_name, replica_tensor_name

__all__ = ["ParallaxSession"]


class ParallaxSession:
    """Runs the distributed graph with the single-device graph's names.

    Args:
        session: the TensorFlow session (usually a ``MonitoredSession``) over
            the rewritten graph.
        graph: the rewritten graph.
        single_graph: the user's single-device graph (objects from it are
            accepted as fetches and feeds).
        replicated: names of the ops copied per replica; other ops are shared
            and fetched once.
        num_replicas: number of local replicas.
        profiler: a :class:`parallax.profiling.Profiler` for ``ProfileConfig``.
        heartbeat: a :class:`parallax.launch.monitor.Heartbeat` told of every
            ``run`` (the stall check), or ``None``.
        waits: where a step waits for other processes, for the stall check.
        on_close: what to undo when the session closes (bindings of the
            communication backends, a tee of the output), in order.
        after_steps: training op -> op to run, past the hooks, after every
            ``run`` that ran it (the PS chief's release of the other workers,
            :func:`parallax.rewrite.names.release_op`).
        hooks: whether ``session`` runs hooks, which may build ops: each ``run``
            then makes the rewritten graph the default one (5 us a run, skipped
            without hooks; the session's creator enters the graph itself when a
            ``MonitoredSession`` creates its session again).
    """

    def __init__(self, session: Any, graph: tf.Graph, single_graph: tf.Graph | None,
                 replicated: frozenset[str], num_replicas: int, profiler: Any = None, heartbeat: Any = None,
                 waits: str = "", on_close: tuple[Callable[[], None], ...] = (),
                 after_steps: Mapping[str, str] | None = None, hooks: bool = True,
                 held_in_parts: Mapping[str, str] | None = None) -> None:
        self._session = session
        self._held_in_parts = dict(held_in_parts or {})
        self._graph = graph
        self._single_graph = single_graph
        self._replicated = replicated
        self._num_replicas = num_replicas
        self._profiler = profiler
        self._heartbeat = heartbeat
        self._step_tensor: Any = False  # the global step tensor once looked up (None: there is none)
        self._waits = waits
        self._elements: dict[str, Any] = {}  # name -> op or tensor of the (finalized) rewritten graph
        self._on_close = list(on_close)
        self._after_steps = dict(after_steps or {})
        self._afters: dict[tuple[str, ...], list[Any]] = {}  # targets -> what runs after them
        self._node_map: dict[str, Any] | None = None
        self._hooks = hooks
        self._fetch_plans: dict[Any, tuple] = {}  # fetches' shape -> their mapping (see _fetch_plan)
        self._feed_keys: dict[Any, tuple] = {}  # feed key -> (name, replica names, elements)

    # ------------------------------------------------------------------ #
    @property
    def graph(self) -> tf.Graph:
        """The rewritten (distributed) graph this session runs."""
        return self._graph

    @property
    def num_replicas(self) -> int:
        return self._num_replicas

    @property
    def raw_session(self) -> Any:
        """The underlying TensorFlow session, for what the wrapper does not cover."""
        return self._session

    def run(self, fetches: Any, feed_dict: Mapping[Any, Any] | None = None,
            options: Any = None, run_metadata: Any = None) -> Any:
        """Run one step, like ``tf.compat.v1.Session.run``.

        Args:
            fetches: ops, tensors or names of the single-device graph, alone or
                nested in lists, tuples and dicts.
            feed_dict: maps a placeholder (or its name) to a list with one value
                per local replica, or an ndarray whose first axis is the replicas; a
                placeholder shared by the replicas also takes a single value.
            options: a ``RunOptions`` proto, passed through.
            run_metadata: a ``RunMetadata`` proto, passed through.

        Returns:
            ``fetches`` with each leaf replaced by a list of one value per replica.

        Raises:
            ValueError: a name is not in the graph, or a feed value is not a list
                of one value per replica.
            TypeError: a fetch or feed key is of an unsupported type.
        """
        structure, targets, names, elements = self._fetch_plan(fetches)
        feeds = self._map_feeds(feed_dict) if feed_dict else None

        if self._heartbeat is not None:
            self._heartbeat.set("run", self._waits)
        try:
            # hooks (checkpoint saving) build and run ops in graph mode
            with self._graph.as_default() if self._hooks else _NO_CONTEXT:
                if self._profiler is None:
                    values = self._session.run(elements, feed_dict=feeds, options=options, run_metadata=run_metadata)
                else:
                    values = self._profiler.run(
                        lambda opts, metadata: self._session.run(elements, feed_dict=feeds, options=opts,
                                                                 run_metadata=metadata),
                        options, run_metadata, self._global_step())
                after = self._after(names)
                if after:
                    self._run_past_hooks(after)
        finally:
            if self._heartbeat is not None:
                self._heartbeat.step_done()
        return self._rebuild(structure, values, targets)

    def make_callable(self, fetches: Any, feed_list: list | tuple | None = None, accept_options: bool = False):
        """A function that runs ``fetches``, like ``tf.compat.v1.Session.make_callable``.

        It takes one argument per entry of ``feed_list`` (each, as in :meth:`run`,
        a list with one value per replica), plus ``options`` and ``run_metadata``
        keywords when ``accept_options``, and returns what :meth:`run` returns.
        Names are checked now, not at the first call.
        """
        feed_list = list(feed_list or ())
        self._map_fetches(fetches, {})  # bad fetch names fail here
        for key in feed_list:
            name = self._name_of(key, "feed key")
            self._check_exists(name if ":" in name else name + ":0", "feed key")

        def call(*values: Any, options: Any = None, run_metadata: Any = None) -> Any:
            if len(values) != len(feed_list):
                raise TypeError(f"this callable takes {len(feed_list)} feed values (one per feed_list entry), "
                                f"got {len(values)}")
            if not accept_options and (options is not None or run_metadata is not None):
                raise TypeError("options and run_metadata need make_callable(..., accept_options=True)")
            return self.run(fetches, dict(zip(feed_list, values)), options, run_metadata)

        return call

    def partial_run_setup(self, *args: Any, **kwargs: Any) -> Any:
        """Not supported: see :meth:`partial_run`."""
        self.partial_run()

    def partial_run(self, *args: Any, **kwargs: Any) -> Any:
        """Not supported: a partial run would leave the other workers waiting inside a
        synchronised step. Raises ``NotImplementedError``."""
        raise NotImplementedError(
            "ParallaxSession does not support partial_run: every worker must run whole steps together (a "
            "partial step would leave the others waiting in the gradient exchange). Fetch everything in one "
            "sess.run, or use raw_session for work that involves no other worker")

    def _global_step(self) -> int | None:
        """The global step's value now, read past the hooks (for profiling), or ``None``."""
        if self._step_tensor is False:
            with self._graph.as_default():
                self._step_tensor = tf.compat.v1.train.get_global_step(self._graph)
        if self._step_tensor is None:
            return None
        return int(self._run_past_hooks(self._step_tensor))

    def _run_past_hooks(self, fetches: Any) -> Any:
        """Run ``fetches`` on the TensorFlow session without the hooks (it is no step of the program's)."""
        step_fn = getattr(self._session, "run_step_fn", None)  # a MonitoredSession's hook-free door
        if step_fn is None:
            return self._session.run(fetches)
        return step_fn(lambda step_context: step_context.session.run(fetches))  # TF checks the name

    def _after(self, targets: list[str]) -> list[Any]:
        """The ``after_steps`` ops of the training ops that a run of ``targets`` runs."""
        if not self._after_steps:
            return []
        key = tuple(targets)
        found = self._afters.get(key)
        if found is None:
            ran = ancestors(self._nodes(), {parse_input(t)[0] for t in targets})
            found = self._afters[key] = [self._element(op) for t, op in self._after_steps.items() if t in ran]
        return found

    def _nodes(self) -> dict[str, Any]:
        if self._node_map is None:
            self._node_map = node_map(self._graph.as_graph_def())
        return self._node_map

    def should_stop(self) -> bool:
        """Whether the underlying monitored session asks to stop."""
        stop = getattr(self._session, "should_stop", None)
        return bool(stop()) if stop else False

    def close(self) -> None:
        """Close the TensorFlow session, then undo what was set up for it."""
        try:
            with self._graph.as_default():
                self._session.close()
        finally:
            while self._on_close:
                self._on_close.pop(0)()

    def __enter__(self) -> ParallaxSession:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        self.close()
        return exc_type is tf.errors.OutOfRangeError  # the end of an input pipeline ends quietly

    # ------------------------------------------------------------------ #
    def _name_of(self, item: Any, what: str) -> str:
        if isinstance(item, str):
            return item
        if hasattr(item, "_as_graph_element") and not isinstance(item, (tf.Tensor, tf.Operation)):
            item = item._as_graph_element()
        if isinstance(item, (tf.Tensor, tf.Operation)):
            if item.graph is not self._single_graph and item.graph is not self._graph:
                raise ValueError(f"{what} {item.name!r} belongs to another graph than the one given "
                                 "to parallel_run()")
            return item.name
        raise TypeError(f"{what} must be an op, a tensor or a name of the single-device graph, "
                        f"got {type(item).__name__}: {item!r}")

    def _element(self, name: str) -> Any:
        element = self._elements.get(name)
        if element is None:
            element = self._elements[name] = self._graph.as_graph_element(name)
        return element

    def _check_exists(self, name: str, what: str) -> None:
        op = name.split(":")[0]
        for slot, why in self._held_in_parts.items():
            if op == slot or op.startswith(slot + "/"):
                raise ValueError(f"{what} {name!r}: {why}")
        try:
            self._element(name)
        except (KeyError, ValueError) as e:
            raise ValueError(f"{what} {name!r} is not in the single-device graph") from e

    def _replica_names(self, name: str) -> list[str]:
        op = name.split(":")[0]
        if op not in self._replicated:
            return [name] * self._num_replicas
        if ":" in name:
            return [replica_tensor_name(name, r) for r in range(self._num_replicas)]
        return [replica_op_name(name, r) for r in range(self._num_replicas)]

    def _fetch_plan(self, fetches: Any) -> tuple[Any, dict[str, int], list[str], list[Any]]:
        """``fetches`` mapped to the rewritten graph: result structure, target positions, names and
        elements; remembered for fetches of the same shape and the same ops, tensors and names (a
        training loop fetches the same ones every step)."""
        key = _fetch_key(fetches)
        plan = self._fetch_plans.get(key) if key is not None else None
        if plan is None:
            targets: dict[str, int] = {}
            structure = self._map_fetches(fetches, targets)
            names = list(targets)
            plan = (structure, targets, names, [self._element(n) for n in names], fetches)
            if key is not None:
                if len(self._fetch_plans) >= _PLANS_KEPT:
                    self._fetch_plans.clear()
                self._fetch_plans[key] = plan  # holds ``fetches``: the ids in ``key`` stay theirs
        return plan[:4]

    def _map_fetches(self, fetches: Any, targets: dict[str, int]) -> Any:
        if isinstance(fetches, dict):
            return _same_kind(fetches, ((k, self._map_fetches(v, targets)) for k, v in fetches.items()))
        if isinstance(fetches, tuple) and hasattr(fetches, "_fields"):
            return type(fetches)(*(self._map_fetches(v, targets) for v in fetches))
        if isinstance(fetches, (list, tuple)):
            return type(fetches)(self._map_fetches(v, targets) for v in fetches)
        name = self._name_of(fetches, "fetch")
        self._check_exists(name, "fetch")
        names = self._replica_names(name)
        for n in names:
            targets.setdefault(n, len(targets))
        return _Leaf(names)

    def _map_feeds(self, feed_dict: Mapping[Any, Any]) -> dict[Any, Any]:
        feeds: dict[Any, Any] = {}
        for key, value in feed_dict.items():
            name, names, elements, rank = self._feed_key(key)
            shared = names[0] == names[-1]
            per_replica = self._per_replica(value, rank)
            if shared and not per_replica:
                feeds[elements[0]] = value  # one value for the shared placeholder, as the original took
                continue
            if not per_replica:
                got = f"a list of {len(value)}" if isinstance(value, (list, tuple)) else \
                    f"an ndarray of shape {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
                raise ValueError(
                    f"feed for {name!r} must be a list (or an ndarray whose first axis is the replicas) with one "
                    f"value per replica ({self._num_replicas} replicas on this worker), got {got}")
            if shared and self._num_replicas > 1:
                first = np.asarray(value[0])
                if any(not np.array_equal(first, np.asarray(v)) for v in value[1:]):
                    raise ValueError(
                        f"{name!r} is shared by all replicas (it feeds the update, not one replica's "
                        "computation), so its per-replica values must be equal")
            if shared:
                feeds[elements[0]] = value[0]
                continue
            for element, v in zip(elements, value):
                feeds[element] = v
        return feeds

    def _feed_key(self, key: Any) -> tuple[str, list[str], list[Any], int | None]:
        """A feed key's tensor name, its replicas' names, their tensors and its rank (remembered
        per key)."""
        ref = key if isinstance(key, str) else id(key)
        found = self._feed_keys.get(ref)
        if found is None:
            name = self._name_of(key, "feed key")
            if ":" not in name:
                name += ":0"
            self._check_exists(name, "feed key")
            names = self._replica_names(name)
            elements = [self._element(n) for n in names]
            found = (name, names, elements, elements[0].shape.rank, key)  # holds ``key``: its id stays its own
            if len(self._feed_keys) >= _PLANS_KEPT:
                self._feed_keys.clear()
            self._feed_keys[ref] = found
        return found[:4]

    def _per_replica(self, value: Any, rank: int | None) -> bool:
        """Whether ``value`` holds one value per replica: a list or tuple of that length, or an
        ndarray whose first axis is the replicas (replica ``r`` gets ``value[r]``, as in the
        original Parallax). Where the placeholder's rank is known, a value of that rank is a
        whole value, not one per replica (a shared placeholder of shape ``[n]`` fed a vector)."""
        if not isinstance(value, (list, tuple, np.ndarray)) or (isinstance(value, np.ndarray) and value.ndim == 0) \
                or len(value) != self._num_replicas:  # replicas' batches may differ in length: no np.ndim(value)
            return False
        return rank is None or np.ndim(value[0]) == rank

    def _rebuild(self, structure: Any, values: list[Any], targets: dict[str, int]) -> Any:
        if isinstance(structure, _Leaf):
            return [values[targets[n]] for n in structure.names]
        if isinstance(structure, dict):
            return _same_kind(structure, ((k, self._rebuild(v, values, targets)) for k, v in structure.items()))
        if isinstance(structure, tuple) and hasattr(structure, "_fields"):
            return type(structure)(*(self._rebuild(v, values, targets) for v in structure))
        return type(structure)(self._rebuild(v, values, targets) for v in structure)


_NO_CONTEXT = contextlib.nullcontext()

#: How many fetch mappings and feed keys a session remembers (then it starts over).
_PLANS_KEPT = 256


def _fetch_key(fetches: Any) -> Any:
    """A hashable key for the shape and leaves of ``fetches`` (leaves by identity or name), or
    ``None`` for what :meth:`ParallaxSession._map_fetches` should see afresh (it explains errors)."""
    if isinstance(fetches, str):
        return fetches
    if isinstance(fetches, (tf.Tensor, tf.Operation)):
        return id(fetches)
    if isinstance(fetches, (list, tuple)):
        keys = tuple(_fetch_key(f) for f in fetches)
        return None if None in keys else (type(fetches), keys)
    if isinstance(fetches, dict) and not isinstance(fetches, collections.defaultdict):
        try:
            keys = tuple((k, _fetch_key(v)) for k, v in fetches.items())
            hash(keys)
        except TypeError:
            return None
        return None if any(v is None for _, v in keys) else (type(fetches), keys)
    return None


class _Leaf:
    __slots__ = ("names",)

    def __init__(self, names: list[str]) -> None:
        self.names = names


def _same_kind(mapping: Mapping, items) -> Mapping:
    """A mapping of ``mapping``'s type holding ``items`` (a ``defaultdict`` keeps its factory)."""
    if isinstance(mapping, collections.defaultdict):
        return type(mapping)(mapping.default_factory, items)
    return type(mapping)(items)
