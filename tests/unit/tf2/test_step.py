"""parallax.tf2.step: what a custom loop's step says of the parts it is given."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np


def test_parts_of_other_sizes_than_the_first_steps_are_told_once(parallax_warnings):
    """A custom loop's global batch cut into parts of other sizes (the last of an epoch, ``np.array_split``): the
    replicas' gradients are averaged with equal weights, said at WARNING once; ``parallax.fit`` weighs its parts."""
    from parallax.tf2.step import DistributedStep

    class Placeholder:
        def __init__(self, rank):
            self.shape = SimpleNamespace(rank=rank)

    step = object.__new__(DistributedStep)
    step._part, step._parts_told = None, False
    batch = Placeholder(2)
    step._check_parts({Placeholder(None): [1.0], batch: [np.zeros((32, 2))]})
    assert not step._parts_told and step._part == 32
    step._check_parts({batch: [np.zeros((21, 2))]})
    assert step._parts_told
    assert "parts of a batch have 21 examples where the first step's had 32" in parallax_warnings[0]


def _synced(rate):
    """A step whose job holds a learning rate of 0.1 (and nothing else), over the program's ``rate``."""
    import tensorflow as tf

    from parallax.tf2.host_edits import HostWatch
    from parallax.tf2.step import DistributedStep

    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.get_variable("lr", shape=[], use_resource=True)
    step = object.__new__(DistributedStep)
    step._chief, step._summed = True, SimpleNamespace(names=[])
    step._session = SimpleNamespace(held_in_parts={}, group=None, read=lambda variables: [np.float32(0.1)])
    step._traced = SimpleNamespace(graph=graph, variables={
        "lr": SimpleNamespace(name="adam/learning_rate", write=rate.assign, variable=rate)})
    step._host = HostWatch({"lr": rate.numpy}, {"lr": np.float32(0.1)})
    return step


def test_what_a_loop_assigned_between_steps_is_named_where_the_jobs_values_are_written_over_it(parallax_warnings):
    import tensorflow as tf

    rate = tf.Variable(0.1)
    step = _synced(rate)
    step.sync_variables()
    assert parallax_warnings == []
    rate.assign(0.05)  # optimizer.learning_rate.assign(...) between steps: the job never sees it
    step.sync_variables()
    assert "the program changed adam/learning_rate while the job trained" in parallax_warnings[0]
    assert float(rate.numpy()) == np.float32(0.1)  # the job's value
    step.sync_variables()
    assert len(parallax_warnings) == 1


def test_a_variable_fed_to_the_job_is_not_named():
    import tensorflow as tf

    rate = tf.Variable(0.1)
    step = _synced(rate)
    step.unwatch(rate)  # parallax.fit feeds the rate a callback set to every step
    rate.assign(0.05)
    assert step.host.changed() == []
