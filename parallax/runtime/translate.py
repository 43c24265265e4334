"""The single-device graph's fetches and feeds, in the rewritten graph, and the results back.

A program speaks of the graph it built: ops, tensors and their names. The
rewritten graph has one copy of each per-replica op for every local replica
(replica 0 keeps the original name, :func:`parallax.graph.names.replica_op_name`)
and one of each shared op. :class:`Translator` maps both ways:

* a fetch (an op, a tensor, a name, or anything with ``_as_graph_element``, nested
  in lists, tuples, namedtuples and dicts) becomes the copies of every replica, and
  the result comes back with each leaf a :class:`ReplicaValues` list, one value per
  replica (``None`` for an op), as the seed API says; or, for the program's hooks
  (:mod:`parallax.runtime.hooks`), one value per leaf, replica 0's, as on one device;
* a feed takes one value per replica (a list, or an ndarray whose first axis is
  the replicas) or, for a placeholder the replicas share, a single value.

The :class:`parallax.runtime.session.ParallaxSession` and the hooks' adapters share one
translator, so both accept exactly the same things.
"""

from __future__ import annotations

import collections
from collections.abc import Mapping
from typing import Any

import numpy as np
import tensorflow as tf

from parallax.graph.names import replica_op_name, replica_tensor_name

__all__ = ["Translator", "ReplicaValues"]

#: How many fetch mappings and feed keys a translator remembers (then it starts over).
_PLANS_KEPT = 256


class ReplicaValues(list):
    """A fetched leaf: one value per local replica, in replica order (a plain ``list`` otherwise).

    Where every replica holds the same number (a shared tensor, the global step), ``int()``,
    ``float()`` and ``.item()`` take it, so code written for one device (``int(sess.run(global_step))``,
    ``Saver.save(sess, path, global_step=step_tensor)``) keeps working.

    >>> ReplicaValues([np.int64(7), np.int64(7)]).item()
    7
    """

    __slots__ = ()

    def _one(self) -> Any:
        first = self[0] if self else None
        if not self or any(not np.array_equal(np.asarray(first), np.asarray(v)) for v in self[1:]):
            raise TypeError(f"this fetch holds one value per replica ({len(self)} on this worker) and they differ; "
                            "pick one, e.g. values[0]")
        return first

    def __int__(self) -> int:
        return int(self._one())

    def __float__(self) -> float:
        return float(self._one())

    def item(self) -> Any:
        """The value as a Python number, as NumPy's ``item()`` (TensorFlow 2.23's
        ``training_util.global_step`` reads ``sess.run(global_step).item()``)."""
        return np.asarray(self._one()).item()


