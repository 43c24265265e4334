"""What ParallaxSession does around a run, over a real TensorFlow session: what follows a step, the PS
writes barrier, the heartbeat, a profiler, options and run metadata, the session's properties, and closing
it (directly or by a with block).

The model, its hand-"rewritten" graph and the fake session are in tests/unit/runtime/session_fakes.py.
"""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from parallax.runtime.session import ParallaxSession
from tests.unit.runtime import session_fakes
from tests.unit.runtime.session_fakes import REPLICAS, FakeSession, Model, X

model = session_fakes.model  # the shared fixture, bound by name (imported by name, each test taking it is F811)


class FakeHeartbeat:
    def __init__(self):
        self.calls = []

    def set(self, state, where="", steps=None):
        self.calls.append(("set", state, where))

    def step_done(self):
        self.calls.append(("step_done",))


# --------------------------------------------------------------------------- after a step
class FakeMonitoredSession(FakeSession):
    """A session with a MonitoredSession's hook-free door, ``run_step_fn``."""

    def run_step_fn(self, step_fn):
        self.calls.append(SimpleNamespace(fetches="past the hooks"))
        return step_fn(SimpleNamespace(session=self.session))


@pytest.mark.parametrize("fetch, released", [
    (lambda m: m.ops.scaled, True),  # reaches total (the "training op" here) as data
    (lambda m: {"a": [m.ops.total]}, True),
    (lambda m: m.ops.y, False),
    (lambda m: "w:0", False),
], ids=["through-data", "nested", "not-reached", "shared"])
def test_what_follows_a_step_runs_after_a_run_that_ran_its_training_op(model, fetch, released):
    sess = model.session(after_steps={"total": "sync"}, heartbeat=FakeHeartbeat())
    for _ in range(2):  # the second run takes the cached answer
        model.fake.calls.clear()
        sess.run(fetch(model), {model.ops.x: X, model.shared.lr: 1.0})
        assert [c.fetches for c in model.fake.calls][1:] == ([[model.rewritten.get_operation_by_name("sync")]]
                                                             if released else [])


def test_what_follows_a_step_runs_past_the_hooks_and_not_after_a_failed_run():
    m = Model(REPLICAS)
    m.fake.__class__ = FakeMonitoredSession
    sess = m.session(after_steps={"total": "sync"})
    sess.run(m.ops.total, {m.ops.x: X})
    assert [c.fetches for c in m.fake.calls][1:] == ["past the hooks"]
    m.fake.calls.clear()
    with pytest.raises(tf.errors.InvalidArgumentError):
        sess.run(m.ops.total)  # x not fed: the step did not happen, nobody is released
    assert len(m.fake.calls) == 1
    m.close()


# --------------------------------------------------------------------------- heartbeat, profiler, options
def test_the_heartbeat_hears_of_each_run_and_of_its_end(model):
    heartbeat = FakeHeartbeat()
    sess = model.session(heartbeat=heartbeat, waits="in the all-reduce")
    sess.run(model.ops.total, {model.ops.x: X})
    sess.run("w:0")
    assert heartbeat.calls == [("set", "run", "in the all-reduce"), ("step_done",)] * 2


def test_the_heartbeat_hears_of_the_end_of_a_run_that_raises(model):
    heartbeat = FakeHeartbeat()
    sess = model.session(heartbeat=heartbeat, waits="in the all-reduce")
    with pytest.raises(tf.errors.InvalidArgumentError, match="x"):
        sess.run(model.ops.total)  # x not fed
    assert heartbeat.calls == [("set", "run", "in the all-reduce"), ("step_done",)]


def test_a_bad_name_fails_before_the_heartbeat_hears_of_a_run(model):
    heartbeat = FakeHeartbeat()
    with pytest.raises(ValueError):
        model.session(heartbeat=heartbeat).run("nope")
    assert heartbeat.calls == []


def test_run_passes_options_and_run_metadata_through(model):
    options, metadata = tf.compat.v1.RunOptions(), tf.compat.v1.RunMetadata()
    model.session().run("w:0", options=options, run_metadata=metadata)
    assert model.fake.calls[-1].options is options and model.fake.calls[-1].run_metadata is metadata


class FakeProfiler:
    def __init__(self):
        self.steps = []

    def run(self, run, options, run_metadata, step):
        self.steps.append(step)
        return run(options, run_metadata)


