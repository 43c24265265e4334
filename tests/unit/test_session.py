"""ParallaxSession's translation of single-device names, over a real TensorFlow session.

The "rewritten" graph is built by hand: the per-replica part of the model once
at the root (replica 0 keeps the original names) and once under
``parallax_replica_<r>/`` for each further replica, as
:func:`parallax.rewrite.names.replica_op_name` names the copies; the shared
part (a constant, a variable, a learning-rate placeholder, an update op) once.
"""

from __future__ import annotations

import collections
from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from parallax.hooks import SessionTranslation
from parallax.rewrite.names import REPLICA_PREFIX, replica_op_name
from parallax.session import ParallaxSession
from parallax.translate import Translator

REPLICAS = 2
Pair = collections.namedtuple("Pair", "out total")


def _shared_part():
    w = tf.constant(2.0, name="w")
    v = tf.compat.v1.Variable(3.0, name="v")
    lr = tf.compat.v1.placeholder(tf.float32, [], name="lr")
    offset = tf.compat.v1.placeholder(tf.float32, [2], name="offset")  # shared, of shape [2]
    update = tf.multiply(lr, w, name="update")
    tf.no_op(name="sync")
    tf.compat.v1.train.create_global_step()
    return SimpleNamespace(w=w, v=v, lr=lr, offset=offset, update=update)


def _replica_part(shared):
    x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
    y = tf.multiply(x, shared.w, name="y")
    total = tf.reduce_sum(y, name="total")
    scaled = tf.multiply(total, shared.lr, name="scaled")
    moved = tf.add(shared.offset, total, name="moved")
    _, index = tf.unique(x, name="uniq")
    step = tf.no_op(name="step")
    return SimpleNamespace(x=x, y=y, total=total, scaled=scaled, moved=moved, index=index, step=step)


class FakeSession:
    """What ParallaxSession wraps: runs a real session on the rewritten graph and records each call."""

    def __init__(self, graph):
        self.session = tf.compat.v1.Session(graph=graph)
        self.calls = []
        self.closed = False

    def run(self, fetches, feed_dict=None, options=None, run_metadata=None):
        self.calls.append(SimpleNamespace(fetches=fetches, feed_dict=feed_dict, options=options,
                                          run_metadata=run_metadata))
        return self.session.run(fetches, feed_dict=feed_dict, options=options, run_metadata=run_metadata)

    def close(self):
        self.closed = True
        self.session.close()


class FakeHeartbeat:
    def __init__(self):
        self.calls = []

    def set(self, state, where="", steps=None):
        self.calls.append(("set", state, where))

    def step_done(self):
        self.calls.append(("step_done",))


class Model:
    """The single-device graph, its hand-rewritten copy for ``replicas`` replicas, and a fake session on it."""

    def __init__(self, replicas):
        self.replicas = replicas
        self.single = tf.Graph()
        with self.single.as_default():
            self.shared = _shared_part()
            before = {op.name for op in self.single.get_operations()}
            self.ops = _replica_part(self.shared)
        self.replicated = frozenset(op.name for op in self.single.get_operations() if op.name not in before)
        self.rewritten = tf.Graph()
        with self.rewritten.as_default():
            shared = _shared_part()
            for r in range(replicas):
                if r == 0:
                    _replica_part(shared)
                else:
                    with self.rewritten.name_scope(f"{REPLICA_PREFIX}{r}"):
                        _replica_part(shared)
            init = tf.compat.v1.global_variables_initializer()
        # the hand-made copies are named as the rewriter names them
        names = {op.name for op in self.rewritten.get_operations()}
        assert {replica_op_name(n, r) for n in self.replicated for r in range(replicas)} <= names
        self.fake = FakeSession(self.rewritten)
        self.fake.session.run(init)

    def session(self, **kwargs):
        held = kwargs.pop("held_in_parts", None)
        translator = Translator(self.rewritten, self.single, self.replicated, self.replicas, held)
        return ParallaxSession(self.fake, SessionTranslation(translator, chief=kwargs.pop("chief", True)), **kwargs)

    def close(self):
        self.fake.session.close()


