"""The program's hooks on the rewritten graph (parallax/runtime/hooks.py), over a real MonitoredSession on the
hand-rewritten two-replica graph of tests/unit/runtime/session_fakes.py: hooks hold the single-device graph's tensors as
TF1 programs write them, see one device's values, feed, stop the loop, and see only the program's own runs."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

from parallax.errors import AnalysisError
from parallax.runtime.hooks import HookAdapter, SessionTranslation, begin_hooks, run_past_hooks
from parallax.runtime.session import ParallaxSession
from parallax.runtime.translate import Translator
from tests.unit.runtime.session_fakes import REPLICAS, Model, X


class Recorder(tf.compat.v1.train.SessionRunHook):
    """A hook as a TF1 program writes one: asks for a tensor of its graph, feeds, records what it got."""

    def __init__(self, fetches, feeds=None, stop_after=None, at_end=None, again=None):
        self.fetches, self.feeds, self.stop_after, self.at_end, self.again = fetches, feeds, stop_after, at_end, again
        self.results, self.original, self.begun, self.ended = [], [], 0, None

    def begin(self):
        self.begun += 1
        self.default_graph = tf.compat.v1.get_default_graph()

    def after_create_session(self, session, coord):
        self.created_with = session

    def before_run(self, run_context):
        self.original.append(run_context.original_args.fetches)
        return tf.compat.v1.train.SessionRunArgs(self.fetches, self.feeds)

    def after_run(self, run_context, run_values):
        self.results.append(run_values.results)
        if self.again is not None:
            self.again_value = run_context.session.run(self.again, {"lr": 2.0})
        if self.stop_after is not None and len(self.results) >= self.stop_after:
            run_context.request_stop()

    def end(self, session):
        if self.at_end is not None:
            self.ended = session.run(self.at_end)


@pytest.fixture
def model():
    m = Model(REPLICAS)
    yield m
    m.close()


def monitored(model, hooks, chief=True):
    """A ParallaxSession over a MonitoredSession of the rewritten graph running ``hooks`` through adapters."""
    translation = SessionTranslation(Translator(model.rewritten, model.single, model.replicated, REPLICAS),
                                     chief=chief)
    begin_hooks(hooks, model.single)
    with model.rewritten.as_default():
        creator = tf.compat.v1.train.ChiefSessionCreator(scaffold=tf.compat.v1.train.Scaffold())
        session = tf.compat.v1.train.MonitoredSession(creator, hooks=[HookAdapter(h, translation) for h in hooks])
    return ParallaxSession(session, translation)


def test_a_hook_is_begun_once_on_the_single_device_graph(model):
    hook = Recorder(model.ops.total)
    sess = monitored(model, [hook])
    assert hook.begun == 1 and hook.default_graph is model.single
    sess.close()
    assert hook.begun == 1


def test_a_hook_holding_a_tensor_of_the_single_device_graph_gets_one_value_as_on_one_device(model):
    hook = Recorder({"total": model.ops.total, "name": "y:0"}, again=model.shared.update)
    sess = monitored(model, [hook])
    sess.run(model.ops.step, {model.ops.x: X})
    got = hook.results[0]
    assert set(got) == {"total", "name"}
    np.testing.assert_allclose(got["total"], 6.0)  # replica 0's: 2 * (1 + 2)
    np.testing.assert_allclose(got["name"], [2.0, 4.0])
    assert hook.again_value == 4.0  # run_context.session speaks the single-device graph too: lr * w
    assert hook.original == [model.ops.step]  # the program's own arguments
    sess.close()


def test_a_hooks_feed_of_one_value_goes_to_every_replica(model):
    hook = Recorder(model.ops.scaled, feeds={model.shared.lr: 0.5}, at_end=model.shared.v)
    sess = monitored(model, [hook])
    sess.run(model.ops.step, {model.ops.x: X})
    np.testing.assert_allclose(hook.results[0], 3.0)  # 6.0 * 0.5
    sess.close()
    assert hook.ended == 3.0  # end()'s session takes the single-device graph's variable too


def test_a_hook_stops_the_programs_loop(model):
    hook = Recorder(model.ops.total, stop_after=2)
    sess = monitored(model, [hook])
    runs = 0
    while not sess.should_stop():
        sess.run(model.ops.step, {model.ops.x: X})
        runs += 1
    assert runs == 2
    sess.close()


def test_parallaxs_own_runs_go_past_the_hooks(model):
    hook = Recorder(model.ops.total)
    sess = monitored(model, [hook])
    run_past_hooks(sess.raw_session, model.rewritten.get_tensor_by_name("w:0"))
    assert hook.results == []
    sess.close()


def test_a_hook_that_makes_a_variable_in_begin_is_refused_naming_it(model):
    class Counter(tf.compat.v1.train.SessionRunHook):
        def begin(self):
            self.count = tf.compat.v1.Variable(0, name="hook_count")

    with pytest.raises(AnalysisError, match=r"^hook Counter created the variable\(s\) hook_count:0 in begin\(\); "):
        begin_hooks([Counter()], model.single)


def test_an_op_a_hook_adds_after_the_rewrite_is_named_so(model):
    with model.single.as_default():
        late = tf.identity(model.ops.total, name="late")
    hook = Recorder(late)
    with pytest.raises(ValueError, match=r"^fetch 'late:0' is in the single-device graph but not in the graph "
                                         r"Parallax runs: it was added after parallel_run\(\)"):
        sess = monitored(model, [hook])
        sess.run(model.ops.step, {model.ops.x: X})
