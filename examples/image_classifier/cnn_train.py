"""An image classifier (a small CNN), trained data-parallel by Parallax.

The model is an ordinary single-device TensorFlow graph: two 3x3 convolutions
with max-pooling, a dense layer and a softmax over 8 classes, trained with
momentum. Only the ``parallel_run`` call is Parallax.

The images are generated (numpy, seeded; nothing is downloaded): 16x16
grayscale gratings, one orientation per class (0, 22.5, ..., 157.5 degrees),
with a random phase and frequency, random contrast and Gaussian noise. A
held-out set of 1,024 images measures accuracy at the end.

Run it with::

    python examples/image_classifier/cnn_train.py --resource_info resource_info.example
    parallax-run --resource_info resource_info.example examples/image_classifier/cnn_train.py --steps 100

Each replica reads its own shard of the training images; the batch of a step
is the union of the replicas' batches, so 2 replicas of 32 images train like
one device on 64.
"""

from __future__ import annotations

import argparse
import logging
import os
import time
from types import SimpleNamespace

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import parallax  # noqa: E402

SIZE, CLASSES = 16, 8


def make_images(count: int, seed: int, noise: float = 0.6) -> tuple[np.ndarray, np.ndarray]:
    """``count`` images ``[count, 16, 16, 1]`` float32 and their labels ``[count]`` int64.

    Class ``k`` is a grating at ``k * 180 / 8`` degrees; phase, spatial frequency
    (2-4 cycles per image) and contrast are random, plus Gaussian noise of
    standard deviation ``noise``.
    """
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, CLASSES, count)
    angle = labels * np.pi / CLASSES
    cycles = rng.uniform(2.0, 4.0, count)
    phase = rng.uniform(0, 2 * np.pi, count)
    contrast = rng.uniform(0.5, 1.0, count)
    yy, xx = np.mgrid[0:SIZE, 0:SIZE] / SIZE
    along = np.cos(angle)[:, None, None] * xx + np.sin(angle)[:, None, None] * yy
    images = contrast[:, None, None] * np.sin(2 * np.pi * cycles[:, None, None] * along + phase[:, None, None])
    images += rng.normal(0.0, noise, images.shape)
    return images[..., None].astype(np.float32), labels.astype(np.int64)


