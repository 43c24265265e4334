"""The session ``parallel_run`` returns.

It holds a TensorFlow session over the rewritten graph and translates the
single-device graph's names, per the seed API: a fetch of an op or tensor of
the single-device graph (or its name, also inside lists, tuples and dicts)
comes back as a list with one value per local replica (``None`` for an op);
a feed takes a list with one value per local replica (or, as in the original
Parallax, an ndarray whose first axis is the replicas; a placeholder shared by
all replicas, such as a learning rate, also takes a single value). The mapping
is :class:`parallax.runtime.translate.Translator`'s, which the program's hooks share
(:mod:`parallax.runtime.hooks`). It is a ``SessionInterface``, so a
program's own ``tf.compat.v1.train.Saver`` saves and restores through it
(:mod:`parallax.runtime.saver_calls`). Nothing of TensorFlow's session classes is patched.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import tensorflow as tf

from parallax.errors import Preempted
from parallax.graph.graph_ops import ancestors, node_map, parse_input
from parallax.runtime.hooks import SessionTranslation, SingleDeviceSession, run_past_hooks

__all__ = ["ParallaxSession", "WritesBarrier"]


@dataclass(frozen=True)
class WritesBarrier:
    """How a PS worker orders the program's own writes of server variables outside a training step
    (:func:`parallax.rewrite.ps_sync.add_ps_sync`): a ``run`` that runs one of ``writes`` and no
    training op takes the barrier ``op`` (the chief's release after the run, another worker's wait
    before it), so every worker goes on with the chief's write done. In a run that also trains,
    ``unsynchronised`` writes cannot be fetched on this worker.
    """

    writes: frozenset[str]
    train_ops: frozenset[str]
    op: str
    before: bool
    unsynchronised: frozenset[str] = frozenset()


class ParallaxSession(SingleDeviceSession):
    """Runs the distributed graph with the single-device graph's names.

    Args:
        session: the TensorFlow session (usually a ``MonitoredSession``) over
            the rewritten graph.
        translation: how the single-device graph's fetches and feeds map onto the
            rewritten graph (:class:`parallax.runtime.hooks.SessionTranslation`, shared with
            the program's hooks), and whether this worker is the chief.
        profiler: a :class:`parallax.runtime.profiling.Profiler` for ``ProfileConfig``.
        heartbeat: a :class:`parallax.launch.monitor.Heartbeat` told of every
            ``run`` (the stall check), or ``None``.
        waits: where a step waits for other processes, for the stall check.
        on_close: what to undo when the session closes (bindings of the
            communication backends, a tee of the output), in order.
        after_steps: training op -> op to run, past the hooks, after every
            ``run`` that ran it (the PS chief's release of the other workers,
            :func:`parallax.graph.names.release_op`).
        writes: the PS writes barrier (:class:`WritesBarrier`), or ``None``.
        group: the job's workers as a group the program's loop can talk to between steps
            (:mod:`parallax.comm.group`), or ``None``.
        hooks: whether ``session`` runs hooks, which may build ops: each ``run``
            then makes the rewritten graph the default one (5 us a run, skipped
            without hooks; the session's creator enters the graph itself when a
            ``MonitoredSession`` creates its session again).
        preemption: the job's preemption state (:class:`parallax.member.preemption.Preemption`), or ``None``
            (a process that does not take SIGTERM). A ``run`` in which the chief's preemption hook saved
            (:class:`~parallax.errors.Preempted`) ends the process here, the door, with the preempted exit code.
    """

    def __init__(self, session: Any, translation: SessionTranslation, profiler: Any = None, heartbeat: Any = None,
                 waits: str = "", on_close: tuple[Callable[[], None], ...] = (),
                 after_steps: Mapping[str, str] | None = None, hooks: bool = True,
                 writes: WritesBarrier | None = None, group: Any = None, preemption: Any = None) -> None:
        self._session = session
        self._translation = translation
        self._translator = translation.translator
        self._graph = translation.translator.graph
        self._profiler = profiler
        self._heartbeat = heartbeat
        self._step_tensor: Any = False  # the global step tensor once looked up (None: there is none)
        self._waits = waits
        self._on_close = list(on_close)
        self._after_steps = dict(after_steps or {})
        self._writes = writes
        self.group = group
        self.preemption = preemption
        self._around_runs: dict[tuple[str, ...], tuple] = {}  # targets -> what runs before and after them
        self._node_map: dict[str, Any] | None = None
        self._hooks = hooks

    # ------------------------------------------------------------------ #
    # ``graph`` (SingleDeviceSession's) is the single-device graph, whose names this session speaks;
    # ``raw_session.graph`` is the rewritten one it runs.
    @property
    def num_replicas(self) -> int:
        return self._translator.num_replicas

    @property
    def held_in_parts(self) -> dict[str, str]:
        """The variables no worker holds whole (optimizer slots ``zero_stage`` shards), and why."""
        return dict(self._translator.held_in_parts)

    def on_server(self, name: str) -> bool:
        """Whether the single-device graph's variable ``name`` is held by a parameter server (one copy, which
        every worker reads) rather than by each worker."""
        try:
            return "/job:ps" in self._translator.graph.get_operation_by_name(name).device
        except KeyError:
            return False

    @property
    def raw_session(self) -> Any:
        """The underlying TensorFlow session, for what the wrapper does not cover."""
        return self._session

    def run(self, fetches: Any, feed_dict: Mapping[Any, Any] | None = None,
            options: Any = None, run_metadata: Any = None) -> Any:
        """Run one step, like ``tf.compat.v1.Session.run``.

        On the chief of a job asked to end with a checkpoint (SIGTERM), the run saves after its step and does not
        return: the process ends with the preempted exit code (:mod:`parallax.member.preemption`).

        Args:
            fetches: ops, tensors or names of the single-device graph, alone or
                nested in lists, tuples and dicts.
            feed_dict: maps a placeholder (or its name) to a list with one value
                per local replica, or an ndarray whose first axis is the replicas; a
                placeholder shared by the replicas also takes a single value.
            options: a ``RunOptions`` proto, passed through.
            run_metadata: a ``RunMetadata`` proto, passed through.

        Returns:
            ``fetches`` with each leaf replaced by a list of one value per replica
            (:class:`parallax.runtime.translate.ReplicaValues`). A program's own
            ``tf.compat.v1.train.Saver`` calling ``save``/``restore`` with this session
            gets one value, as from a TensorFlow session: its save writes on the chief
            only, its restore runs on every worker.

        Raises:
            ValueError: a name is not in the graph, or a feed value is not a list
                of one value per replica.
            TypeError: a fetch or feed key is of an unsupported type.
        """
        kind = self._translation.saver_call(fetches, feed_dict)
        if kind is not None:
            return self._translation.run_saver_call(
                kind, lambda elements, feeds: run_past_hooks(self._session, elements, feeds), fetches, feed_dict)
        structure, targets, names, elements = self._translator.fetch_plan(fetches)
        feeds = self._translator.map_feeds(feed_dict) if feed_dict else None
        self._translation.current = tf.compat.v1.train.SessionRunArgs(fetches, feed_dict, options)
        try:
            values = self._call(elements, feeds, options, run_metadata, names)
        except Preempted as preempted:  # the chief's preemption hook saved: the process ends here, at the door
            if self.preemption is None:
                raise
            self.preemption.end(preempted)
        finally:
            self._translation.current = None
        return self._translator.rebuild(structure, values, targets)

    def _call(self, elements: list[Any], feeds: Any, options: Any, run_metadata: Any, names: list[str]) -> list[Any]:
        """Run ``elements`` on the TensorFlow session (the heartbeat told, profiled, what the run needs
        before and after it past the hooks: the writes barrier, the PS chief's releases)."""
        before, after = self._around(names)
        if self._heartbeat is not None:
            self._heartbeat.set("run", self._waits)
        try:
            if before:
                run_past_hooks(self._session, before)
            # hooks (checkpoint saving) build and run ops in graph mode
            with self._graph.as_default() if self._hooks else _NO_CONTEXT:
                if self._profiler is None:
                    values = self._session.run(elements, feed_dict=feeds, options=options, run_metadata=run_metadata)
                else:
                    values = self._profiler.run(
                        lambda opts, metadata: self._session.run(elements, feed_dict=feeds, options=opts,
                                                                 run_metadata=metadata),
                        options, run_metadata, self._global_step())
                if after:
                    run_past_hooks(self._session, after)
        finally:
            if self._heartbeat is not None:
                self._heartbeat.step_done()
        return values

    def read(self, fetches: Any, feed_dict: Mapping[Any, Any] | None = None) -> Any:
        """Read ``fetches`` (of the single-device graph, as :meth:`run` takes them, fed as it takes them) past
        the program's hooks, one value each (the first local replica's), as one device gives them: a read
        that is no step of the program's (a ``MonitoredSession`` refuses ``run`` once its hooks asked to stop)."""
        structure, targets, _, elements = self._translator.fetch_plan(fetches)
        feeds = self._translator.map_feeds(feed_dict) if feed_dict else None
        return self._translator.rebuild(structure, run_past_hooks(self._session, elements, feeds), targets,
                                        first_only=True)

    def make_callable(self, fetches: Any, feed_list: list | tuple | None = None, accept_options: bool = False):
        """A function that runs ``fetches``, like ``tf.compat.v1.Session.make_callable``.

        It takes one argument per entry of ``feed_list`` (each, as in :meth:`run`,
        a list with one value per replica), plus ``options`` and ``run_metadata``
        keywords when ``accept_options``, and returns what :meth:`run` returns.
        Names are checked now, not at the first call.
        """
        feed_list = list(feed_list or ())
        self._translator.map_fetches(fetches, {})  # bad fetch names fail here
        for key in feed_list:
            name = self._translator.name_of(key, "feed key")
            self._translator.check_exists(name if ":" in name else name + ":0", "feed key")

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
        return int(run_past_hooks(self._session, self._step_tensor))

    def _around(self, targets: list[str]) -> tuple[list[Any], list[Any]]:
        """What a run of ``targets`` runs before and after it: the writes barrier when it writes server
        variables outside a step, the ``after_steps`` ops of the training ops it runs.

        Raises:
            ValueError: it fetches a write this worker cannot give the value of (see :class:`WritesBarrier`).
        """
        if not self._after_steps and self._writes is None:
            return [], []
        key = tuple(targets)
        found = self._around_runs.get(key)
        if found is None:
            ran = ancestors(self._nodes(), {parse_input(t)[0] for t in targets})
            element = self._translator.element
            before, after = [], [element(op) for t, op in self._after_steps.items() if t in ran]
            barrier = self._writes
            if barrier is not None and not ran & barrier.train_ops:
                if ran & barrier.writes:
                    (before if barrier.before else after).append(element(barrier.op))
            elif barrier is not None:
                refused = sorted({parse_input(t)[0] for t in targets} & barrier.unsynchronised)
                if refused:
                    raise ValueError(
                        f"fetch {refused[0]!r}: it writes a variable on the parameter servers outside the training "
                        "step, which only the chief (worker 0) writes, and in a run that also trains this worker "
                        "cannot tell when the chief's write is done, so it cannot give the value one device would. "
                        "Fetch it in a run of its own, or on worker 0 only, or write it under "
                        "tf.control_dependencies([train_op]) so that it follows the step")
            found = self._around_runs[key] = (before, after)
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


_NO_CONTEXT = contextlib.nullcontext()
