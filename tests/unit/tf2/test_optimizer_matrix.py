"""Every Keras 3 optimizer, plain and inside a ``LossScaleOptimizer`` (tests/tf2/optimizer_matrix.py), traced in a
``tf.function`` step: Parallax's analysis finds each trainable variable's gradient where the tape made it, so the
replicas' gradients are aggregated before the loss scale's finite check and the update runs on them as on one
device (tests/multiprocess/test_tf2_optimizer_matrix.py trains them). What cannot be synchronised is refused with
the reason."""

from __future__ import annotations

import pytest
import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.errors import AnalysisError
from parallax.tf2.trace import trace_step
from tests.tf2.optimizer_matrix import CASES, MORE_CASES, REFUSED, build


@pytest.mark.parametrize("case", [*CASES, *MORE_CASES])
def test_the_analysis_takes_every_keras_3_optimizers_step(case):
    step, variables = build(case)
    analysis = analyse_graph(trace_step(step).graph)
    trainable = {v.name for v in analysis.variables if v.trainable}  # (Nadam's u_product too: written, untrained)
    assert len(analysis.gradients) == len(variables()) and {g.variable for g in analysis.gradients} <= trainable
    for g in analysis.gradients:
        # aggregated where the tape made them: before the optimizer passes them on together (IdentityN), and
        # before a loss scale's finite check and its cond
        assert all(t.startswith("gradient_tape/") for t in g.aggregation_tensors if t), g
    if case.startswith("lso-"):  # the finite check reads every gradient: one decision, on the aggregated ones
        names = {g.variable for g in analysis.gradients}
        for g in analysis.gradients:
            assert set(g.coupled_with) >= names - {g.variable}, g


@pytest.mark.parametrize("case", list(REFUSED))
def test_what_cannot_be_synchronised_is_refused_naming_the_reason(case):
    with pytest.raises(AnalysisError, match=REFUSED[case]):
        analyse_graph(trace_step(build(case)[0]).graph)


def test_a_step_whose_gradients_share_one_op_and_one_shape_is_still_read_gradient_by_gradient():
    """Keras 3 passes every gradient through one ``IdentityN`` (the default replica context's all-reduce): its
    output ``k`` is its input ``k``, so the two hidden layers' biases, of one shape, keep their own gradients
    (the mixed-precision guide's two ``Dense(64)`` layers were refused for this inside the loss scale's cond)."""
    step, _ = build("lso-rmsprop-centered-global-clipnorm")
    graph = trace_step(step).graph
    assert [op for op in graph.get_operations() if op.type == "IdentityN"]
    analysis = analyse_graph(graph)
    biases = [g for g in analysis.gradients if g.variable.endswith("bias") and
              tf.TensorShape(analysis.variable(g.variable).shape) == tf.TensorShape([4])]
    assert len(biases) == 2 and biases[0].aggregation_tensors != biases[1].aggregation_tensors


@pytest.mark.parametrize("case", ["lso-adam-ema", "lso-adam-accumulating", "lso-nadam"])
def test_on_parameter_servers_no_worker_reads_an_update_only_the_chief_runs(case):
    """Keras 3's moving averages of the weights (``use_ema``) read every variable through the loss scale's cond
    after its update: the cond's switch of the variable's handle is the variable's, not its update's, which on a
    parameter server only the chief runs (a worker reading it would wait for an op that never runs)."""
    from parallax.plan import TaskSpec
    from parallax.rewrite.pipeline import rewrite_for_task
    from tests.unit.rewrite.helpers import export
    from tests.unit.rewrite.test_ps_sync import ps_plan

    step, _ = build(case)
    model = type("Traced", (), {"graph": trace_step(step).graph})
    plan = ps_plan(model)
    assert all(v.server is not None for v in plan.variables if v.trainable)
    for worker in (0, 1):
        assert rewrite_for_task(export(model.graph), plan, TaskSpec(worker)).graph_def.node  # no RewriteError
