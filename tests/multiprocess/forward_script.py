"""A forward-only program (inference: no optimizer) run as a user would; used by the
multi-process tests. Each rank writes the outputs of its replicas to ``<out>/rank_<id>.npz``."""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import parallax  # noqa: E402

WEIGHTS = np.arange(12, dtype=np.float32).reshape(4, 3) / 10.0


def inputs(num_parts: int) -> np.ndarray:
    return np.random.RandomState(0).randn(6 * num_parts, 4).astype(np.float32)


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--resource_info", required=True)
    p.add_argument("--run_option", default="MPI")
    p.add_argument("--out", required=True)
    args = p.parse_args()

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, 4], name="x")
        w = tf.compat.v1.get_variable("w", initializer=tf.constant(WEIGHTS))
        y = tf.matmul(x, w, name="y")
    sess, num_workers, worker_id, num_replicas = parallax.parallel_run(
        graph, args.resource_info, parallax_config=parallax.Config(run_option=args.run_option))
    parts = np.split(inputs(num_workers * num_replicas), num_workers * num_replicas)
    mine = parts[worker_id * num_replicas:(worker_id + 1) * num_replicas]
    outputs = sess.run(y, feed_dict={x: mine})
    os.makedirs(args.out, exist_ok=True)
    np.savez(os.path.join(args.out, f"rank_{worker_id}.npz"), outputs=np.stack(outputs), weights=sess.run(w)[0],
             shape=np.array([num_workers, num_replicas]))
    print(f"rank {worker_id} of {num_workers} done", flush=True)
    sess.close()


if __name__ == "__main__":
    main()