@pytest.fixture
def model():
    m = Model(REPLICAS)
    yield m
    m.close()


X = [[1.0, 2.0], [3.0, 4.0]]  # one batch per replica


# --------------------------------------------------------------------------- fetches
@pytest.mark.parametrize("fetch, expected", [
    (lambda m: m.ops.y, [[2.0, 4.0], [6.0, 8.0]]),
    (lambda m: "y:0", [[2.0, 4.0], [6.0, 8.0]]),
    (lambda m: m.ops.total, [6.0, 14.0]),
    (lambda m: "uniq:1", [[0, 1], [0, 1]]),
    (lambda m: m.ops.y.op, [None, None]),
    (lambda m: "y", [None, None]),
    (lambda m: m.ops.step, [None, None]),
], ids=["tensor", "tensor-name", "reduced-tensor", "second-output-name", "op", "op-name", "no-op"])
def test_a_fetch_comes_back_as_one_value_per_replica(model, fetch, expected):
    values = model.session().run(fetch(model), {model.ops.x: X})
    assert isinstance(values, list) and len(values) == REPLICAS
    for value, want in zip(values, expected):
        if want is None:
            assert value is None
        else:
            np.testing.assert_allclose(value, want)


def test_a_fetch_asks_the_session_for_each_replicas_copy(model):
    model.session().run("y:0", {"x": X})
    assert [t.name for t in model.fake.calls[-1].fetches] == ["y:0", f"{REPLICA_PREFIX}1/y:0"]


def test_nested_fetches_keep_their_structure_with_a_list_per_leaf(model):
    fetches = {"list": [model.ops.total, "y"], "tuple": (model.ops.total,), "pair": Pair(model.ops.y, "total:0"),
               "nested": [{"deep": (model.ops.total,)}]}
    out = model.session().run(fetches, {model.ops.x: X})
    assert type(out) is dict and set(out) == set(fetches)
    assert type(out["list"]) is list and out["list"][1] == [None, None]
    np.testing.assert_allclose(out["list"][0], [6.0, 14.0])
    assert type(out["tuple"]) is tuple and len(out["tuple"]) == 1
    assert type(out["pair"]) is Pair
    np.testing.assert_allclose(out["pair"].out, [[2.0, 4.0], [6.0, 8.0]])
    np.testing.assert_allclose(out["pair"].total, [6.0, 14.0])
    np.testing.assert_allclose(out["nested"][0]["deep"][0], [6.0, 14.0])


def test_a_tensor_fetched_twice_is_run_once(model):
    out = model.session().run([model.ops.total, "total:0", model.ops.total], {model.ops.x: X})
    assert len(model.fake.calls[-1].fetches) == REPLICAS
    for value in out:
        np.testing.assert_allclose(value, [6.0, 14.0])


@pytest.mark.parametrize("fetch, expected", [
    (lambda m: m.shared.w, 2.0),
    (lambda m: "w:0", 2.0),
    (lambda m: m.shared.v, 3.0),
    (lambda m: m.shared.update, 1.0),
    (lambda m: "sync", None),
], ids=["constant", "constant-name", "variable", "tensor-of-a-shared-placeholder", "shared-op"])
def test_a_shared_fetch_is_run_once_and_repeated_per_replica(model, fetch, expected):
    values = model.session().run(fetch(model), {model.shared.lr: 0.5})
    assert values == [expected] * REPLICAS
    assert len(model.fake.calls[-1].fetches) == 1


def test_an_element_of_the_rewritten_graph_is_taken_as_it_is(model):
    tensor = model.rewritten.get_tensor_by_name(f"{REPLICA_PREFIX}1/total:0")
    values = model.session().run(tensor, {model.ops.x: X})
    np.testing.assert_allclose(values, [14.0, 14.0])


