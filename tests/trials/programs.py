"""Programs the trial tests run: a sweep's training function and small scripts a trial starts."""

from __future__ import annotations

import numpy as np
import tensorflow as tf

import parallax

STEPS = 8
BATCH = 4  # per replica


def batches(step: int, replicas: int) -> tuple[np.ndarray, np.ndarray]:
    """The step's union batch, the same whatever the devices: replica r takes rows r*BATCH..."""
    rng = np.random.default_rng(step)
    x = rng.standard_normal((replicas * BATCH, 3)).astype(np.float32)
    y = x @ np.array([[0.5], [-1.0], [2.0]], np.float32) + 0.3
    return x, y


def build(learning_rate: float) -> tuple[tf.Graph, dict]:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(1)
        x = tf.compat.v1.placeholder(tf.float32, [None, 3], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        w = tf.compat.v1.get_variable("w", [3, 1], initializer=tf.compat.v1.zeros_initializer())
        b = tf.compat.v1.get_variable("b", [1], initializer=tf.compat.v1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(tf.matmul(x, w) + b - y), name="loss")
        train_op = tf.compat.v1.train.GradientDescentOptimizer(learning_rate).minimize(loss)
    return graph, {"x": x, "y": y, "loss": loss, "train_op": train_op, "w": w}


def train(params: dict, resource_info: str) -> dict:
    """A sweep's trial: ``STEPS`` steps of linear regression; the final loss on the union batch."""
    graph, t = build(params["learning_rate"])
    config = parallax.Config(run_option=params.get("run_option", "MPI"))
    sess, workers, worker, replicas = parallax.parallel_run(graph, resource_info, parallax_config=config)
    total = workers * replicas
    for step in range(STEPS):
        x, y = batches(step, total)
        lo = worker * replicas * BATCH
        xs = [x[lo + r * BATCH: lo + (r + 1) * BATCH] for r in range(replicas)]
        ys = [y[lo + r * BATCH: lo + (r + 1) * BATCH] for r in range(replicas)]
        sess.run(t["train_op"], feed_dict={t["x"]: xs, t["y"]: ys})
    w = sess.run(t["w"])[0]
    x, y = batches(STEPS, 1)
    loss = float(np.mean((x @ w - y) ** 2))
    if params.get("crash"):
        raise RuntimeError("this trial crashes on purpose")
    return {"loss": loss, "w0": float(w[0, 0]), "workers": workers * replicas}


def train_single_device(learning_rate: float, replicas: int) -> float:
    """The same training on one device with the union batch (no Parallax): the reference."""
    graph, t = build(learning_rate)
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        for step in range(STEPS):
            x, y = batches(step, replicas)
            sess.run(t["train_op"], feed_dict={t["x"]: x, t["y"]: y})
        w = sess.run(t["w"])
    x, y = batches(STEPS, 1)
    return float(np.mean((x @ w - y) ** 2))
