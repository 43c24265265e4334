"""parallax.tf2.summed: the metrics a step updates, summed over the workers into the program's variables."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import tensorflow as tf

from parallax.tf2.summed import SummedState


class _Twice:
    """A group of two workers whose other worker added as much as this one: a sum doubles."""

    size, index = 2, 0

    def __init__(self) -> None:
        self.calls: list[np.ndarray] = []

    def sum(self, values: np.ndarray) -> np.ndarray:
        self.calls.append(values.copy())
        return 2 * values


def _state(group):
    """A summed state over a metric's two variables (``total``, ``count``), with the job's copies in ``job``."""
    graph = tf.Graph()
    with graph.as_default():
        for name in ("total", "count"):
            tf.compat.v1.get_variable(name, shape=[], use_resource=True)
    eager = {n: SimpleNamespace(summed=True, variable=tf.Variable(0.0), dtype=tf.float32) for n in ("total", "count")}
    job = {"total": np.float32(0), "count": np.float32(0)}
    session = SimpleNamespace(group=group, num_replicas=2, on_server=lambda name: False,
                              read=lambda variables: [job[v.op.name] for v in variables])
    return SummedState(session, eager, graph), eager, job


def _values(eager) -> dict:
    return {n: float(v.variable.numpy()) for n, v in eager.items()}


def test_each_step_is_summed_over_the_workers_into_the_programs_variables():
    group = _Twice()
    state, eager, job = _state(group)
    job.update(total=np.float32(3), count=np.float32(2))
    state.after_step([])
    assert _values(eager) == {"total": 6.0, "count": 4.0} and len(group.calls) == 1


def test_deferred_steps_are_kept_here_and_summed_in_one_call_with_the_flags():
    group = _Twice()
    state, eager, job = _state(group)
    state.defer()
    for step in range(1, 4):
        job.update(total=np.float32(3 * step), count=np.float32(2 * step))
        state.after_step([])
    assert group.calls == [] and _values(eager) == {"total": 0.0, "count": 0.0}
    eager["count"].variable.assign(1.0)  # the program wrote its variable between steps: the sums add to it
    flags = state.flush((1.0,))
    assert _values(eager) == {"total": 18.0, "count": 13.0}
    assert list(flags) == [2.0] and len(group.calls) == 1
    assert list(state.flush()) == [] and _values(eager) == {"total": 18.0, "count": 13.0}  # nothing new to add


def test_a_metric_state_the_step_writes_other_than_by_adding_is_named():
    """A running maximum and the last batch's value are not sums: a sum of the replicas' additions is not one
    device's state (Keras's own metrics, which add, are not named)."""
    import keras

    from parallax.tf2.summed import not_added
    from parallax.tf2.trace import trace_step

    class Largest(keras.metrics.Metric):
        def __init__(self, **kwargs):
            super().__init__(**kwargs)
            self.largest = self.add_variable(shape=(), initializer="zeros", name="largest")

        def update_state(self, values):
            self.largest.assign(keras.ops.maximum(self.largest, keras.ops.max(values)))

        def result(self):
            return self.largest + 0.0

    class Last(Largest):
        def update_state(self, values):
            self.largest.assign(keras.ops.mean(values))

    metrics = [keras.metrics.Mean(name="mean"), keras.metrics.AUC(name="auc"), Largest(name="max"), Last(name="last")]

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float32)])
    def step(values):
        for metric in metrics[2:] + metrics[:1]:
            metric.update_state(values)
        metrics[1].update_state(values > 0.5, values)
        return tf.constant(0.0)

    traced = trace_step(step)
    summed = sorted(n for n, v in traced.variables.items() if v.summed)
    assert len(summed) == 8
    assert not_added(traced.graph, summed) == {"max/largest": "Maximum", "last/largest": "Mean"}

