"""A training script as users write one, for parallax tune: linear regression, the config left to Parallax.

    python tune_script.py RESOURCE_FILE --steps N --out DIR

Each worker writes its final weights to DIR/w_<worker>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import parallax  # noqa: E402
from tests.trials.programs import BATCH, batches, build  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("resource_info")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    graph, t = build(0.1)
    sess, workers, worker, replicas = parallax.parallel_run(graph, args.resource_info)
    total = workers * replicas
    for step in range(args.steps):
        x, y = batches(step, total)
        lo = worker * replicas * BATCH
        sess.run(t["train_op"], feed_dict={t["x"]: [x[lo + r * BATCH: lo + (r + 1) * BATCH] for r in range(replicas)],
                                           t["y"]: [y[lo + r * BATCH: lo + (r + 1) * BATCH] for r in range(replicas)]})
        if worker == 0 and step % 3 == 0:
            sess.run(t["loss"], feed_dict={t["x"]: [x[:BATCH]] * replicas, t["y"]: [y[:BATCH]] * replicas})
    w = sess.run(t["w"])[0]
    if args.out:
        with open(os.path.join(args.out, f"w_{worker}.json"), "w", encoding="utf-8") as f:
            json.dump({"w": w.ravel().tolist(), "total": total}, f)
    print(f"worker {worker} done", flush=True)


if __name__ == "__main__":
    main()
