"""parallax.tf2.evaluate: the metrics a worker updates on the host, summed over the workers."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest
import tensorflow as tf

from parallax.tf2.evaluate import HostSums


class _Pair:
    """Two workers, the other of which added ``other`` since each sum (this one is worker 0)."""

    size, index = 2, 0

    def __init__(self, other: float, shapes: list | None = None) -> None:
        self.other, self.shapes, self.calls = other, shapes, 0

    def sum(self, values: np.ndarray) -> np.ndarray:
        self.calls += 1
        return values + self.other

    def gather(self, value):
        return [value, value if self.shapes is None else self.shapes]


def _model(*metrics):
    return SimpleNamespace(metrics=[SimpleNamespace(variables=list(vs)) for vs in metrics])


def test_each_sum_adds_what_every_worker_added_since_the_last():
    total, count = tf.Variable(0.0), tf.Variable(0.0)
    group = _Pair(other=1.0)
    sums = HostSums(_model([total, count]), group)
    total.assign_add(3.0), count.assign_add(2.0)  # this worker's first batches
    assert list(sums.flush((1.0,))) == [2.0]  # the flags, summed along
    assert (total.numpy(), count.numpy()) == (4.0, 3.0)  # 3 + 1, 2 + 1
    total.assign_add(5.0)
    sums.flush()
    assert (total.numpy(), count.numpy()) == (10.0, 4.0)  # the other added 1 to each again; this worker 5 and 0
    total.assign(0.0), count.assign(0.0)  # an epoch's reset
    sums.restart()
    sums.flush()
    assert (total.numpy(), count.numpy()) == (1.0, 1.0)


def test_a_metric_built_at_its_first_update_started_at_zero():
    model = _model()
    sums = HostSums(model, _Pair(other=0.5))
    late = tf.Variable(2.0)  # tf_keras builds its compiled metrics when they are first updated
    model.metrics.append(SimpleNamespace(variables=[late]))
    sums.flush()
    assert late.numpy() == 2.5


def test_workers_with_other_metrics_are_refused():
    sums = HostSums(_model([tf.Variable(0.0)]), _Pair(other=0.0, shapes=[(), ()]))
    with pytest.raises(ValueError, match="the workers' models keep different metrics"):
        sums.flush()
