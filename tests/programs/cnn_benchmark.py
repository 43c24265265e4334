"""tf_cnn_benchmarks (benchmark_cnn.py) as the original Parallax's example runs it, rewritten small.

Synthetic images held in a local variable (every worker the same, as with
``--data_name=synthetic``), a conv layer with batch normalisation whose moving
statistics are updated through ``UPDATE_OPS``, a learning rate that is
piecewise constant in the global step, ``Momentum``'s ``apply_gradients``
without a global step, ``train_op = tf.group(apply, *update_ops)``, and the
program's own increment of the global step under that group's control
dependency: ``global_step.assign_add(1, use_locking=True)``, the tensor the
loop fetches (in a dict with the loss) every step. Ref (``use_resource=False``,
as TF1 made them) or resource variables.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf
from tensorflow.python.training import moving_averages

BATCH = 4
IMAGE = 5
CLASSES = 3


@dataclass
class Program:
    graph: tf.Graph
    loss: tf.Tensor
    inc_global_step: tf.Tensor
    global_step: tf.Variable
    images_init: tf.Operation


def _init(shape, seed):
    return tf.compat.v1.constant_initializer(np.random.RandomState(seed).uniform(-0.5, 0.5, shape))


def _batch_norm(x, resource: bool):
    channels = x.shape[-1]
    scale = tf.compat.v1.get_variable("gamma", [channels], initializer=tf.compat.v1.ones_initializer(),
                                      use_resource=resource)
    offset = tf.compat.v1.get_variable("beta", [channels], initializer=tf.compat.v1.zeros_initializer(),
                                       use_resource=resource)
    moving_mean = tf.compat.v1.get_variable("moving_mean", [channels], trainable=False, use_resource=resource,
                                            initializer=tf.compat.v1.zeros_initializer())
    moving_var = tf.compat.v1.get_variable("moving_variance", [channels], trainable=False, use_resource=resource,
                                           initializer=tf.compat.v1.ones_initializer())
    mean, variance = tf.nn.moments(x, [0, 1, 2])
    for update in (moving_averages.assign_moving_average(moving_mean, mean, 0.9),
                   moving_averages.assign_moving_average(moving_var, variance, 0.9)):
        tf.compat.v1.add_to_collection(tf.compat.v1.GraphKeys.UPDATE_OPS, update)
    return tf.nn.batch_normalization(x, mean, variance, offset, scale, 1e-3)


def build(resource: bool = False) -> Program:
    graph = tf.Graph()
    with graph.as_default():
        global_step = tf.compat.v1.get_variable(
            "global_step", [], tf.int64, tf.compat.v1.zeros_initializer(), trainable=False, use_resource=resource,
            collections=[tf.compat.v1.GraphKeys.GLOBAL_VARIABLES, tf.compat.v1.GraphKeys.GLOBAL_STEP])
        rng = np.random.RandomState(3)
        images = tf.compat.v1.get_variable(
            "gpu_cached_images", [BATCH, IMAGE, IMAGE, 3], trainable=False, use_resource=resource,
            initializer=tf.compat.v1.constant_initializer(rng.uniform(0, 1, (BATCH, IMAGE, IMAGE, 3))),
            collections=[tf.compat.v1.GraphKeys.LOCAL_VARIABLES])
        labels = tf.constant(rng.randint(0, CLASSES, BATCH), tf.int32, name="gpu_cached_labels")
        with tf.compat.v1.variable_scope("cg/conv0"):
            kernel = tf.compat.v1.get_variable("conv2d/kernel", [3, 3, 3, 4], initializer=_init([3, 3, 3, 4], 1),
                                               use_resource=resource)
            conv = tf.nn.conv2d(tf.convert_to_tensor(images), kernel, [1, 1, 1, 1], "SAME")
            with tf.compat.v1.variable_scope("batchnorm0"):
                h = tf.nn.relu(_batch_norm(conv, resource))
        with tf.compat.v1.variable_scope("cg/affine0"):
            flat = tf.reshape(h, [BATCH, -1])
            w = tf.compat.v1.get_variable("weights", [IMAGE * IMAGE * 4, CLASSES],
                                          initializer=_init([IMAGE * IMAGE * 4, CLASSES], 2), use_resource=resource)
            b = tf.compat.v1.get_variable("biases", [CLASSES], initializer=tf.compat.v1.zeros_initializer(),
                                          use_resource=resource)
            logits = tf.matmul(flat, w) + b
        loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits),
                              name="xentropy_mean")
        lr = tf.compat.v1.train.piecewise_constant(global_step, [2], [0.1, 0.05])
        opt = tf.compat.v1.train.MomentumOptimizer(lr, 0.9, use_nesterov=True)
        grads = opt.compute_gradients(loss)
        apply_op = opt.apply_gradients(grads)
        update_ops = tf.compat.v1.get_collection(tf.compat.v1.GraphKeys.UPDATE_OPS)
        train_op = tf.group(apply_op, *update_ops, name="train_ops_group")
        with tf.compat.v1.name_scope("inc_global_step"), tf.control_dependencies([train_op]):
            inc_global_step = global_step.assign_add(1, use_locking=True)
        images_init = tf.compat.v1.local_variables_initializer()
    return Program(graph, loss, inc_global_step, global_step, images_init)


def train(sess, program: Program, steps: int) -> list[dict]:
    """The benchmark's loop: each step fetches the increment (the training op) and the loss."""
    return [sess.run({"global_step": program.inc_global_step, "loss": program.loss}) for _ in range(steps)]


def single_device(resource: bool, steps: int) -> tuple[list[dict], dict[str, np.ndarray]]:
    program = build(resource)
    with program.graph.as_default(), tf.compat.v1.Session() as sess:
        sess.run([tf.compat.v1.global_variables_initializer(), program.images_init])
        fetched = train(sess, program, steps)
        variables = tf.compat.v1.global_variables()
        values = dict(zip([v.op.name for v in variables], sess.run(variables)))
    return fetched, values
