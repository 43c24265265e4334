"""A TF1 program whose input is a queue (the CIFAR-10 tutorial's ``slice_input_producer`` + ``batch``, filled by
queue runners), trained by two in-graph replicas in one process: both replicas' dequeues take the next batch
from the one queue, so one step trains the two batches one device takes as a batch of twice the size."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.runtime.hooks import run_past_hooks
from tests.conftest import cpu_resources
from tests.programs import cifar10

STEPS, BATCH = 4, 4  # per replica; one device takes 2 * BATCH


def final_values(program, sess) -> dict[str, np.ndarray]:
    variables = program.graph.get_collection(tf.compat.v1.GraphKeys.GLOBAL_VARIABLES)
    reads = [v._as_graph_element().name for v in variables]  # a resource variable's value, by name
    return dict(zip([v.op.name for v in variables], run_past_hooks(sess, reads)))


@pytest.mark.slow
def test_two_replicas_fed_by_one_queue_train_as_one_device_on_both_batches(resource_file):
    reference = cifar10.build("queue", batch=2 * BATCH, steps=STEPS)
    with reference.graph.as_default(), tf.compat.v1.train.MonitoredSession(hooks=reference.hooks) as sess:
        assert cifar10.train(sess, reference) == STEPS
        expected = final_values(reference, sess)

    program = cifar10.build("queue", batch=BATCH, steps=STEPS)
    config = parallax.Config(run_option="PS", hooks=program.hooks)
    with program.graph.as_default():
        sess, _, _, num_replicas = parallax.parallel_run(program.graph, cpu_resources(resource_file, 2),
                                                         parallax_config=config)
        assert num_replicas == 2
        assert cifar10.train(sess, program) == STEPS  # no replica waits on a queue nothing fills
        got = final_values(program, sess.raw_session)
        sess.close()
    # the moving averages of the losses are replica 0's (a write of a shared variable from one replica's data)
    compared = [name for name in expected if not name.endswith("/avg")]
    assert "global_step" in compared and len(compared) > 10
    for name in compared:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6, err_msg=name)
