"""Memory per rank with sharded optimizer states (``zero_stage``) at 1, 2 and 4 ranks.

    python benchmarks/zero_memory.py        # writes benchmarks/results/zero_memory.{json,png}

A model whose Adam slots dominate (an MLP of 10.5 M parameters, 42 MB; Adam keeps two slots
of the same size, 84 MB) trains a few steps in MPI mode on this machine with 1, 2 and 4
ranks and ``zero_stage`` 0, 1 and 2. Each rank measures its resident memory: before the
graph is built, once its session is ready (variables initialised), and the peak while it
trains (``VmHWM``, reset when the session is ready). "Model memory" is that peak less the
first figure: what the graph, its variables, slots and step buffers cost the rank. Beside
it, the plan's bytes of variables and of slots per rank (``parallax plan`` prints them).
The ranks run with ``MALLOC_MMAP_THRESHOLD_=65536`` (see :data:`MEASURING_ENV`).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common import RESULTS, read_json, write_json  # noqa: E402

#: glibc serves every allocation of 64 KiB or more with its own mapping and unmaps it when freed (its
#: default threshold grows with the sizes freed, and memory freed below it stays in the process), so
#: the resident set follows what is alive: TensorFlow's buffers, variables and slots.
MEASURING_ENV = {"MALLOC_MMAP_THRESHOLD_": "65536"}
RANKS = (1, 2, 4)
STAGES = (0, 1, 2)
WIDTHS = (2048, 2048, 2048)
FEATURES = 1024
STEPS = 4
BATCH = 8


def _status(field: str) -> float:
    """A field of /proc/self/status in MB (``VmRSS``, ``VmHWM``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def _reset_peak() -> None:
    with open("/proc/self/clear_refs", "w") as f:  # "5": reset the peak resident set (Linux >= 4.0)
        f.write("5")


def _model():
    import tensorflow as tf

    from benchmarks.common import mlp

    graph = tf.Graph()
    with graph.as_default():
        x, y, loss = mlp(FEATURES, WIDTHS)
        train = tf.compat.v1.train.AdamOptimizer(1e-4).minimize(loss)
    return graph, x, y, train


def job(args) -> None:
    """What every rank runs (the first call of parallel_run launches the others)."""
    import tensorflow as tf  # noqa: F401 - imported before the first figure, as a program would

    import parallax
    from benchmarks.common import batch

    start = _status("VmRSS")
    graph, x, y, train = _model()
    config = parallax.Config(run_option="MPI", zero_stage=args.stage)
    sess, workers, worker_id, _ = parallax.parallel_run(graph, args.resource_info, parallax_config=config)
    ready = _status("VmRSS")
    _reset_peak()
    xs, ys = batch(worker_id, BATCH, FEATURES)
    for _ in range(STEPS):
        sess.run(train, feed_dict={x: [xs], y: [ys]})
    write_json(os.path.join(args.out, f"rank_{worker_id}.json"), {
        "rank": worker_id, "ranks": workers, "stage": args.stage, "rss_start_mb": start, "rss_ready_mb": ready,
        "peak_training_mb": _status("VmHWM"), "model_mb": _status("VmHWM") - start})
    sess.close()


def _plan_bytes(ranks: int, stage: int, resource: str) -> tuple[int, int]:
    import parallax

    graph, *_ = _model()
    plan = parallax.preview_plan(graph, resource, parallax_config=parallax.Config(run_option="MPI",
                                                                                 zero_stage=stage))
    return plan.bytes_per_rank()


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.2))
    width = 0.8 / len(STAGES)
    for i, stage in enumerate(STAGES):
        mine = [r for r in rows if r["stage"] == stage]
        xs = [RANKS.index(r["ranks"]) + (i - (len(STAGES) - 1) / 2) * width for r in mine]
        ax.bar(xs, [r["model_mb_max"] for r in mine], width, label=f"zero_stage={stage}: measured")
        ax.scatter(xs, [(r["plan_variables"] + r["plan_slots"]) / 2**20 for r in mine], color="black", zorder=3,
                   s=14, label="plan: variables + slots" if i == 0 else None)
    ax.set_xticks(range(len(RANKS)), [f"{n} rank{'s' if n > 1 else ''}" for n in RANKS])
    ax.set_ylabel("memory per rank (MB): peak while training\nless the resident set before the graph")
    ax.set_title(f"Adam, MLP of {_params() / 1e6:.1f} M parameters, MPI mode on one host", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _params() -> int:
    sizes = (FEATURES,) + WIDTHS
    return sum(a * b for a, b in zip(sizes, sizes[1:])) + WIDTHS[-1] * 10


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--job", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--resource_info")
    parser.add_argument("--stage", type=int, default=0)
    parser.add_argument("--out")
    parser.add_argument("--results", default=RESULTS)
    args = parser.parse_args()
    if args.job:
        return job(args)
    work = tempfile.mkdtemp(prefix="parallax_zero_memory_")
    rows = []
    for ranks in RANKS:
        resource = os.path.join(work, f"resources_{ranks}")
        with open(resource, "w") as f:
            f.write("localhost: " + ",".join(f"cpu:{i}" for i in range(ranks)) + "\n")
        for stage in STAGES:
            out = os.path.join(work, f"r{ranks}_z{stage}")
            os.makedirs(out)
            print(f"{ranks} rank(s), zero_stage={stage} ...", flush=True)
            done = subprocess.run([sys.executable, os.path.abspath(__file__), "--job", "--resource_info", resource,
                                   "--stage", str(stage), "--out", out], cwd=work, capture_output=True, text=True,
                                  timeout=900, env={**os.environ, **MEASURING_ENV})
            if done.returncode != 0:
                raise SystemExit(f"{ranks} rank(s), zero_stage={stage} failed (exit code {done.returncode}):\n"
                                 + done.stderr[-3000:])
            per_rank = [read_json(os.path.join(out, f"rank_{r}.json")) for r in range(ranks)]
            variables, slots = _plan_bytes(ranks, stage, resource)
            rows.append({"ranks": ranks, "stage": stage, "per_rank": per_rank,
                         "model_mb_max": max(r["model_mb"] for r in per_rank),
                         "model_mb_min": min(r["model_mb"] for r in per_rank),
                         "plan_variables": variables, "plan_slots": slots})
    print(f"\n{'ranks':>5} {'stage':>5} {'model MB per rank':>18} {'plan: variables + slots MB':>27}")
    for r in rows:
        print(f"{r['ranks']:>5} {r['stage']:>5} {r['model_mb_min']:>8.0f}-{r['model_mb_max']:<9.0f} "
              f"{r['plan_variables'] / 2**20:>12.1f} + {r['plan_slots'] / 2**20:<12.1f}")
    data = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()}, "parameters": _params(),
            "optimizer": "Adam", "steps": STEPS, "batch_per_rank": BATCH, "rows": rows}
    os.makedirs(args.results, exist_ok=True)
    json_path = os.path.join(args.results, "zero_memory.json")
    png_path = os.path.join(args.results, "zero_memory.png")
    write_json(json_path, data)
    _plot(rows, png_path)
    print(f"\nwrote {json_path} and {png_path}")


if __name__ == "__main__":
    main()
