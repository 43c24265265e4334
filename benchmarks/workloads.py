"""The two models every system trains in ``benchmarks/compare.py``, built the same way for all.

* ``dense``: the CNN of ``examples/image_classifier`` (momentum; every gradient dense), images/s.
* ``sparse``: the language model of ``examples/sparse_lm`` (100k-word embedding, LSTM, sampled
  softmax, Adagrad; the embedding and softmax get sparse gradients), words/s.
* ``deep`` (and ``deepcomm``, its gradients without their compute): a 12-layer MLP for
  ``benchmarks/overlap.py``, examples/s.

``build(wrap)`` makes the training graph in the current default graph with the model's
optimizer passed through ``wrap`` (the identity for single-device TF and Parallax,
``SyncReplicasOptimizer`` for TensorFlow's PS, ``hvd.DistributedOptimizer`` for Horovod).
``batches(shard, num_shards)`` yields this shard's feeds (placeholder name -> array).
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from types import SimpleNamespace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
for _example in ("image_classifier", "sparse_lm"):
    sys.path.insert(0, os.path.join(ROOT, "examples", _example))

SEED = 1


@dataclass(frozen=True)
class Workload:
    name: str
    unit: str                      # what the throughput counts: "images" or "words"
    units_per_replica_step: int
    description: str
    build: Callable[[Callable], SimpleNamespace]
    batches: Callable[[int, int], Iterator[dict]]


def _train(loss, optimizer, wrap) -> SimpleNamespace:
    import tensorflow as tf

    global_step = tf.compat.v1.train.get_or_create_global_step()
    opt = wrap(optimizer)
    return SimpleNamespace(loss=loss, train_op=opt.minimize(loss, global_step=global_step), global_step=global_step,
                           optimizer=opt)


def dense(batch: int = 64) -> Workload:
    def build(wrap) -> SimpleNamespace:
        import tensorflow as tf
        from cnn_train import SIZE, model

        tf.compat.v1.set_random_seed(SEED)
        images = tf.compat.v1.placeholder(tf.float32, [None, SIZE, SIZE, 1], name="images")
        labels = tf.compat.v1.placeholder(tf.int64, [None], name="labels")
        loss, _ = model(images, labels)
        return _train(loss, tf.compat.v1.train.MomentumOptimizer(0.02, 0.9), wrap)

    def batches(shard: int, num_shards: int) -> Iterator[dict]:
        from cnn_train import make_images, step_rows

        images, labels = make_images(20_000, seed=SEED)
        step = 0
        while True:
            step += 1
            rows = step_rows(step, batch, num_shards, [shard], len(images))[0]
            yield {"images": images[rows], "labels": labels[rows]}

    return Workload("dense", "images", batch, f"CNN on 16x16 images (examples/image_classifier), momentum, batch "
                    f"{batch} per replica", build, batches)


def sparse(vocab: int = 100_000, batch: int = 32, seq_len: int = 10) -> Workload:
    def build(wrap) -> SimpleNamespace:
        import tensorflow as tf
        from lm_train import model

        tf.compat.v1.set_random_seed(SEED)
        inputs = tf.compat.v1.placeholder(tf.int64, [batch, seq_len], name="inputs")
        targets = tf.compat.v1.placeholder(tf.int64, [batch, seq_len], name="targets")
        loss = model(inputs, targets, vocab, 64, 64, 64)
        return _train(loss, tf.compat.v1.train.AdagradOptimizer(0.5), wrap)

    def batches(shard: int, num_shards: int) -> Iterator[dict]:
        from lm_train import make_corpus, shard_batches

        for inputs, targets in shard_batches(make_corpus(vocab, 20_000, seq_len, seed=SEED), batch, shard,
                                             num_shards):
            yield {"inputs": inputs, "targets": targets}

    return Workload("sparse", "words", batch * seq_len, f"LSTM language model, {vocab:,}-word embedding + sampled "
                    f"softmax (examples/sparse_lm), Adagrad, batch {batch}x{seq_len} words per replica",
                    build, batches)


def deep(layers: int = 12, width: int = 512, batch: int = 128, compute: bool = True) -> Workload:
    """An MLP deep enough for the backward pass to take a while after the last layer's gradient is ready
    (benchmarks/overlap.py). ``compute=False``: the same variables with a loss whose gradients cost nothing
    to compute (a constant times each variable's sum): what is left of its step is their all-reduce."""
    def build(wrap) -> SimpleNamespace:
        import tensorflow as tf

        tf.compat.v1.set_random_seed(SEED)
        x = tf.compat.v1.placeholder(tf.float32, [None, width], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, width], name="y")
        h, sums = x, []
        for i in range(layers):
            w = tf.compat.v1.get_variable(f"layer_{i:02d}/kernel", [width, width],
                                          initializer=tf.compat.v1.glorot_uniform_initializer())
            h = tf.tanh(tf.matmul(h, w)) if compute else h
            sums.append(tf.reduce_sum(w))
        loss = tf.reduce_mean(tf.square(h - y)) if compute else tf.reduce_mean(x) * 1e-6 * tf.add_n(sums)
        return _train(loss, tf.compat.v1.train.GradientDescentOptimizer(0.01), wrap)

    def batches(shard: int, num_shards: int) -> Iterator[dict]:
        import numpy as np

        rng = np.random.RandomState(SEED + shard)
        while True:
            yield {"x": rng.randn(batch, width).astype(np.float32), "y": rng.randn(batch, width).astype(np.float32)}

    what = "" if compute else ", its gradients without their compute"
    return Workload("deep" if compute else "deepcomm", "examples", batch,
                    f"MLP of {layers} tanh layers {width} wide ({layers * width * width * 4 / 2**20:.0f} MiB of "
                    f"gradients), gradient descent, batch {batch} per replica{what}", build, batches)


def workload(name: str, vocab: int = 100_000) -> Workload:
    if name == "dense":
        return dense()
    if name == "sparse":
        return sparse(vocab)
    if name in ("deep", "deepcomm"):
        return deep(compute=name == "deep")
    raise ValueError(f"unknown workload {name!r}: dense, sparse, deep or deepcomm")
