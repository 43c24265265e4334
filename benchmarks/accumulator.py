"""Summing a step's sparse gradients on a parameter server: TensorFlow's accumulator against Parallax's take.

    python benchmarks/accumulator.py [--rows 4000] [--dim 512] [--vocab 200000] [--senders 2,4,8,16,32]
        # writes benchmarks/results/accumulator.{json,png}

In a synchronous step, the server of a sparse variable receives one gradient
(rows and their indices) from each sender: each worker, or with HYBRID's host
aggregation each host. TensorFlow's ``SparseConditionalAccumulator`` (what
``SyncReplicasOptimizer`` uses, and Parallax used until 2026-11-25) merges each
gradient it receives into the rows it holds, copying all of them, so a step
costs about ``senders**2 / 2`` gradients' worth of copies. Parallax's take
(:func:`parallax.rewrite.ps_gradients.take_rows`) queues each sender's rows and
concatenates them once, and the update sums rows of equal index, as it does on
one device. Both, one after the other in one process with one thread per pool,
for each number of senders: ``rows`` distinct random rows of ``dim`` float32
from ``vocab`` per sender; the median of 10 steps after 2.
"""

from __future__ import annotations

import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common import RESULTS, save_results  # noqa: E402


def measure(senders: int, rows: int, dim: int, vocab: int, steps: int = 12) -> dict:
    """Median seconds per step of both ways of summing ``senders`` sparse gradients, and the rows they return."""
    import numpy as np
    import tensorflow as tf

    from parallax.rewrite.ps_gradients import take_rows

    tf1 = tf.compat.v1
    rng = np.random.default_rng(senders)
    graph = tf.Graph()
    with graph.as_default():
        indices = [tf.constant(np.sort(rng.choice(vocab, rows, replace=False)).astype(np.int64))
                   for _ in range(senders)]
        values = [tf.Variable(tf.random.normal([rows, dim], seed=i)).read_value() for i in range(senders)]
        step = tf1.placeholder(tf.int64, [])
        accumulator = tf1.SparseConditionalAccumulator(tf.float32, shape=[vocab, dim], reduction_type="SUM")
        applied: list = []
        for i in range(senders):  # one after the other, as a server takes them
            with tf.control_dependencies(applied):
                applied = [accumulator.apply_grad(indices[i], values[i], local_step=step)]
        with tf.control_dependencies(applied):
            taken = accumulator.take_indexed_slices_grad(senders)
        queue = tf.queue.FIFOQueue(-1, [tf.float32, tf.int64])
        put: list = []
        for i in range(senders):
            with tf.control_dependencies(put):
                put = [queue.enqueue([values[i], indices[i]])]
        with tf.control_dependencies(put):
            rows_values, rows_indices = take_rows(queue, senders, tf.TensorShape([vocab, dim]))
        # what an update sees: the sum of each row's values (here over all rows, a checksum)
        ways = {"tf_accumulator": [tf.reduce_sum(taken.values), tf.size(taken.indices)],
                "parallax_take": [tf.reduce_sum(rows_values), tf.size(rows_indices)]}
        config = tf1.ConfigProto(intra_op_parallelism_threads=1, inter_op_parallelism_threads=1)
        with tf1.Session(config=config) as session:
            session.run(tf1.global_variables_initializer())
            times: dict[str, list[float]] = {name: [] for name in ways}
            sums = {}
            for k in range(steps):
                for name, fetch in ways.items():
                    start = time.perf_counter()
                    sums[name] = session.run(fetch, {step: k})
                    times[name].append(time.perf_counter() - start)
    total_tf, rows_tf = sums["tf_accumulator"]
    total_px, rows_px = sums["parallax_take"]
    if abs(total_tf - total_px) > 1e-5 * senders * rows * dim:  # float32 sums of normal values, any order
        raise SystemExit(f"{senders} senders: the two sums differ ({total_tf} against {total_px})")
    out = {"senders": senders, "rows_per_sender": rows, "dim": dim,
           "rows_returned": {"tf_accumulator": int(rows_tf), "parallax_take": int(rows_px)}}
    for name, ts in times.items():
        out[f"{name}_ms"] = float(np.median(ts[2:]) * 1e3)
    out["speedup"] = out["tf_accumulator_ms"] / out["parallax_take_ms"]
    return out


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6.5, 4.2))
    senders = [r["senders"] for r in rows]
    ax.plot(senders, [r["tf_accumulator_ms"] for r in rows], "o-", label="SparseConditionalAccumulator (TF, before)")
    ax.plot(senders, [r["parallax_take_ms"] for r in rows], "s-", label="queue + one concat (Parallax now)")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xticks(senders, [str(s) for s in senders])
    ax.set_xlabel("senders per step (workers, or hosts with host aggregation)")
    ax.set_ylabel("ms per step on the server")
    ax.set_title(f"Summing sparse gradients ({rows[0]['rows_per_sender']} rows x {rows[0]['dim']} per sender)",
                 fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=4000, help="distinct rows each sender sends (default 4000)")
    parser.add_argument("--dim", type=int, default=512, help="floats per row (default 512)")
    parser.add_argument("--vocab", type=int, default=200_000, help="rows of the variable (default 200,000)")
    parser.add_argument("--senders", default="2,4,8,16,32", help="numbers of senders, comma-separated")
    parser.add_argument("--results", default=RESULTS, help="directory for accumulator.{json,png}")
    args = parser.parse_args(argv)
    try:
        counts = [int(s) for s in args.senders.split(",")]
    except ValueError:
        parser.error(f"--senders: expected numbers separated by commas, got {args.senders!r}")
    if args.rows > args.vocab or min(counts) < 1:
        parser.error("--rows must not exceed --vocab, and every --senders count must be at least 1")
    rows = []
    print(f"{'senders':>7} {'TF accumulator':>15} {'Parallax take':>14} {'speed-up':>9}")
    for count in counts:
        r = measure(count, args.rows, args.dim, args.vocab)
        rows.append(r)
        print(f"{count:>7} {r['tf_accumulator_ms']:>12.1f} ms {r['parallax_take_ms']:>11.1f} ms {r['speedup']:>8.2f}x",
              flush=True)
    save_results(args.results, "accumulator", {"rows": rows}, lambda data, path: _plot(data["rows"], path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
