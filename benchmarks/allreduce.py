"""All-reduce inside the graph vs raw mpi4py, and MPI-mode training speed, in one run.

    python benchmarks/allreduce.py                 # writes benchmarks/results/allreduce.{json,png}

Part 1 (2 ranks on this machine, started by Parallax's launcher): for 1, 16
and 64 MB of float32, the time of ``comm.Allreduce(MPI.IN_PLACE, ...)`` on a
numpy array (raw), and of Parallax's ``mpi`` backend op inside a TensorFlow
graph summing the same bytes computed by the graph: as one tensor, as two
(in one op), and as 64 small ones (summed together: one call), with the compiled op
(:mod:`parallax.comm.native`), the two tensors once more without its huge-page
advice, and once more through the ``PyFunc`` it replaces. The measurements take
turns in rounds, in the same processes, with TensorFlow's threads set as
``parallel_run`` sets them; a speed is the median over the rounds of raw's time
divided by the variant's (each time the median of its round's repetitions).

Part 2: steps/s of a small MLP trained by ``parallel_run`` in MPI mode with 1
and 2 ranks (the same per-rank batch, so 2 ranks process twice the examples).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common import read_json, write_json  # noqa: E402

SIZES_MB = (1, 16, 64)
#: Measurements alternate in this many rounds (each of reps / ROUNDS repetitions).
ROUNDS = 10


# --------------------------------------------------------------------------- #
# Part 1: runs in every rank
# --------------------------------------------------------------------------- #

#: In-graph variants: how many tensors carry the bytes (one; two in one op, one MPI call when each is under
#: FUSE_BELOW_BYTES; 64 small ones, summed together),
#: whether the compiled op sums them (else the PyFunc), and whether it asks for huge pages.
VARIANTS = (("in_graph", 1, True, True), ("in_graph_fused", 2, True, True), ("in_graph_packed", 64, True, True),
            ("in_graph_fused_small_pages", 2, True, False), ("in_graph_fused_python", 2, False, True))


def comm_worker(out: str, reps: int) -> None:
    import numpy as np
    import tensorflow as tf
    from mpi4py import MPI

    from parallax.comm.mpi import MPIBackend, import_bound
    from parallax.comm.native import native_ops
    from parallax.invocation import current
    from parallax.plan.model import CommSpec

    comm = MPI.COMM_WORLD
    root = current().cache_root()  # where this benchmark's process keeps the compiled op (PARALLAX_CACHE_DIR)
    # as parallel_run sets them for ranks sharing a host's cores
    threads = max(1, (os.cpu_count() or 1) // comm.size) if comm.size > 1 else 0
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
    results = []
    for mb in SIZES_MB:
        n = mb * 1024 * 1024 // 4
        buf = np.ones(n, np.float32)
        sessions, releases = {}, []
        for variant, pieces, native, huge_pages in VARIANTS:
            graph = tf.Graph()
            with graph.as_default():
                v = tf.Variable(tf.ones([n]), name="v")
                w = tf.Variable(tf.ones([n]), name="w")
                g = v.read_value() + w.read_value()  # a new buffer each step, as a gradient is
                parts = tf.split(g, pieces) if pieces > 1 else [g]
                if pieces > 1:  # each part its own buffer, as separate gradients are (Grappler removes
                    parts = [p * 2.0 for p in parts]  # a "* 1.0 + 0.0", which left views of g)
                backend = MPIBackend(CommSpec(fusion_bytes=1 << 40), comm.size)
                summed = backend.allreduce_sum(parts)
                probe = tf.add_n([s[:1] for s in summed])
                baseline = tf.add_n([p[:1] for p in parts])
            run_graph, release = import_bound(graph, backend, native_ops=native, huge_pages=huge_pages,
                                              cache_root=root)
            releases.append(release)
            sess = tf.compat.v1.Session(graph=run_graph, config=config)
            sess.run([run_graph.get_operation_by_name(f"{name}/Assign") for name in ("v", "w")])
            probe_t, base_t = run_graph.get_tensor_by_name(probe.name), run_graph.get_tensor_by_name(baseline.name)
            if abs(float(sess.run(probe_t)[0]) - 2.0 * pieces * comm.size * (2 if pieces > 1 else 1)) > 1e-3:
                raise SystemExit(f"{variant}: wrong sum {sess.run(probe_t)}")
            sessions[variant] = (sess, probe_t, base_t)
        # rounds of every measurement in turn, so that the box's drift reaches each the same; each
        # round gives a ratio to raw, and the speed reported is the median of the rounds' ratios
        rounds: list[dict[str, float]] = []

        def timed(fn, count: int) -> float:
            comm.Barrier()
            seconds = []
            for _ in range(count):
                t0 = time.perf_counter()
                fn()
                seconds.append(time.perf_counter() - t0)
            return float(np.median(seconds)) * 1e3

        # small sizes take more repetitions: their medians are tenths of a millisecond
        per_round = max(3, reps * max(1, 16 // mb) // ROUNDS)
        ops = native_ops(root)
        in_place = {variant: [0, 0] for variant in sessions}  # fused calls summed where they lay, all fused calls
        for _ in range(ROUNDS):
            got = {"raw_mpi4py": timed(lambda buf=buf: comm.Allreduce(MPI.IN_PLACE, buf), per_round)}
            for variant, (sess, probe_t, base_t) in sessions.items():
                before = ops.fused_counts() if ops else (0, 0)
                total = timed(lambda s=sess, t=probe_t: s.run(t), per_round)
                after = ops.fused_counts() if ops else (0, 0)
                in_place[variant][0] += after[0] - before[0]
                in_place[variant][1] += after[0] + after[1] - before[0] - before[1]
                got[variant] = total - timed(lambda s=sess, t=base_t: s.run(t), per_round)  # the graph's own cost
            rounds.append(got)
        for sess, _, _ in sessions.values():
            sess.close()
        for release in releases:
            release()
        row = {"megabytes": mb, "rounds": len(rounds),
               "fused_in_place": {v: f"{done} of {calls}" for v, (done, calls) in in_place.items() if calls}}
        for key in rounds[0]:
            row[key] = float(np.median([r[key] for r in rounds]))
            row[f"speed_{key}"] = float(np.median([r["raw_mpi4py"] / max(r[key], 1e-6) for r in rounds]))
        results.append(row)
    if comm.rank == 0:
        write_json(out, results)


# --------------------------------------------------------------------------- #
# Part 2: a training script run through parallel_run
# --------------------------------------------------------------------------- #

def train_worker(resource: str, out: str, steps: int, batch: int) -> None:
    import numpy as np
    import tensorflow as tf

    import parallax
    from benchmarks.common import batch as make_batch
    from benchmarks.common import mlp

    graph = tf.Graph()
    with graph.as_default():
        x, y, loss = mlp()
        train = tf.compat.v1.train.MomentumOptimizer(0.01, 0.9).minimize(loss)
    config = parallax.Config(run_option="MPI")
    sess, num_workers, worker_id, _ = parallax.parallel_run(graph, resource, parallax_config=config)
    xs, ys = make_batch(worker_id, batch)
    feed = {x: [xs], y: [ys]}
    for _ in range(5):
        sess.run(train, feed_dict=feed)
    t0 = time.perf_counter()
    for _ in range(steps):
        sess.run(train, feed_dict=feed)
    seconds = time.perf_counter() - t0
    if worker_id == 0:
        params = sum(int(np.prod(v.shape)) for v in graph.get_collection("trainable_variables"))
        write_json(out, {"ranks": num_workers, "steps_per_s": steps / seconds,
                         "examples_per_s": steps * batch * num_workers / seconds, "parameters": params,
                         "batch_per_rank": batch})
    sess.close()


# --------------------------------------------------------------------------- #
# Driver
# --------------------------------------------------------------------------- #

#: Issue 16's targets: the fused in-graph all-reduce's speed as a fraction of raw mpi4py's, per size.
TARGETS = {1: 0.7, 16: 0.9, 64: 0.9}
LABELS = {"raw_mpi4py": "raw mpi4py Allreduce (in place)", "in_graph": "in graph, 1 tensor",
          "in_graph_fused": "in graph, 2 tensors (one op)", "in_graph_packed": "in graph, 64 tensors (one op)",
          "in_graph_fused_small_pages": "in graph, 2 tensors, no huge pages",
          "in_graph_fused_python": "in graph, 2 tensors, through Python (PyFunc)"}


def _plot(data: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = 2 if data.get("training") else 1
    fig, axes = plt.subplots(1, panels, figsize=(5.5 * panels + 0.5, 4.2), squeeze=False)
    left = axes[0][0]
    rows = data["allreduce_2_ranks"]
    sizes = [r["megabytes"] for r in rows]
    width = 0.8 / len(LABELS)
    for i, (key, label) in enumerate(LABELS.items()):
        left.bar([j + (i - (len(LABELS) - 1) / 2) * width for j in range(len(sizes))],
                 [r[f"speed_{key}"] for r in rows], width, label=label)
    for j, size in enumerate(sizes):
        left.hlines(TARGETS[size], j - 0.4, j + 0.4, colors="black", linestyles="dashed")
    left.set_xticks(range(len(sizes)), [f"{s} MB" for s in sizes])
    left.set_ylabel("speed relative to raw mpi4py (higher is better)")
    left.set_title("All-reduce of float32, 2 ranks on localhost\n(dashed: target for the fused call)", fontsize=10)
    left.legend(fontsize=7)
    if panels == 2:
        right = axes[0][1]
        train = data["training"]
        labels = [f"{t['ranks']} rank{'s' if t['ranks'] > 1 else ''}" for t in train]
        right.bar(labels, [t["examples_per_s"] for t in train], color="tab:green")
        for i, t in enumerate(train):
            right.text(i, t["examples_per_s"], f"{t['steps_per_s']:.0f} steps/s", ha="center", va="bottom")
        right.set_ylabel("examples / s")
        first = train[0]
        right.set_title(f"MPI mode, MLP {first['parameters'] / 1e6:.2f}M params, "
                        f"batch {first['batch_per_rank']}/rank", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def _run_comm(work: str, reps: int) -> list[dict]:
    from parallax.launch.launcher import launch
    from parallax.launch.layout import ranks_per_device
    from parallax.resources.files import parse_resource_text

    print("part 1: all-reduce, 2 ranks ...", flush=True)
    comm_out = os.path.join(work, "comm.json")
    ranks = ranks_per_device(parse_resource_text("localhost: cpu:0,cpu:1\n"))
    result = launch(ranks, [os.path.abspath(__file__), "comm", "--out", comm_out, "--reps", str(reps)])
    if result.returncode != 0:
        raise SystemExit(f"all-reduce benchmark failed: {result.failure}")
    return read_json(comm_out)


def _run_training(work: str, steps: int) -> list[dict]:
    training = []
    for n in (1, 2):
        print(f"part 2: training with {n} rank(s) ...", flush=True)
        resource = os.path.join(work, f"resources_{n}")
        with open(resource, "w") as f:
            f.write("localhost: " + ",".join(f"cpu:{i}" for i in range(n)) + "\n")
        out = os.path.join(work, f"train_{n}.json")
        done = subprocess.run([sys.executable, os.path.abspath(__file__), "train", "--resource_info", resource,
                               "--out", out, "--steps", str(steps)], cwd=work)
        if done.returncode != 0 or not os.path.exists(out):
            raise SystemExit(f"training benchmark with {n} rank(s) failed (exit code {done.returncode}); its "
                             f"files are in {work}")
        training.append(read_json(out))
    return training


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command")
    c = sub.add_parser("comm")
    c.add_argument("--out", required=True)
    c.add_argument("--reps", type=int, default=20)
    t = sub.add_parser("train")
    t.add_argument("--resource_info", required=True)
    t.add_argument("--out", required=True)
    t.add_argument("--steps", type=int, default=200)
    t.add_argument("--batch", type=int, default=64)
    parser.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--reps", type=int, default=30)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--part", choices=("all", "allreduce", "training"), default="all",
                        help="run only part 1 (allreduce) or part 2 (training)")
    args = parser.parse_args()
    if args.command == "comm":
        return comm_worker(args.out, args.reps)
    if args.command == "train":
        return train_worker(args.resource_info, args.out, args.steps, args.batch)

    os.makedirs(args.results, exist_ok=True)
    work = tempfile.mkdtemp(prefix="parallax_bench_")
    comm_rows = _run_comm(work, args.reps) if args.part in ("all", "allreduce") else []
    training = _run_training(work, args.steps) if args.part in ("all", "training") else []
    data = {"machine": {"cpus": os.cpu_count(), "platform": platform.platform()},
            "allreduce_2_ranks": comm_rows, "training": training, "targets": {}}
    missed = []
    if comm_rows:
        print(f"\n{'MB':>4} {'raw ms':>8}" + "".join(f" {k.replace('in_graph', 'graph'):>16}" for k in LABELS
                                                       if k != "raw_mpi4py") + "   (ms, and speed vs raw)")
        for r in comm_rows:
            print(f"{r['megabytes']:>4} {r['raw_mpi4py']:>8.2f}" + "".join(
                f" {r[k]:>8.2f} {r[f'speed_{k}']:>6.2f}x" for k in LABELS if k != "raw_mpi4py"))
        for r in comm_rows:
            target, got = TARGETS[r["megabytes"]], r["speed_in_graph_fused"]
            met = got >= target
            data["targets"][f"fused_{r['megabytes']}MB"] = {"target": target, "measured": got, "met": met}
            print(f"target: fused in-graph all-reduce at {r['megabytes']} MB >= {target:.1f}x raw: "
                  f"{got:.2f}x {'met' if met else 'MISSED'}")
            if r.get("fused_in_place"):
                print("  rank 0's fused calls summed where the inputs lay (no copy): " +
                      ", ".join(f"{k.replace('in_graph', 'graph')} {v}" for k, v in r["fused_in_place"].items()))
            if not met:
                missed.append(f"{r['megabytes']} MB")
    if training:
        data["training_speedup_2_over_1_examples"] = training[1]["examples_per_s"] / training[0]["examples_per_s"]
        for t in training:
            print(f"{t['ranks']} rank(s): {t['steps_per_s']:.1f} steps/s, {t['examples_per_s']:.0f} examples/s")
    name = "allreduce" if args.part == "all" else f"allreduce_{args.part}"
    json_path = os.path.join(args.results, f"{name}.json")
    write_json(json_path, data)
    png_path = os.path.join(args.results, f"{name}.png")
    if comm_rows:
        _plot(data, png_path)
    print(f"\nwrote {json_path}" + (f" and {png_path}" if comm_rows else ""))
    if missed:
        raise SystemExit(f"all-reduce target missed at {', '.join(missed)} (see above)")


if __name__ == "__main__":
    main()
