"""Models and helpers shared by the benchmarks."""

from __future__ import annotations

import json
import os

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def mlp(batch_features: int = 256, widths=(512, 512), classes: int = 10):
    """A small MLP classifier in the current default graph: returns (x, y, loss)."""
    import tensorflow as tf

    x = tf.compat.v1.placeholder(tf.float32, [None, batch_features], name="x")
    y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
    h = x
    for i, width in enumerate(widths):
        w = tf.compat.v1.get_variable(f"dense{i}/kernel", [h.shape[-1], width])
        h = tf.nn.relu(tf.matmul(h, w))
    logits = tf.matmul(h, tf.compat.v1.get_variable("out/kernel", [h.shape[-1], classes]))
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    return x, y, loss


def batch(seed: int, size: int, features: int = 256, classes: int = 10):
    import numpy as np

    rng = np.random.default_rng(seed)
    return rng.standard_normal((size, features), np.float32), rng.integers(0, classes, size)


def write_json(path: str, data) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def read_json(path: str):
    with open(path) as f:
        return json.load(f)