@pytest.mark.parametrize("replicas", [1, 3])
def test_other_replica_counts_get_a_value_each(replicas):
    m = Model(replicas)
    try:
        batches = [[float(r), 1.0] for r in range(replicas)]
        values = m.session().run(m.ops.total, {m.ops.x: batches})
        np.testing.assert_allclose(values, [2.0 * (r + 1) for r in range(replicas)])
    finally:
        m.close()


# --------------------------------------------------------------------------- feeds
@pytest.mark.parametrize("key", [lambda m: m.ops.x, lambda m: "x:0", lambda m: "x", lambda m: m.ops.x.op],
                         ids=["tensor", "tensor-name", "op-name", "op"])
@pytest.mark.parametrize("value", [X, tuple(X), np.array(X), [np.array(b) for b in X]],
                         ids=["list", "tuple", "ndarray-replicas-first", "list-of-ndarrays"])
def test_a_replicated_placeholder_takes_one_value_per_replica(model, key, value):
    values = model.session().run(model.ops.total, {key(model): value})
    np.testing.assert_allclose(values, [6.0, 14.0])


@pytest.mark.parametrize("lr", [0.5, np.float32(0.5), np.array(0.5), [0.5, 0.5], np.array([0.5, 0.5])],
                         ids=["float", "numpy-scalar", "0d-ndarray", "equal-list", "equal-ndarray"])
def test_a_shared_placeholder_takes_a_plain_value_or_equal_values_per_replica(model, lr):
    values = model.session().run(model.ops.scaled, {model.ops.x: X, "lr": lr})
    np.testing.assert_allclose(values, [3.0, 7.0])
    fed = model.fake.calls[-1].feed_dict
    assert np.ndim(fed[model.rewritten.get_tensor_by_name("lr:0")]) == 0


def test_a_shared_placeholder_of_rank_one_takes_a_vector_as_long_as_the_replica_count_whole(model):
    values = model.session().run(model.ops.moved, {model.ops.x: X, model.shared.offset: [10.0, 20.0]})
    np.testing.assert_allclose(values, [[16.0, 26.0], [24.0, 34.0]])


@pytest.mark.parametrize("feeds, pattern", [
    (lambda m: {m.ops.x: [[1.0]]}, r"^feed for 'x:0' must be a list \(or an ndarray whose first axis is the replicas\) "
                                   r"with one value per replica \(2 replicas on this worker\), got a list of 1$"),
    (lambda m: {"x": [[1.0]] * 3}, r"^feed for 'x:0' .*, got a list of 3$"),
    (lambda m: {"x:0": np.zeros((3, 2))}, r"^feed for 'x:0' .*, got an ndarray of shape \(3, 2\)$"),
    (lambda m: {"x": np.zeros(2)}, r"^feed for 'x:0' .*, got an ndarray of shape \(2,\)$"),
    (lambda m: {"x": 1.0}, r"^feed for 'x:0' .*, got float$"),
    (lambda m: {m.ops.x: X, "lr": [0.1, 0.2]},
     r"^'lr:0' is shared by all replicas \(it feeds the update, not one replica's computation\), so its "
     r"per-replica values must be equal$"),
    (lambda m: {m.ops.x: X, "nope": 1.0}, r"^feed key 'nope:0' is not in the single-device graph$"),
], ids=["list-too-short", "list-too-long", "ndarray-wrong-first-axis", "vector-for-a-vector-per-replica",
        "scalar-for-a-replicated-placeholder", "unequal-shared-values", "unknown-name"])
def test_a_bad_feed_raises_a_value_error_naming_it(model, feeds, pattern):
    with pytest.raises(ValueError, match=pattern):
        model.session().run(model.ops.total, feeds(model))
    assert model.fake.calls == []


@pytest.mark.parametrize("fetch, pattern", [
    (lambda m: "nope", r"^fetch 'nope' is not in the single-device graph$"),
    (lambda m: "y:3", r"^fetch 'y:3' is not in the single-device graph$"),
    (lambda m: ["total", {"a": "nope:0"}], r"^fetch 'nope:0' is not in the single-device graph$"),
], ids=["unknown-op", "unknown-output", "nested"])
def test_a_fetch_name_not_in_the_graph_raises_a_value_error_naming_it(model, fetch, pattern):
    with pytest.raises(ValueError, match=pattern):
        model.session().run(fetch(model), {model.ops.x: X})
    assert model.fake.calls == []