def model(images: tf.Tensor, labels: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """The network in the current graph: conv 3x3x16 - pool - conv 3x3x32 - pool - dense 64 - softmax 8.

    Returns:
        ``(loss, correct)``: the mean cross-entropy and the number of right answers.
    """
    init = tf.compat.v1.glorot_uniform_initializer()
    zeros = tf.compat.v1.zeros_initializer()
    net = images
    for i, channels in enumerate((16, 32)):
        kernel = tf.compat.v1.get_variable(f"conv{i}/kernel", [3, 3, int(net.shape[-1]), channels], initializer=init)
        bias = tf.compat.v1.get_variable(f"conv{i}/bias", [channels], initializer=zeros)
        net = tf.nn.relu(tf.nn.conv2d(net, kernel, strides=1, padding="SAME") + bias)
        net = tf.nn.max_pool2d(net, ksize=2, strides=2, padding="SAME")
    net = tf.reshape(net, [-1, (SIZE // 4) * (SIZE // 4) * 32])
    w1 = tf.compat.v1.get_variable("dense/kernel", [int(net.shape[-1]), 64], initializer=init)
    b1 = tf.compat.v1.get_variable("dense/bias", [64], initializer=zeros)
    net = tf.nn.relu(tf.matmul(net, w1) + b1)
    w2 = tf.compat.v1.get_variable("logits/kernel", [64, CLASSES], initializer=init)
    b2 = tf.compat.v1.get_variable("logits/bias", [CLASSES], initializer=zeros)
    logits = tf.matmul(net, w2) + b2
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=labels, logits=logits), name="loss")
    correct = tf.reduce_sum(tf.cast(tf.equal(tf.argmax(logits, axis=1), labels), tf.int64), name="correct")
    return loss, correct


def build_graph(learning_rate: float = 0.02, momentum: float = 0.9, seed: int = 1
                ) -> tuple[tf.Graph, SimpleNamespace]:
    """The single-device graph: placeholders, :func:`model`, momentum."""
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.set_random_seed(seed)
        images = tf.compat.v1.placeholder(tf.float32, [None, SIZE, SIZE, 1], name="images")
        labels = tf.compat.v1.placeholder(tf.int64, [None], name="labels")
        loss, correct = model(images, labels)
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.MomentumOptimizer(learning_rate, momentum).minimize(
            loss, global_step=global_step)
    return graph, SimpleNamespace(images=images, labels=labels, loss=loss, correct=correct, train_op=train_op,
                                  global_step=global_step)


def step_rows(step: int, batch: int, total_replicas: int, replicas: list[int], num_images: int) -> list[slice]:
    """The training images of ``replicas`` at ``step`` (from 1): step ``s`` of the job trains on
    the ``s``-th window of ``batch * total_replicas`` images (wrapping around), replica ``k`` on
    its ``k``-th slice. With ``replicas = range(total_replicas)`` the slices join to the union batch."""
    window = batch * total_replicas
    offset = (step - 1) * window % (num_images - window + 1)
    return [slice(offset + k * batch, offset + (k + 1) * batch) for k in replicas]


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resource_info", default="resource_info.example")
    parser.add_argument("--run_option", default="MPI", choices=["PS", "MPI", "HYBRID", "AUTO"], type=str.upper,
                        help="how Parallax spreads the job (default here MPI: one process per device)")
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--batch", type=int, default=32, help="images per replica and step")
    parser.add_argument("--learning_rate", type=float, default=0.02)
    parser.add_argument("--train_images", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--log_every", type=int, default=50)
    parser.add_argument("--ckpt_dir", default=None, help="save checkpoints here (and resume from the latest)")
    parser.add_argument("--save_steps", type=int, default=100, help="with --ckpt_dir: save every this many steps")
    args = parser.parse_args(argv)
    if args.steps < 1 or args.log_every < 1 or args.batch < 1:
        parser.error("--steps, --batch and --log_every must be at least 1")
    return args


def main() -> None:
    args = parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    tf.get_logger().setLevel(logging.ERROR)

    graph, t = build_graph(args.learning_rate, seed=args.seed)
    config = parallax.Config(run_option=args.run_option)
    if args.ckpt_dir:  # saved under the single-device names: a plain tf.compat.v1.train.Saver restores it
        config.ckpt_config = parallax.CheckPointConfig(ckpt_dir=args.ckpt_dir, save_ckpt_steps=args.save_steps)
    sess, num_workers, worker_id, num_replicas = parallax.parallel_run(
        graph, args.resource_info, sync=True, parallax_config=config)
    chief = worker_id == 0
    print(f"worker {worker_id} of {num_workers} ready, {num_replicas} replica(s) in this process", flush=True)

    images, labels = make_images(args.train_images, seed=args.seed)
    test_images, test_labels = make_images(1024, seed=args.seed + 1_000)
    total = num_workers * num_replicas
    mine = [worker_id * num_replicas + r for r in range(num_replicas)]  # this process's replicas
    images_per_step = args.batch * total

    window_loss, window_steps = 0.0, 0
    start = window_start = time.perf_counter()
    for step in range(1, args.steps + 1):
        rows = step_rows(step, args.batch, total, mine, len(images))
        losses, _ = sess.run([t.loss, t.train_op], feed_dict={t.images: [images[r] for r in rows],
                                                              t.labels: [labels[r] for r in rows]})
        window_loss, window_steps = window_loss + float(np.mean(losses)), window_steps + 1
        if chief and (step % args.log_every == 0 or step == args.steps):
            now = time.perf_counter()
            print(f"step {step:5d}  loss {window_loss / window_steps:.3f}  "
                  f"{images_per_step * window_steps / (now - window_start):8.0f} images/s", flush=True)
            window_loss, window_steps, window_start = 0.0, 0, now
    seconds = time.perf_counter() - start
    # Held-out accuracy: each replica of this process counts the correct answers of a part of the set.
    parts = np.array_split(np.arange(len(test_images)), num_replicas)
    correct = sess.run(t.correct, feed_dict={t.images: [test_images[p] for p in parts],
                                             t.labels: [test_labels[p] for p in parts]})
    accuracy = float(np.sum(correct)) / len(test_images)
    if chief:
        gstep = sess.run(t.global_step)[0]
        print(f"done: {args.run_option}, {num_workers} worker(s) x {num_replicas} replica(s), {args.steps} steps "
              f"(global step {gstep}) of {images_per_step} images in {seconds:.1f} s, "
              f"{images_per_step * args.steps / seconds:.0f} images/s; held-out accuracy {accuracy:.1%} "
              f"(chance {1 / CLASSES:.1%})", flush=True)
    sess.close()


if __name__ == "__main__":
    main()
