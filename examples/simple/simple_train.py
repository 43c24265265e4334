"""Linear regression, trained data-parallel by Parallax.

The model is an ordinary single-device graph; only the ``parallel_run`` call
is Parallax. Run it with ``make demo`` or::

    python examples/simple/simple_train.py --resource_info resource_info.example
"""

from __future__ import annotations

import argparse
import logging
import os
import time

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import parallax  # noqa: E402

TRUE_W, TRUE_B = 0.1, 0.3


def build_graph(learning_rate: float) -> tuple[tf.Graph, dict]:
    """The single-device model: y = W * x + b, squared loss, gradient descent."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None], name="y")
        w = tf.compat.v1.get_variable("W", [], initializer=tf.compat.v1.random_uniform_initializer(-1.0, 1.0))
        b = tf.compat.v1.get_variable("b", [], initializer=tf.compat.v1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(w * x + b - y), name="loss")
        global_step = tf.compat.v1.train.get_or_create_global_step()
        train_op = tf.compat.v1.train.GradientDescentOptimizer(learning_rate).minimize(
            loss, global_step=global_step)
    return graph, {"x": x, "y": y, "W": w, "b": b, "loss": loss, "train_op": train_op,
                   "global_step": global_step}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resource_info", default="resource_info.example")
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--batch_size", type=int, default=32, help="per replica")
    parser.add_argument("--learning_rate", type=float, default=0.5)
    parser.add_argument("--run_option", default="MPI",
                        help="PS, MPI (default here: one process per device), HYBRID or AUTO")
    args = parser.parse_args()
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    parallax.log.setLevel(logging.INFO)
    tf.get_logger().setLevel(logging.WARNING)

    graph, t = build_graph(args.learning_rate)
    config = parallax.Config(run_option=args.run_option)
    sess, num_workers, worker_id, num_replicas = parallax.parallel_run(
        graph, args.resource_info, sync=True, parallax_config=config)
    chief = worker_id == 0
    print(f"worker {worker_id} of {num_workers} ready, {num_replicas} replica(s) in this process", flush=True)

    rng = np.random.default_rng(worker_id)
    start = time.time()
    for step in range(1, args.steps + 1):
        xs = [rng.random(args.batch_size, dtype=np.float32) for _ in range(num_replicas)]
        ys = [x * TRUE_W + TRUE_B for x in xs]
        losses, _ = sess.run([t["loss"], t["train_op"]], feed_dict={t["x"]: xs, t["y"]: ys})
        if chief and (step == 1 or step % 20 == 0):
            w, b = sess.run([t["W"], t["b"]])
            print(f"step {step:4d}  loss {', '.join(f'{v:.3e}' for v in losses)}  "
                  f"W={w[0]:+.4f} b={b[0]:+.4f}", flush=True)
    w, b, gstep = sess.run([t["W"], t["b"], t["global_step"]])
    print(f"worker {worker_id} done: {args.steps} steps in {time.time() - start:.1f}s, global step {gstep[0]}; "
          f"final loss {float(np.mean(losses)):.2e}; learned W={w[0]:.4f} b={b[0]:.4f} "
          f"(true W={TRUE_W} b={TRUE_B})")
    sess.close()


if __name__ == "__main__":
    main()