def test_an_object_of_another_graph_raises_a_value_error(model):
    other = tf.Graph()
    with other.as_default():
        _replica_part(_shared_part())
    y, x = other.get_tensor_by_name("y:0"), other.get_tensor_by_name("x:0")
    with pytest.raises(ValueError, match=r"^fetch 'y:0' belongs to another graph than the one given to "
                                         r"parallel_run\(\)$"):
        model.session().run(y, {model.ops.x: X})
    with pytest.raises(ValueError, match=r"^feed key 'x:0' belongs to another graph"):
        model.session().run(model.ops.y, {x: X})
    with pytest.raises(ValueError, match=r"^fetch 'y' belongs to another graph"):
        model.session().run(y.op, {model.ops.x: X})


@pytest.mark.parametrize("fetch, feeds, pattern", [
    (3, {}, r"^fetch must be an op, a tensor or a name of the single-device graph, got int: 3$"),
    (None, {}, r"^fetch must be .*, got NoneType: None$"),
    ([b"y:0"], {}, r"^fetch must be .*, got bytes: b'y:0'$"),
    ("y:0", {2.5: X}, r"^feed key must be an op, a tensor or a name of the single-device graph, got float: 2.5$"),
], ids=["int-fetch", "none-fetch", "bytes-fetch", "float-feed-key"])
def test_a_fetch_or_feed_key_of_another_type_raises_a_type_error(model, fetch, feeds, pattern):
    with pytest.raises(TypeError, match=pattern):
        model.session().run(fetch, feeds)


@pytest.mark.parametrize("batches", [[[1.0, 2.0, 3.0], [4.0]], [np.array([1.0, 2.0, 3.0]), np.array([4.0])]],
                         ids=["lists", "ndarrays"])
def test_replicas_may_be_fed_batches_of_different_lengths(model, batches):
    values = model.session().run(model.ops.total, {model.ops.x: batches})
    np.testing.assert_allclose(values, [12.0, 8.0])


def test_a_defaultdict_of_fetches_works_as_in_tensorflow(model):
    fetches = collections.defaultdict(list, {"total": model.ops.total})
    out = model.session().run(fetches, {model.ops.x: X})
    assert type(out) is collections.defaultdict
    np.testing.assert_allclose(out["total"], [6.0, 14.0])


# --------------------------------------------------------------------------- make_callable, partial_run
def test_make_callable_runs_the_fetches_with_one_argument_per_feed(model):
    call = model.session().make_callable([model.ops.scaled, "w:0"], feed_list=[model.ops.x, "lr"])
    scaled, w = call(X, 0.5)
    np.testing.assert_allclose(scaled, [3.0, 7.0])
    assert w == [2.0, 2.0]
    with pytest.raises(TypeError, match=r"^this callable takes 2 feed values \(one per feed_list entry\), got 1$"):
        call(X)
    with pytest.raises(TypeError, match=r"^options and run_metadata need make_callable\(\.\.\., "
                                        r"accept_options=True\)$"):
        call(X, 0.5, options=tf.compat.v1.RunOptions())


def test_make_callable_without_feeds(model):
    assert model.session().make_callable("w:0")() == [2.0, 2.0]


def test_make_callable_passes_options_and_run_metadata_through_when_accepted(model):
    call = model.session().make_callable(model.ops.total, [model.ops.x], accept_options=True)
    options = tf.compat.v1.RunOptions(trace_level=tf.compat.v1.RunOptions.FULL_TRACE)
    metadata = tf.compat.v1.RunMetadata()
    np.testing.assert_allclose(call(X, options=options, run_metadata=metadata), [6.0, 14.0])
    assert model.fake.calls[-1].options is options and model.fake.calls[-1].run_metadata is metadata
    assert metadata.HasField("step_stats")