def test_a_profiler_runs_the_step_and_hears_the_global_step(model):
    profiler = FakeProfiler()
    sess = model.session(profiler=profiler)
    np.testing.assert_allclose(sess.run(model.ops.total, {model.ops.x: X}), [6.0, 14.0])
    model.fake.__class__ = FakeMonitoredSession  # read past a MonitoredSession's hooks
    sess.run("w:0")
    assert profiler.steps == [0, 0]
    assert [c.fetches for c in model.fake.calls][-2] == "past the hooks"


def test_the_session_properties(model):
    sess = model.session()
    assert sess.graph is model.single and sess.raw_session is model.fake and sess.num_replicas == REPLICAS
    assert sess.should_stop() is False
    model.fake.should_stop = lambda: 1
    assert sess.should_stop() is True


# --------------------------------------------------------------------------- close, context manager
def test_close_closes_the_session_then_undoes_what_was_set_up_in_order_once(model):
    undone = []
    sess = model.session(on_close=(lambda: undone.append("bindings"), lambda: undone.append("tee")))
    sess.close()
    sess.close()
    assert model.fake.closed and undone == ["bindings", "tee"]


def test_close_undoes_what_was_set_up_even_when_closing_the_session_fails(model):
    def fail():
        raise RuntimeError("close failed")

    undone = []
    model.fake.close = fail
    sess = model.session(on_close=(lambda: undone.append("tee"),))
    with pytest.raises(RuntimeError, match="close failed"):
        sess.close()
    assert undone == ["tee"]


def test_the_end_of_the_input_ends_a_with_block_quietly(model):
    undone = []
    with model.session(on_close=(lambda: undone.append("tee"),)) as sess:
        assert isinstance(sess, ParallaxSession)
        raise tf.errors.OutOfRangeError(None, None, "End of sequence")
    assert model.fake.closed and undone == ["tee"]


@pytest.mark.parametrize("error", [tf.errors.InvalidArgumentError(None, None, "bad"), tf.errors.CancelledError(
    None, None, "cancelled"), StopIteration("done"), ValueError("bad")],
    ids=["invalid-argument", "cancelled", "stop-iteration", "value-error"])
def test_other_errors_leave_a_with_block_after_closing(model, error):
    undone = []
    with pytest.raises(type(error)):
        with model.session(on_close=(lambda: undone.append("tee"),)):
            raise error
    assert model.fake.closed and undone == ["tee"]


def test_a_with_block_without_error_closes_the_session(model):
    with model.session() as sess:
        assert sess.run("w:0") == [2.0, 2.0]
    assert model.fake.closed


# --------------------------------------------------------------------------- the PS writes barrier
@pytest.mark.parametrize("chief", [True, False], ids=["chief-releases-after", "other-waits-before"])
def test_a_run_that_writes_a_server_variable_outside_a_step_takes_the_writes_barrier(model, chief):
    from parallax.runtime.session import WritesBarrier

    barrier = WritesBarrier(frozenset({"update"}), frozenset({"step"}), "sync", before=not chief)
    sess = model.session(writes=barrier)
    assert sess.run(model.shared.update, {model.shared.lr: 0.5}) == [1.0, 1.0]
    ran = [c.fetches for c in model.fake.calls]
    barrier_run = [model.rewritten.get_operation_by_name("sync")]
    assert ran[0 if not chief else 1] == barrier_run and len(ran) == 2
    model.fake.calls.clear()
    sess.run(model.ops.total, {model.ops.x: X})  # writes nothing: no barrier
    assert len(model.fake.calls) == 1


def test_a_write_this_worker_cannot_give_in_a_training_run_is_refused_as_a_fetch(model):
    from parallax.runtime.session import WritesBarrier

    barrier = WritesBarrier(frozenset({"update"}), frozenset({"step"}), "sync", before=True,
                            unsynchronised=frozenset({"update"}))
    sess = model.session(writes=barrier)
    with pytest.raises(ValueError, match=r"^fetch 'update': it writes a variable on the parameter servers outside "
                                         r"the training step, which only the chief \(worker 0\) writes"):
        sess.run([model.shared.update.op, model.ops.step], {model.shared.lr: 0.5, model.ops.x: X})
    assert sess.run(model.shared.update, {model.shared.lr: 0.5}) == [1.0, 1.0]  # alone, after the barrier: exact
