"""TensorFlow's CIFAR-10 tutorial (cifar10.py, cifar10_train.py), rewritten small.

Images are 6x6x3 and the nets narrow; the structure is the tutorial's: inputs
from a queue (``slice_input_producer`` + ``batch``, one thread, in order) or a
``tf.data`` iterator, conv/pool/lrn layers, two fully connected layers with
weight decay added to the ``losses`` collection, a moving average of the losses
applied before the gradients are computed, ``exponential_decay`` of the learning
rate by the global step, ``apply_gradients(global_step=...)`` and an EMA of the
trainable variables under the update's control dependency. Hooks as
``cifar10_train.py`` writes them. Every worker reads the same batches (the queue
is in the graph): the reference is one device on those batches.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import tensorflow as tf

IMAGE = 6
CLASSES = 3
EXAMPLES = 48


def data() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.RandomState(7)
    return rng.uniform(0, 1, (EXAMPLES, IMAGE, IMAGE, 3)).astype(np.float32), rng.randint(0, CLASSES, EXAMPLES)


@dataclass
class Program:
    graph: tf.Graph
    loss: tf.Tensor
    train_op: tf.Operation
    global_step: tf.Variable
    logger: LoggerHook
    hooks: list


class LoggerHook(tf.compat.v1.train.SessionRunHook):
    """cifar10_train.py's ``_LoggerHook``: asks for the loss tensor itself, formats it as a number."""

    def __init__(self, loss: tf.Tensor) -> None:
        self.loss = loss
        self.lines: list[str] = []
        self.runs = 0

    def begin(self) -> None:
        self.step = -1

    def before_run(self, run_context):
        self.step += 1
        return tf.compat.v1.train.SessionRunArgs(self.loss)  # asks for loss value

    def after_run(self, run_context, run_values):
        self.runs += 1
        self.lines.append("step %d, loss = %.6f" % (self.step, run_values.results))  # noqa: UP031 - as the tutorial


def _variable_with_weight_decay(name, shape, stddev, wd, seed):
    var = tf.compat.v1.get_variable(name, shape, initializer=tf.compat.v1.truncated_normal_initializer(
        stddev=stddev, seed=seed))
    if wd is not None:
        tf.compat.v1.add_to_collection("losses", tf.multiply(tf.nn.l2_loss(var), wd, name="weight_loss"))
    return var


def _inputs(source: str, batch: int):
    images, labels = data()
    if source == "dataset":
        ds = tf.data.Dataset.from_tensor_slices((images, labels.astype(np.int32))).repeat().batch(batch)
        return tf.compat.v1.data.make_one_shot_iterator(ds).get_next()
    image, label = tf.compat.v1.train.slice_input_producer([tf.constant(images), tf.constant(labels, tf.int32)],
                                                           shuffle=False)
    return tf.compat.v1.train.batch([image, label], batch_size=batch, num_threads=1, capacity=4 * batch)


def inference(images):
    with tf.compat.v1.variable_scope("conv1"):
        kernel = _variable_with_weight_decay("weights", [3, 3, 3, 4], 5e-2, None, 1)
        biases = tf.compat.v1.get_variable("biases", [4], initializer=tf.compat.v1.constant_initializer(0.0))
        conv1 = tf.nn.relu(tf.nn.bias_add(tf.nn.conv2d(images, kernel, [1, 1, 1, 1], "SAME"), biases))
    pool1 = tf.nn.max_pool2d(conv1, ksize=[1, 3, 3, 1], strides=[1, 2, 2, 1], padding="SAME", name="pool1")
    norm1 = tf.nn.lrn(pool1, 4, bias=1.0, alpha=0.001 / 9.0, beta=0.75, name="norm1")
    with tf.compat.v1.variable_scope("local3"):
        flat = tf.reshape(norm1, [tf.shape(images)[0], -1])
        weights = _variable_with_weight_decay("weights", [3 * 3 * 4, 8], 0.04, 0.004, 2)
        biases = tf.compat.v1.get_variable("biases", [8], initializer=tf.compat.v1.constant_initializer(0.1))
        local3 = tf.nn.relu(tf.matmul(flat, weights) + biases)
    with tf.compat.v1.variable_scope("softmax_linear"):
        weights = _variable_with_weight_decay("weights", [8, CLASSES], 1 / 8.0, None, 3)
        biases = tf.compat.v1.get_variable("biases", [CLASSES], initializer=tf.compat.v1.constant_initializer(0.0))
        return tf.add(tf.matmul(local3, weights), biases, name="softmax_linear")


def total_loss(logits, labels):
    cross_entropy = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits)
    tf.compat.v1.add_to_collection("losses", tf.reduce_mean(cross_entropy, name="cross_entropy"))
    return tf.add_n(tf.compat.v1.get_collection("losses"), name="total_loss")


def train_op_of(loss, global_step):
    lr = tf.compat.v1.train.exponential_decay(0.1, global_step, 3, 0.5, staircase=True)
    loss_averages = tf.compat.v1.train.ExponentialMovingAverage(0.9, name="avg")
    losses = tf.compat.v1.get_collection("losses")
    loss_averages_op = loss_averages.apply(losses + [loss])
    with tf.control_dependencies([loss_averages_op]):
        opt = tf.compat.v1.train.GradientDescentOptimizer(lr)
        grads = opt.compute_gradients(loss)
    apply_gradient_op = opt.apply_gradients(grads, global_step=global_step)
    variable_averages = tf.compat.v1.train.ExponentialMovingAverage(0.999, global_step)
    with tf.control_dependencies([apply_gradient_op]):
        return variable_averages.apply(tf.compat.v1.trainable_variables())


def build(source: str = "queue", batch: int = 4, steps: int = 6) -> Program:
    graph = tf.Graph()
    with graph.as_default():
        global_step = tf.compat.v1.train.get_or_create_global_step()
        with tf.device("/cpu:0"):
            images, labels = _inputs(source, batch)
        loss = total_loss(inference(images), labels)
        train_op = train_op_of(loss, global_step)
        logger = LoggerHook(loss)
        hooks = [tf.compat.v1.train.StopAtStepHook(last_step=steps), tf.compat.v1.train.NanTensorHook(loss), logger]
    return Program(graph, loss, train_op, global_step, logger, hooks)


def train(sess, program: Program) -> int:
    """cifar10_train.py's loop; returns the number of steps run."""
    runs = 0
    while not sess.should_stop():
        sess.run(program.train_op)
        runs += 1
    return runs


def single_device(source: str = "queue", steps: int = 6) -> tuple[Program, dict[str, np.ndarray]]:
    """The tutorial on one device: a ``MonitoredSession`` with the program's hooks."""
    from parallax.runtime.hooks import run_past_hooks

    program = build(source, steps=steps)
    with program.graph.as_default():
        with tf.compat.v1.train.MonitoredSession(hooks=program.hooks) as sess:
            train(sess, program)
            variables = tf.compat.v1.global_variables()
            values = dict(zip([v.op.name for v in variables], run_past_hooks(sess, variables)))
    return program, values
