"""Pipeline step time against stages ``k`` and micro-batches ``m``, beside the GPipe bubble.

    python benchmarks/pipeline.py        # writes benchmarks/results/pipeline.{json,csv,png}

A deep MLP (8 layers of 1024, batch 512) trains in one process with its replica cut into
``k`` stages on ``k`` virtual CPU devices and its batch into ``m`` micro-batches
(``Config(pipeline_stages=k, micro_batches=m)``). For each ``(k, m)``: the median step time
of 3 timed runs of 10 steps, the bubble fraction the GPipe schedule predicts,
``(k-1)/(m+k-1)``, and the GPipe step on ``k`` devices that each compute as fast as one:
``t(1,m) / k / (1 - bubble)`` (the same micro-batches' work, ``t(1,m)``, shared by ``k``
stages and stretched by the bubble).

Virtual CPU devices share the machine's cores (2 here), so it is run twice:

* ``all threads``: TensorFlow's default, each op on every core. Stages cannot run faster
  than the cores; this shows what the cut and the micro-batches cost.
* ``one thread an op`` (``TF_NUM_INTRAOP_THREADS=1``, ``OMP_NUM_THREADS=1``): each stage's
  op takes one core, so two stages can work at once, on two micro-batches, as two devices
  would; with ``k=2`` the step should approach ``t(1,m) / 2 / (1 - bubble)``.
* ``stage processes`` (``k`` <= the cores): each stage a process of its own (a worker and
  stage servers, one device a resource line, ``run_option='MPI'``; activations over gRPC),
  one thread an op: each stage has a core to itself, as on separate devices or hosts.
"""

from __future__ import annotations

import argparse
import csv
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common import RESULTS, read_json, write_json  # noqa: E402

STAGES = (1, 2, 4)
MICRO_BATCHES = (1, 2, 4, 8)
LAYERS, WIDTH, BATCH, FEATURES = 8, 1024, 512, 1024
WARMUP, STEPS, RUNS = 3, 10, 3


def _model():
    import tensorflow as tf

    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None, FEATURES], name="x")
        y = tf.compat.v1.placeholder(tf.float32, [None, 1], name="y")
        h = x
        for i in range(LAYERS):
            with tf.compat.v1.variable_scope(f"layer_{i}"):
                w = tf.compat.v1.get_variable("kernel", [h.shape[-1], WIDTH])
                h = tf.nn.relu(tf.matmul(h, w))
        loss = tf.reduce_mean(tf.square(tf.matmul(h, tf.compat.v1.get_variable("head", [WIDTH, 1])) - y))
        train = tf.compat.v1.train.GradientDescentOptimizer(1e-4).minimize(loss)
    return graph, x, y, loss, train


THREADS = {"all threads": None, "one thread an op": 1}
#: What makes TensorFlow's (and oneDNN's) ops single-threaded: set before TensorFlow starts.
ONE_THREAD_ENV = {"TF_NUM_INTRAOP_THREADS": "1", "OMP_NUM_THREADS": "1"}


STAGED = "stage processes"