class Translator:
    """Maps the single-device graph's fetches and feeds onto the rewritten graph.

    Args:
        graph: the rewritten graph.
        single_graph: the single-device graph (its ops and tensors are accepted).
        replicated: names of the ops copied per replica; other ops are shared.
        num_replicas: local replicas.
        held_in_parts: op name -> why it cannot be fetched whole (optimizer slots
            kept in parts by ``zero_stage``); its ops (``<name>/...``) neither.
    """

    def __init__(self, graph: tf.Graph, single_graph: tf.Graph | None, replicated: frozenset[str],
                 num_replicas: int, held_in_parts: Mapping[str, str] | None = None) -> None:
        self.graph = graph
        self.single_graph = single_graph
        self.num_replicas = num_replicas
        self.held_in_parts = dict(held_in_parts or {})
        self._replicated = replicated
        self._elements: dict[str, Any] = {}  # name -> op or tensor of the rewritten graph
        self._fetch_plans: dict[Any, tuple] = {}  # fetches' shape -> their mapping (see fetch_plan)
        self._feed_keys: dict[Any, tuple] = {}  # feed key -> (name, replica names, elements, rank, key)

    # ------------------------------------------------------------------ names
    def name_of(self, item: Any, what: str) -> str:
        """The name of a fetch or feed key (an op, a tensor, a name, a variable)."""
        if isinstance(item, str):
            return item
        if hasattr(item, "_as_graph_element") and not isinstance(item, (tf.Tensor, tf.Operation)):
            item = item._as_graph_element()
        if isinstance(item, (tf.Tensor, tf.Operation)):
            if item.graph is not self.single_graph and item.graph is not self.graph:
                raise ValueError(f"{what} {item.name!r} belongs to another graph than the one given "
                                 "to parallel_run()")
            return item.name
        raise TypeError(f"{what} must be an op, a tensor or a name of the single-device graph, "
                        f"got {type(item).__name__}: {item!r}")

    def element(self, name: str) -> Any:
        """The op or tensor ``name`` of the rewritten graph."""
        element = self._elements.get(name)
        if element is None:
            element = self._elements[name] = self.graph.as_graph_element(name)
        return element

    def check_exists(self, name: str, what: str) -> None:
        """Raise ``ValueError`` when ``name`` cannot be run here: it is kept in parts, or no graph has it."""
        op = name.split(":")[0]
        for slot, why in self.held_in_parts.items():
            if op == slot or op.startswith(slot + "/"):
                raise ValueError(f"{what} {name!r}: {why}")
        try:
            self.element(name)
        except (KeyError, ValueError) as e:
            raise ValueError(self._absent(name, what)) from e

    def _absent(self, name: str, what: str) -> str:
        """Why ``name`` is not in the rewritten graph: never in the single-device graph, or made after the rewrite."""
        if self.single_graph is not None:
            try:
                self.single_graph.as_graph_element(name)
            except (KeyError, ValueError):
                pass
            else:
                return (f"{what} {name!r} is in the single-device graph but not in the graph Parallax runs: it was "
                        "added after parallel_run() rewrote the graph; build every op before calling parallel_run()")
        return f"{what} {name!r} is not in the single-device graph"

    def replica_names(self, name: str) -> list[str]:
        """The names of ``name``'s copy on each replica (the one name, repeated, for a shared op)."""
        op = name.split(":")[0]
        if op not in self._replicated:
            return [name] * self.num_replicas
        if ":" in name:
            return [replica_tensor_name(name, r) for r in range(self.num_replicas)]
        return [replica_op_name(name, r) for r in range(self.num_replicas)]

    def is_replicated(self, name: str) -> bool:
        return name.split(":")[0] in self._replicated

    # ------------------------------------------------------------------ fetches
    def fetch_plan(self, fetches: Any) -> tuple[Any, dict[str, int], list[str], list[Any]]:
        """``fetches`` mapped to the rewritten graph: result structure, target positions, names and
        elements; remembered for fetches of the same shape and the same ops, tensors and names (a
        training loop fetches the same ones every step)."""
        key = _fetch_key(fetches)
        plan = self._fetch_plans.get(key) if key is not None else None
        if plan is None:
            targets: dict[str, int] = {}
            structure = self.map_fetches(fetches, targets)
            names = list(targets)
            plan = (structure, targets, names, [self.element(n) for n in names], fetches)
            if key is not None:
                if len(self._fetch_plans) >= _PLANS_KEPT:
                    self._fetch_plans.clear()
                self._fetch_plans[key] = plan  # holds ``fetches``: the ids in ``key`` stay theirs
        return plan[:4]

    def map_fetches(self, fetches: Any, targets: dict[str, int]) -> Any:
        """The structure of ``fetches`` with a leaf per fetch; the names to run are added to ``targets``."""
        if isinstance(fetches, dict):
            return _same_kind(fetches, ((k, self.map_fetches(v, targets)) for k, v in fetches.items()))
        if isinstance(fetches, tuple) and hasattr(fetches, "_fields"):
            return type(fetches)(*(self.map_fetches(v, targets) for v in fetches))
        if isinstance(fetches, (list, tuple)):
            return type(fetches)(self.map_fetches(v, targets) for v in fetches)
        name = self.name_of(fetches, "fetch")
        self.check_exists(name, "fetch")
        names = self.replica_names(name)
        for n in names:
            targets.setdefault(n, len(targets))
        return _Leaf(names)

    def rebuild(self, structure: Any, values: list[Any], targets: dict[str, int], first_only: bool = False) -> Any:
        """The results of a run in the shape of the fetches: a :class:`ReplicaValues` per leaf, or,
        with ``first_only`` (a hook's view), replica 0's value."""
        if isinstance(structure, _Leaf):
            if first_only:
                return values[targets[structure.names[0]]]
            return ReplicaValues(values[targets[n]] for n in structure.names)
        if isinstance(structure, dict):
            return _same_kind(structure, ((k, self.rebuild(v, values, targets, first_only))
                                          for k, v in structure.items()))
        if isinstance(structure, tuple) and hasattr(structure, "_fields"):
            return type(structure)(*(self.rebuild(v, values, targets, first_only) for v in structure))
        return type(structure)(self.rebuild(v, values, targets, first_only) for v in structure)

    # ------------------------------------------------------------------ feeds
    def map_feeds(self, feed_dict: Mapping[Any, Any], one_for_all: bool = False) -> dict[Any, Any]:
        """``feed_dict`` for the rewritten graph. ``one_for_all`` (a hook's feeds): a value that is
        not one per replica goes to every replica's copy, as one device would take it."""
        feeds: dict[Any, Any] = {}
        for key, value in feed_dict.items():
            name, names, elements, rank = self.feed_key(key)
            shared = names[0] == names[-1]
            per_replica = self._per_replica(value, rank)
            if (shared or one_for_all) and not per_replica:
                for element in dict.fromkeys(elements):
                    feeds[element] = value  # one value for the shared placeholder, as the original took
                continue
            if not per_replica:
                got = f"a list of {len(value)}" if isinstance(value, (list, tuple)) else \
                    f"an ndarray of shape {value.shape}" if isinstance(value, np.ndarray) else type(value).__name__
                raise ValueError(
                    f"feed for {name!r} must be a list (or an ndarray whose first axis is the replicas) with one "
                    f"value per replica ({self.num_replicas} replicas on this worker), got {got}")
            if shared and self.num_replicas > 1:
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

    def feed_key(self, key: Any) -> tuple[str, list[str], list[Any], int | None]:
        """A feed key's tensor name, its replicas' names, their tensors and its rank (remembered
        per key)."""
        ref = key if isinstance(key, str) else id(key)
        found = self._feed_keys.get(ref)
        if found is None:
            name = self.name_of(key, "feed key")
            if ":" not in name:
                name += ":0"
            self.check_exists(name, "feed key")
            names = self.replica_names(name)
            elements = [self.element(n) for n in names]
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
                or len(value) != self.num_replicas:  # replicas' batches may differ in length: no np.ndim(value)
            return False
        return rank is None or np.ndim(value[0]) == rank


def _fetch_key(fetches: Any) -> Any:
    """A hashable key for the shape and leaves of ``fetches`` (leaves by identity or name), or
    ``None`` for what :meth:`Translator.map_fetches` should see afresh (it explains errors)."""
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