@pytest.mark.parametrize("fetches, feed_list, pattern", [
    ("nope", [], r"^fetch 'nope' is not in the single-device graph$"),
    ("y:0", ["nope"], r"^feed key 'nope:0' is not in the single-device graph$"),
    ("y:0", ["x:4"], r"^feed key 'x:4' is not in the single-device graph$"),
], ids=["fetch", "feed-op-name", "feed-tensor-name"])
def test_make_callable_checks_names_when_made(model, fetches, feed_list, pattern):
    with pytest.raises(ValueError, match=pattern):
        model.session().make_callable(fetches, feed_list)
    assert model.fake.calls == []


@pytest.mark.parametrize("method", ["partial_run", "partial_run_setup"])
def test_partial_run_is_not_supported(model, method):
    with pytest.raises(NotImplementedError, match=r"^ParallaxSession does not support partial_run: every worker "
                                                  r"must run whole steps together"):
        getattr(model.session(), method)(["y:0"], ["x:0"])


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


# --------------------------------------------------------------------------- remembered mappings
def test_fetches_and_feeds_mapped_once_give_the_same_results_as_the_first_time(model):
    """The wrapper remembers how a fetch structure and a feed key map; a later run of the same (or an
    equal, rebuilt) structure gets the same values, and a different one is mapped afresh."""
    sess = model.session()
    first = sess.run([model.ops.y, {"t": model.ops.total}], {model.ops.x: X})
    for _ in range(2):  # a new list and dict each time, as a training loop builds them
        again = sess.run([model.ops.y, {"t": model.ops.total}], {model.ops.x: X})
        np.testing.assert_allclose(again[0], first[0])
        np.testing.assert_allclose(again[1]["t"], first[1]["t"])
    other = sess.run(("y:0", model.ops.total), {"x:0": [[0.0, 1.0], [2.0, 3.0]]})
    assert isinstance(other, tuple)
    np.testing.assert_allclose(other[0], [[0.0, 2.0], [4.0, 6.0]])
    with pytest.raises(ValueError, match="must be a list"):  # a remembered key still checks each value
        sess.run(model.ops.y, {model.ops.x: [[1.0, 2.0]]})
    with pytest.raises(ValueError, match="not in the single-device graph"):  # an unknown name is never remembered
        sess.run("nope:0")
    with pytest.raises(ValueError, match="not in the single-device graph"):
        sess.run(["nope:0"])


def test_a_slot_held_in_parts_is_refused_by_name_saying_why():
    model = Model(REPLICAS)
    try:
        sess = model.session(held_in_parts={"v": "zero_stage=1 keeps this optimizer slot in parts"})
        for fetch in ("v", "v:0", "v/read:0", model.shared.v):
            with pytest.raises(ValueError, match=r"fetch 'v.*': zero_stage=1 keeps this optimizer slot in parts"):
                sess.run(fetch)
        assert sess.run("w:0") == [2.0, 2.0]
    finally:
        model.close()


# --------------------------------------------------------------------------- the PS writes barrier
@pytest.mark.parametrize("chief", [True, False], ids=["chief-releases-after", "other-waits-before"])
def test_a_run_that_writes_a_server_variable_outside_a_step_takes_the_writes_barrier(model, chief):
    from parallax.session import WritesBarrier

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
    from parallax.session import WritesBarrier

    barrier = WritesBarrier(frozenset({"update"}), frozenset({"step"}), "sync", before=True,
                            unsynchronised=frozenset({"update"}))
    sess = model.session(writes=barrier)
    with pytest.raises(ValueError, match=r"^fetch 'update': it writes a variable on the parameter servers outside "
                                         r"the training step, which only the chief \(worker 0\) writes"):
        sess.run([model.shared.update.op, model.ops.step], {model.shared.lr: 0.5, model.ops.x: X})
    assert sess.run(model.shared.update, {model.shared.lr: 0.5}) == [1.0, 1.0]  # alone, after the barrier: exact
