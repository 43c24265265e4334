"""The metrics a ``tf.function`` step updates, kept in the program's own variables after every step.

A Keras metric (Keras 3 and ``tf_keras``) keeps its state (totals, counts, confusion counts) in variables
synchronised on read with aggregation ``SUM``: under ``tf.distribute`` each replica adds its part's values to
its own copy, and reading the metric sums the copies. A program's loop reads them eagerly between steps
(``train_loss.result()`` in an epoch's summary, TensorFlow's quickstart) and resets them eagerly
(``reset_state()``); the job's copies of them live in its graph, which the program's variables do not see.

So after each step :class:`SummedState` reads what the step added to this worker's copies, sums that over the
workers (one small all-reduce), and adds it to the program's variables: they then hold what one device's would,
every example of every step counted once, and a reset or any other value the program writes between steps is where
the next step's sums are added. ``parallax.fit``, which reads the metrics only where its logs are read, has the
sums made there instead (:meth:`SummedState.defer`, :meth:`SummedState.flush`): each worker keeps what its steps
added until then, and one all-reduce adds the steps since the last. Each worker keeps its copy in every mode (the
plan puts no such variable on a parameter server: :func:`parallax.plan.policies.build_plan`), and each of its
replicas adds its part to it (:mod:`parallax.rewrite.classify`, :mod:`parallax.rewrite.replicate`). Should a copy
be on a server after all, only worker 0 writes it, and the metrics count its examples: said at WARNING once.

A sum of what each replica added equals one device's state only where the step adds to it. A metric whose state
is not a running sum (a running maximum, ``assign(v, max(v, x))``; the last batch's value, ``assign(v, x)``; a
reset inside the step) is named at WARNING when the step is made (:func:`not_added`): its value differs from one
device's, the training does not.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import tensorflow as tf
from tensorflow.python.ops import gen_resource_variable_ops

from parallax.comm.group import Alone
from parallax.graph.graph_ops import added_to_itself, ancestors, node_map, parse_input, written_variable
from parallax.logs import log as logger
from parallax.tf2.trace import STEP_OP

__all__ = ["SummedState", "not_added"]


class SummedState:
    """The summed variables of a step (see the module docstring).

    Args:
        session: the step's session (:class:`parallax.runtime.session.ParallaxSession`).
        eager: the step's eager variables by graph name (:attr:`parallax.tf2.trace.TracedStep.variables`).
        graph: the step's single-device graph.
        fetched: the tensors the step fetches; where they read every summed variable after the step's writes
            (``parallax.fit``'s step returns its metrics' state so) and a worker has one replica, their values
            come with the step's own run, not a second one.
    """

    def __init__(self, session: Any, eager: dict, graph: tf.Graph, fetched: list | tuple = ()) -> None:
        self._session = session
        self._names = sorted(n for n, v in eager.items() if v.summed)
        self._eager = [eager[n] for n in self._names]
        by_name = {v.op.name: v for v in graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)}
        self._graph_variables = [by_name[n] for n in self._names]
        self._group = session.group or Alone()
        self._shared = [n for n in self._names if session.on_server(n)]
        self._in_step = _reads_among(fetched, self._names) if session.num_replicas == 1 else None
        self._base = self._read() if self._names else []  # the job's copies as the first step finds them
        odd = not_added(graph, self._names) if self._names and self._group.index == 0 else {}
        if odd:
            logger.warning("Parallax: the step writes the metric state %s other than by adding to it (Keras sums a "
                           "metric's state over replicas); Parallax adds what each replica's step added to its copy, "
                           "which equals one device's state only for sums (totals, counts): these metrics' values "
                           "differ from one device's (the training does not). Keep a metric's state in sums, or "
                           "compute it from the trained model after training",
                           ", ".join(f"{n} ({op})" for n, op in odd.items()))
        self._warned = False
        self._deferred = False
        self._pending: np.ndarray | None = None  # deferred: what the steps since the last flush added here

    @property
    def names(self) -> list[str]:
        """The summed variables' names in the step's graph."""
        return list(self._names)

    def defer(self) -> None:
        """Keep what each step adds on this worker until :meth:`flush` (``parallax.fit``, which reads the
        metrics only at points every worker knows), instead of summing it over the workers after every step."""
        self._deferred = True

    def after_step(self, fetched: list) -> None:
        """Add what the step added to the job's copies, summed over the workers, to the program's variables
        (deferred: keep it here until :meth:`flush`).

        Args:
            fetched: the values the step's run fetched (the tensors given when this was made), one list of
                values per tensor, one value per replica.
        """
        if not self._names:
            return
        if self._in_step is not None:
            now = [np.asarray(fetched[i][0]) for i in self._in_step]
        else:
            now = self._read()
        flat = np.concatenate([(a - b).astype(np.float64).reshape(-1) for a, b in zip(now, self._base)])
        self._base = now
        if self._deferred:
            self._pending = flat if self._pending is None else self._pending + flat
            return
        self._add(flat, self._group.sum(flat))

    def flush(self, flags: tuple = ()) -> np.ndarray:
        """Sum what the steps added here since the last flush over the workers, and add it to the program's
        variables; ``flags`` (numbers) are summed along, in the same call. Every worker calls it at the same
        points (a collective).

        Returns:
            ``flags`` summed over the workers.
        """
        pending = self._pending if self._pending is not None else np.zeros(sum(b.size for b in self._base))
        self._pending = None
        total = self._group.sum(np.concatenate([pending, np.asarray(flags, dtype=np.float64)]))
        if pending.size:
            self._add(pending, total[:pending.size], exact=True)
        return total[pending.size:]

    def restart(self, writes: dict) -> None:
        """Set this worker's copies in the job to zero, as the program's were just set (``parallax.fit`` resets the
        model's metrics at each epoch's start, as ``model.fit`` does): each step then adds to zero as one device's
        step does, so that on one worker the sums :meth:`flush` brings are one device's to the bit (a copy that
        ran on carries the epochs before, and a step's sum taken as its difference from that loses the last bits).
        Call it between flushes (what the steps before added is kept).

        Args:
            writes: each variable's placeholder and write (:attr:`parallax.tf2.trace.TracedStep.summed_writes`); a
                variable without one keeps its copy.
        """
        known = [(writes[n], b) for n, b in zip(self._names, self._base) if n in writes]
        if not known:
            return
        feeds = {placeholder: [np.zeros_like(b)] * self._session.num_replicas for (placeholder, _), b in known}
        self._session.run([write for (_, write), _ in known], feed_dict=feeds)
        self._base = self._read()  # what the copies now hold (a write a server's worker left to the chief: their own)

    def _add(self, flat: np.ndarray, total: np.ndarray, exact: bool = False) -> None:
        """Add ``total`` (``flat``, this worker's own, for a variable on a server) to the program's variables;
        ``exact``: the sum made in float64 from the variable's value and written (one round, not two)."""
        shared = set(self._shared)
        at = 0
        for name, eager, base in zip(self._names, self._eager, self._base):
            size = base.size
            step = (flat if name in shared else total)[at:at + size].reshape(base.shape)
            at += size
            if not step.any():
                continue
            dtype = eager.dtype.as_numpy_dtype
            if exact:
                value = (np.asarray(eager.variable.numpy(), np.float64) + step).astype(dtype)
                gen_resource_variable_ops.assign_variable_op(eager.variable.handle, tf.constant(value))
            else:  # the op alone: Variable.assign_add's Python layers cost several times it, each step
                gen_resource_variable_ops.assign_add_variable_op(eager.variable.handle, tf.constant(step.astype(dtype)))
        self._warn_once()

    def _read(self) -> list[np.ndarray]:
        return [np.asarray(v) for v in self._session.read(self._graph_variables)]

    def _warn_once(self) -> None:
        if self._warned or self._group.index != 0:
            return
        self._warned = True
        if self._shared:
            logger.warning("Parallax: %s, which the step updates (a metric's state, summed over replicas), live on "
                           "a parameter server, which only worker 0 writes: the program's metrics count worker 0's "
                           "examples, not every worker's; run_option 'MPI' or 'HYBRID' keeps them on the workers",
                           ", ".join(self._shared))


def _reads_among(tensors: list | tuple, names: list[str]) -> list[int] | None:
    """Where among ``tensors`` a read of each variable of ``names`` is (through identities), or ``None``
    where one is missing."""
    found: dict[str, int] = {}
    for index, tensor in enumerate(tensors):
        op = tensor.op
        while op.type == "Identity":
            op = op.inputs[0].op
        if op.type == "ReadVariableOp":
            found.setdefault(op.inputs[0].op.name, index)
    at = [found.get(name) for name in names]
    return None if None in at else at


def not_added(graph: tf.Graph, names: list[str]) -> dict[str, str]:
    """Of the variables ``names``, those the step of ``graph`` (the ops its :data:`~parallax.tf2.trace.STEP_OP`
    runs) writes other than by adding to them (``assign_add``, or ``assign(v, v + x)`` as Keras 3's metrics
    write), each with the type of the op whose value it writes."""
    nodes = node_map(graph.as_graph_def())
    wanted, odd = set(names), {}
    for name in ancestors(nodes, [STEP_OP]) if STEP_OP in nodes else ():
        node = nodes[name]
        variable = written_variable(node, nodes)
        if variable not in wanted or variable in odd or node.op in ("AssignAddVariableOp", "AssignSubVariableOp") \
                or added_to_itself(node, nodes) is not None:
            continue
        value = nodes.get(parse_input(node.input[1])[0]) if node.op == "AssignVariableOp" else None
        odd[variable] = value.op if value is not None else node.op
    return odd
