"""A learning-rate sweep of the linear regression, each trial a Parallax job on 1 of the 2 devices.

Both trials of a pair run at once, one per device of the resource file; with
``--backend dask`` they run on an embedded Dask LocalCluster instead of local processes.

    python examples/sweep/lr_sweep.py --resource_info resource_info.example [--method random --trials 4]
"""

from __future__ import annotations

import argparse
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np  # noqa: E402
import tensorflow as tf  # noqa: E402

import parallax  # noqa: E402

TRUE_W, TRUE_B, STEPS, BATCH = 0.1, 0.3, 60, 32


def train(params: dict, resource_info: str) -> dict:
    """One trial: the single-device model of examples/simple, ``STEPS`` steps at ``params["learning_rate"]``;
    the loss on held-out points."""
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None])
        y = tf.compat.v1.placeholder(tf.float32, [None])
        w = tf.compat.v1.get_variable("W", [], initializer=tf.compat.v1.constant_initializer(-0.5))
        b = tf.compat.v1.get_variable("b", [], initializer=tf.compat.v1.zeros_initializer())
        loss = tf.reduce_mean(tf.square(w * x + b - y))
        train_op = tf.compat.v1.train.GradientDescentOptimizer(params["learning_rate"]).minimize(loss)
    sess, num_workers, worker_id, num_replicas = parallax.parallel_run(graph, resource_info)
    rng = np.random.default_rng(worker_id)
    for _ in range(STEPS):
        xs = [rng.random(BATCH, dtype=np.float32) for _ in range(num_replicas)]
        sess.run(train_op, feed_dict={x: xs, y: [v * TRUE_W + TRUE_B for v in xs]})
    held_out = np.linspace(0, 1, 101, dtype=np.float32)
    learned_w, learned_b = (float(v[0]) for v in sess.run([w, b]))
    return {"loss": float(np.mean((learned_w * held_out + learned_b - (held_out * TRUE_W + TRUE_B)) ** 2)),
            "W": learned_w, "b": learned_b}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--resource_info", default="resource_info.example")
    parser.add_argument("--method", default="grid", choices=["grid", "random", "bayes"])
    parser.add_argument("--trials", type=int, default=4, help="random, bayes: how many")
    parser.add_argument("--backend", default="local", choices=["local", "dask"])
    parser.add_argument("--output", default="parallax_sweep")
    args = parser.parse_args()
    space = ({"learning_rate": [0.05, 0.2, 0.5, 1.0]} if args.method == "grid" else
             {"learning_rate": parallax.Uniform(0.01, 1.0, log=True)})
    report = parallax.sweep(train, space, args.resource_info, method=args.method, trials=args.trials,
                            devices_per_trial=1, backend=args.backend, metric="loss", output=args.output)
    print(report.table())
    best = report.best
    print(f"best: learning_rate={best.value['params']['learning_rate']:.4g}, held-out loss "
          f"{report.value_of(best):.3g} (W={best.value['value']['W']:.4f} b={best.value['value']['b']:.4f}); "
          f"results and plot in {args.output}/")


if __name__ == "__main__":
    main()
