"""ParallaxSession's translation of single-device names, over a real TensorFlow session: fetches, feeds,
make_callable and the mappings the wrapper remembers.

The model, its hand-"rewritten" graph and the fake session are in tests/unit/runtime/session_fakes.py; what a
run does around the step (after a step, the PS writes barrier, heartbeat, profiler, closing) is tested
in tests/unit/runtime/test_session_lifecycle.py.
"""

from __future__ import annotations

import collections

import numpy as np
import pytest
import tensorflow as tf

from parallax.graph.names import REPLICA_PREFIX
from tests.unit.runtime import session_fakes
from tests.unit.runtime.session_fakes import REPLICAS, Model, X, _replica_part, _shared_part

model = session_fakes.model  # the shared fixture, bound by name (imported by name, each test taking it is F811)

Pair = collections.namedtuple("Pair", "out total")


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

