"""The program's ``SessionRunHook`` objects, run on the rewritten graph as on the single-device one.

A TF1 program writes its hooks for the graph it built: ``NanTensorHook(loss)``,
``LoggingTensorHook({"loss": loss})``, a hook whose ``before_run`` returns
``SessionRunArgs(loss)`` or feeds a placeholder, ``StopAtStepHook``. Parallax runs
them unchanged:

* :func:`begin_hooks` calls every hook's ``begin()`` with the single-device graph as
  the default graph, before the rewrite: what a hook builds there (a global step
  read, a summary) is part of the graph that is rewritten, and the tensors a hook
  holds are the graph's own;
* each hook is wrapped in a :class:`HookAdapter`: its ``SessionRunArgs`` (fetches
  and feeds of the single-device graph, or names) are translated as ``sess.run``'s
  are (:class:`parallax.runtime.translate.Translator`); its ``after_run`` gets the results
  as one device gives them, one value per fetch (replica 0's: with one replica per
  process, this process's); a feed value that is not one per replica goes to every
  replica; ``run_context.session`` and the session given to
  ``after_create_session``/``end`` are a :class:`HookSession` that does the same,
  ``run_context.original_args`` are the program's own arguments, and
  ``request_stop()`` stops the program's loop.

The hooks see exactly the program's own runs: Parallax's runs (the start-up
broadcast, the PS chief's release, profiling's step read) go past them.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import tensorflow as tf
from tensorflow.python.client.session import SessionInterface  # what Saver.save checks a session is

from parallax.errors import AnalysisError
from parallax.runtime.saver_calls import SAVE, SaverCalls
from parallax.runtime.translate import Translator

__all__ = ["begin_hooks", "HookAdapter", "HookSession", "SessionTranslation", "SingleDeviceSession", "run_past_hooks"]

_HookBase = tf.compat.v1.train.SessionRunHook


def begin_hooks(hooks: Sequence[_HookBase], graph: tf.Graph) -> bool:
    """Call each hook's ``begin()`` with ``graph`` (the single-device graph) as the default graph.

    Returns:
        Whether the hooks added ops to ``graph`` (then it must be exported again).

    Raises:
        AnalysisError: a hook created a variable: variables are planned before the session starts.
    """
    if not hooks:
        return False
    keys = (tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.LOCAL_VARIABLES)
    before_version = graph.version
    variables = {v.name for key in keys for v in graph.get_collection(key)}
    for hook in hooks:
        with graph.as_default():
            hook.begin()
        new = sorted({v.name for key in keys for v in graph.get_collection(key)} - variables)
        if new:
            raise AnalysisError(f"hook {type(hook).__name__} created the variable(s) {', '.join(new)} in begin(); "
                                "Parallax places every variable before the session starts: create them in the graph "
                                "before calling parallel_run()")
    return graph.version != before_version


def run_past_hooks(session: Any, fetches: Any, feed_dict: Any = None) -> Any:
    """Run ``fetches`` on a ``MonitoredSession`` without its hooks (Parallax's own runs are no step of the
    program's); on any other session, plainly."""
    step_fn = getattr(session, "run_step_fn", None)  # a MonitoredSession's hook-free door
    if step_fn is None:
        return session.run(fetches, feed_dict=feed_dict)
    return step_fn(lambda step_context: step_context.session.run(fetches, feed_dict=feed_dict))


class SessionTranslation:
    """What a session over the rewritten graph needs to answer in the single-device graph's terms:
    the :class:`Translator`, the savers' calls, and whether this worker is the chief (it alone saves).

    ``current`` holds the program's own arguments of the ``run`` in progress (the hooks'
    ``run_context.original_args``).
    """

    def __init__(self, translator: Translator, chief: bool) -> None:
        self.translator = translator
        self.chief = chief
        self.saver_calls = SaverCalls(translator.single_graph)
        self.current: Any = None

    def saver_call(self, fetches: Any, feed_dict: Any) -> str | None:
        """``SAVE``/``RESTORE`` when this run is a ``tf.compat.v1.train.Saver``'s (see
        :mod:`parallax.runtime.saver_calls`).

        Raises:
            ValueError: the variables are kept in parts (``zero_stage``), which a program's Saver cannot save.
        """
        if not feed_dict or not self.saver_calls.filenames or not isinstance(fetches, (str, tf.Tensor, tf.Operation)):
            return None
        t = self.translator
        kind = self.saver_calls.kind([t.name_of(fetches, "fetch")], [t.name_of(k, "feed key") for k in feed_dict])
        if kind is not None and t.held_in_parts:
            raise ValueError("this program's tf.compat.v1.train.Saver cannot save or restore the optimizer slots that "
                             "zero_stage keeps in parts on the workers; checkpoint with parallax.CheckPointConfig "
                             "(its saver gathers them under their single-device names), or use zero_stage=0")
        return kind

    def run_saver_call(self, kind: str, run: Callable, fetches: Any, feed_dict: Any) -> Any:
        """A saver's call, answered as the saver expects: one value. A save writes on the chief only (every
        worker runs the same program; one writes the files); the others get the file name back. A restore
        runs on every worker."""
        if kind == SAVE and not self.chief:
            return next(iter(feed_dict.values()))
        structure, targets, _, elements = self.translator.fetch_plan(fetches)
        values = run(elements, self.translator.map_feeds(feed_dict))
        return self.translator.rebuild(structure, values, targets, first_only=True)


class SingleDeviceSession(SessionInterface):
    """A session over the rewritten graph (``_session``) that speaks the single-device graph
    (``_translation``): what it says of itself as a TensorFlow ``SessionInterface``, which a
    ``Saver`` checks for. Its ``graph`` is the single-device graph."""

    _session: Any
    _translation: SessionTranslation

    @property
    def graph(self) -> tf.Graph:
        return self._translation.translator.single_graph

    @property
    def graph_def(self):
        return self.graph.as_graph_def()

    @property
    def sess_str(self) -> str:
        return getattr(self._session, "sess_str", "")


class HookSession(SingleDeviceSession):
    """The session a program's hook gets: runs fetches and feeds of the single-device graph on the real
    session, each fetch coming back as one value (replica 0's), as on one device. Other attributes are
    the real session's."""

    def __init__(self, session: Any, translation: SessionTranslation) -> None:
        self._session = session
        self._translation = translation

    def run(self, fetches: Any, feed_dict: Any = None, options: Any = None, run_metadata: Any = None) -> Any:
        translation = self._translation

        def run(elements, feeds):
            return self._session.run(elements, feed_dict=feeds, options=options, run_metadata=run_metadata)

        kind = translation.saver_call(fetches, feed_dict)
        if kind is not None:
            return translation.run_saver_call(kind, run, fetches, feed_dict)
        t = translation.translator
        structure, targets, _, elements = t.fetch_plan(fetches)
        values = run(elements, t.map_feeds(feed_dict, one_for_all=True) if feed_dict else None)
        return t.rebuild(structure, values, targets, first_only=True)

    def partial_run_setup(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a hook's session does not support partial_run")

    def partial_run(self, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError("a hook's session does not support partial_run")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._session, name)


class _HookRunContext(tf.compat.v1.train.SessionRunContext):
    """A run context in the single-device graph's terms; ``request_stop`` reaches the real one."""

    def __init__(self, real: Any, original_args: Any, session: HookSession) -> None:
        super().__init__(original_args, session)
        self._real = real

    @property
    def stop_requested(self) -> bool:
        return self._real.stop_requested

    def request_stop(self) -> None:
        self._real.request_stop()


class HookAdapter(_HookBase):
    """A program's hook on the rewritten graph (see the module docstring). Its ``begin`` was called
    by :func:`begin_hooks`, on the single-device graph."""

    def __init__(self, hook: _HookBase, translation: SessionTranslation) -> None:
        self.hook = hook
        self._translation = translation
        self._plan: Any = None  # this run's (structure, targets) of the hook's fetches

    def begin(self) -> None:
        pass  # begun on the single-device graph, before the rewrite (begin_hooks)

    def after_create_session(self, session, coord) -> None:
        self.hook.after_create_session(HookSession(session, self._translation), coord)

    def before_run(self, run_context) -> Any:
        t = self._translation.translator
        args = self.hook.before_run(self._context(run_context))
        self._plan = None
        if args is None:
            return None
        fetches, elements = None, None
        if args.fetches is not None:
            structure, targets, _, elements = t.fetch_plan(args.fetches)
            self._plan = (structure, targets)
        feeds = t.map_feeds(args.feed_dict, one_for_all=True) if args.feed_dict else None
        if elements is not None:
            fetches = list(elements)
        return tf.compat.v1.train.SessionRunArgs(fetches, feeds, args.options)

    def after_run(self, run_context, run_values) -> None:
        results = None
        if self._plan is not None:
            structure, targets = self._plan
            results = self._translation.translator.rebuild(structure, run_values.results, targets, first_only=True)
        values = tf.compat.v1.train.SessionRunValues(results=results, options=run_values.options,
                                                     run_metadata=run_values.run_metadata)
        self.hook.after_run(self._context(run_context), values)

    def end(self, session) -> None:
        self.hook.end(HookSession(session, self._translation))

    def _context(self, run_context) -> _HookRunContext:
        original = self._translation.current or run_context.original_args
        return _HookRunContext(run_context, original, HookSession(run_context.session, self._translation))