def step_time(stages: int, micro: int, directory: str, threads: int | None, staged: bool = False) -> float:
    """The median seconds per step of ``RUNS`` runs of ``STEPS`` steps, after ``WARMUP`` steps (``staged``:
    each stage a process; this returns in the worker, the launching process ends with the job)."""
    import numpy as np
    import tensorflow as tf

    import parallax

    resources = os.path.join(directory, f"resources_{stages}")
    devices = [f"cpu:{i}" for i in range(stages)]
    with open(resources, "w") as f:
        f.write("".join(f"localhost: {d}\n" for d in devices) if staged else f"localhost: {','.join(devices)}\n")
    graph, x, y, loss, train = _model()
    sess_config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads,
                                           inter_op_parallelism_threads=os.cpu_count()) if threads else None
    config = parallax.Config(run_option="MPI" if staged else "PS", pipeline_stages=stages, micro_batches=micro,
                             sess_config=sess_config)
    sess, *_ = parallax.parallel_run(graph, resources, parallax_config=config)
    rng = np.random.default_rng(0)
    feed = {x: [rng.standard_normal((BATCH, FEATURES)).astype(np.float32)],
            y: [rng.standard_normal((BATCH, 1)).astype(np.float32)]}
    run = sess.make_callable(train, [x, y])
    for _ in range(WARMUP):
        run(feed[x], feed[y])
    times = []
    for _ in range(RUNS):
        start = time.perf_counter()
        for _ in range(STEPS):
            run(feed[x], feed[y])
        times.append((time.perf_counter() - start) / STEPS)
    sess.close()
    return statistics.median(times)


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(r["threads"] for r in rows))
    fig, axes = plt.subplots(1, len(modes) + 1, figsize=(5.3 * (len(modes) + 1), 4))
    for ax, mode in zip(axes, modes):
        for k in STAGES:
            mine = [r for r in rows if r["stages"] == k and r["threads"] == mode]
            if not mine:
                continue
            ax.plot([r["micro_batches"] for r in mine], [1000 * r["step_seconds"] for r in mine], "o-",
                    label=f"k={k}")
            if k > 1:
                ax.plot([r["micro_batches"] for r in mine], [1000 * r["ideal_seconds"] for r in mine], ":",
                        color=ax.lines[-1].get_color(), label=f"k={k}, ideal devices")
        ax.set(ylabel="step time (ms)", title=f"measured step, {mode}")
    right = axes[-1]
    for k in STAGES[1:]:
        mine = [r for r in rows if r["stages"] == k and r["threads"] == next(iter(THREADS))]
        right.plot([r["micro_batches"] for r in mine], [r["bubble"] for r in mine], "o-", label=f"k={k}")
    right.set(ylabel="(k-1)/(m+k-1)", title="GPipe bubble fraction")
    for ax in axes:
        ax.set(xscale="log", xlabel="micro-batches m")
        ax.set_xticks(MICRO_BATCHES, [str(m) for m in MICRO_BATCHES])
        ax.minorticks_off()
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def measure(mode: str, out: str) -> None:
    """Every ``(k, m)`` with the threads of ``mode``, into ``out`` (JSON). A process measures one mode:
    TensorFlow makes a CPU device's thread pool once a process."""
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for k in STAGES:
            for m in MICRO_BATCHES:
                seconds = step_time(k, m, directory, THREADS[mode])
                rows.append({"threads": mode, "stages": k, "micro_batches": m, "step_seconds": seconds,
                             "bubble": (k - 1) / (m + k - 1)})
                print(f"{mode}, k={k} m={m}: {1000 * seconds:7.1f} ms a step, bubble {rows[-1]['bubble']:.2f}",
                      flush=True)
    write_json(out, rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--results", default=RESULTS, help="where to write pipeline.{json,csv,png}")
    parser.add_argument("--mode", choices=list(THREADS), help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--staged", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--micro", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.mode:
        measure(args.mode, args.out)
        return
    if args.staged:  # one (k, m) with stage processes: the worker writes its row
        with tempfile.TemporaryDirectory() as directory:
            seconds = step_time(args.staged, args.micro, directory, 1, staged=True)
        write_json(args.out, {"threads": STAGED, "stages": args.staged, "micro_batches": args.micro,
                              "step_seconds": seconds, "bubble": (args.staged - 1) / (args.micro + args.staged - 1)})
        return
    rows = []
    with tempfile.TemporaryDirectory() as directory:
        for mode in THREADS:
            out = os.path.join(directory, "rows.json")
            env = {**os.environ, **(ONE_THREAD_ENV if THREADS[mode] else {})}
            subprocess.run([sys.executable, os.path.abspath(__file__), "--mode", mode, "--out", out], check=True,
                           env=env)
            rows.extend(read_json(out))
        for k in (k for k in STAGES if k <= (os.cpu_count() or 1)):
            for m in MICRO_BATCHES:
                out = os.path.join(directory, f"staged_{k}_{m}.json")
                subprocess.run([sys.executable, os.path.abspath(__file__), "--staged", str(k), "--micro", str(m),
                                "--out", out], check=True, env={**os.environ, **ONE_THREAD_ENV})
                rows.append(read_json(out))
                print(f"{STAGED}, k={k} m={m}: {1000 * rows[-1]['step_seconds']:7.1f} ms a step", flush=True)
    alone = {(r["threads"], r["micro_batches"]): r["step_seconds"] for r in rows if r["stages"] == 1}
    for r in rows:
        r["ideal_seconds"] = alone[r["threads"], r["micro_batches"]] / r["stages"] / (1 - r["bubble"])
        r["relative_to_one_device"] = r["step_seconds"] / alone[r["threads"], 1]
    os.makedirs(args.results, exist_ok=True)
    json_path = os.path.join(args.results, "pipeline.json")
    write_json(json_path, {"machine": {"cores": os.cpu_count(), "python": platform.python_version()},
                           "model": {"layers": LAYERS, "width": WIDTH, "batch": BATCH, "features": FEATURES},
                           "rows": rows})
    csv_path = os.path.join(args.results, "pipeline.csv")
    with open(csv_path, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    png_path = os.path.join(args.results, "pipeline.png")
    _plot(rows, png_path)
    print(f"\n{'threads':>16} {'k':>2} {'m':>2} {'step ms':>8} {'x k=1,m=1':>10} {'bubble':>7} {'ideal ms':>9}")
    for r in rows:
        print(f"{r['threads']:>16} {r['stages']:>2} {r['micro_batches']:>2} {1000 * r['step_seconds']:8.1f} "
              f"{r['relative_to_one_device']:10.2f} {r['bubble']:7.2f} {1000 * r['ideal_seconds']:9.1f}")
    print(f"\nwrote {json_path}, {csv_path} and {png_path}")


if __name__ == "__main__":
    main()
