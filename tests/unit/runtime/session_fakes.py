"""The fakes tests/unit/runtime/test_session.py and tests/unit/runtime/test_session_lifecycle.py share: a single-device
graph, its hand-"rewritten" copy, and a fake session on it for ParallaxSession to wrap.

The "rewritten" graph is built by hand: the per-replica part of the model once
at the root (replica 0 keeps the original names) and once under
``parallax_replica_<r>/`` for each further replica, as
:func:`parallax.graph.names.replica_op_name` names the copies; the shared
part (a constant, a variable, a learning-rate placeholder, an update op) once.
The ``model`` fixture is bound by name in the test files that use it (``model = session_fakes.model``).
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import tensorflow as tf

from parallax.graph.names import REPLICA_PREFIX, replica_op_name
from parallax.runtime.hooks import SessionTranslation
from parallax.runtime.session import ParallaxSession
from parallax.runtime.translate import Translator

REPLICAS = 2


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
