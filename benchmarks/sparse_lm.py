"""The sparse language model in PS, MPI and HYBRID mode at 2 and 3 ranks: words/s and bytes sent per step.

    python benchmarks/sparse_lm.py            # writes benchmarks/results/sparse_lm.{json,png}
    python benchmarks/sparse_lm.py --quick    # a small smoke run; results in a temporary directory
    python benchmarks/sparse_lm.py --ranks 3 --modes MPI --mpirun_options "--mca mpi_yield_when_idle 1" \
        --out_dir /tmp/yield                  # extra mpirun options for every job

The model is ``examples/sparse_lm/lm_train.py`` (100k-word embedding, LSTM,
sampled softmax; the embedding and the softmax weights get sparse gradients),
batch 32 x 10 words per replica, Adagrad. Every job runs the same steps on this
machine, one replica per worker process:

* MPI, N ranks: ``localhost: cpu:0,...,cpu:N-1``, one process per device.
* HYBRID, N ranks: the same file; Parallax adds one parameter server per host
  for the variables it serves (it logs when it runs the job as MPI or PS instead,
  and the table's ``ran as`` column says what it did).
* PS, N workers: N lines ``localhost: cpu:i``, plus one parameter server.

Bytes per step are measured, not estimated: each job runs in its own network
namespace that has only loopback (``unshare -n``; needs root), with MPI forced
onto TCP (``--mca btl self,tcp``) instead of shared memory, so every byte any
process of the job sends to another crosses ``lo``. Worker 0 reads the ``lo``
TX counter of ``/proc/net/dev`` after the warm-up steps and after the timed
steps: the difference over the steps is the job's traffic per step (all
processes together, parameter servers' replies included; "per worker" divides
it by the number of worker processes). Without a namespace the counter would
include the rest of the machine, so the figure is then left empty (null)
rather than wrong.

Words/s: words of every replica of the job per second, timed on worker 0.
The plan's own estimate (``estimated_bytes_per_worker``, from
``parallax.preview_plan``) is recorded beside the measurement: it counts what
each worker sends, not the servers' replies.

With more processes than cores, Parallax's launcher adds ``--oversubscribe``
and ``--mca mpi_yield_when_idle 1`` (without the latter, Open MPI's busy
polling starved the rank being waited for: MPI at 3 ranks on 2 cores ran ~8x
slower).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.join(ROOT, "examples", "sparse_lm"))
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common import RESULTS, read_json, write_json  # noqa: E402

MODES = ("PS", "MPI", "HYBRID")
MPIRUN_OPTIONS = "--mca btl self,tcp"  # no shared memory: MPI's bytes go over loopback too


# --------------------------------------------------------------------------- #
# One job (runs in every process of the job)
# --------------------------------------------------------------------------- #


def loopback_tx_bytes() -> int:
    """Bytes sent over ``lo`` in this network namespace so far."""
    with open("/proc/net/dev") as f:
        for line in f:
            name, _, counters = line.partition(":")
            if name.strip() == "lo":
                return int(counters.split()[8])
    raise RuntimeError("no 'lo' interface in /proc/net/dev")


def job(args: argparse.Namespace) -> None:
    import logging

    import numpy as np
    import tensorflow as tf
    from lm_train import build_graph, make_corpus, shard_batches

    import parallax
    from parallax.launch.bootstrap import LAUNCH_ENV
    from parallax.launch.layout import layout_from_json

    tf.get_logger().setLevel(logging.ERROR)
    graph, t = build_graph(args.vocab, args.dim, args.hidden, args.batch, args.seq_len, args.num_sampled, seed=1)
    config = parallax.Config(run_option=args.mode)
    config.communication_config.mpi_config.mpirun_options = f"{MPIRUN_OPTIONS} {args.mpirun_options}".strip()
    sess, num_workers, worker_id, replicas = parallax.parallel_run(graph, args.resource_info, sync=True,
                                                                   parallax_config=config)
    estimate = parallax.preview_plan(graph, args.resource_info, True, config).bytes_per_worker if worker_id == 0 \
        else None
    corpus = make_corpus(args.vocab, args.corpus_sequences, args.seq_len, seed=1)
    readers = [shard_batches(corpus, args.batch, worker_id * replicas + r, num_workers * replicas)
               for r in range(replicas)]

    def step() -> float:
        batches = [next(reader) for reader in readers]
        losses, _ = sess.run([t.loss, t.train_op],
                             feed_dict={t.inputs: [b[0] for b in batches], t.targets: [b[1] for b in batches]})
        return float(np.mean(losses))

    first_loss = step()
    for _ in range(args.warmup):
        step()
    tx0 = loopback_tx_bytes()
    t0 = time.perf_counter()
    for _ in range(args.steps):
        last_loss = step()
    seconds = time.perf_counter() - t0
    tx1 = loopback_tx_bytes()
    if worker_id == 0:
        launch = json.loads(os.environ.get(LAUNCH_ENV, "null"))
        ranks = layout_from_json(launch["ranks"]) if launch else ()
        write_json(args.out, {
            "ran_as": launch["run_option"] if launch else "in-process",
            "processes": len(ranks) or 1,
            "servers": sum(1 for r in ranks if r.role == "ps"),
            "workers": num_workers,
            "replicas_per_worker": replicas,
            "seconds": seconds,
            "loopback_bytes": tx1 - tx0,
            "estimated_bytes_per_worker": estimate,
            "loss_first": first_loss,
            "loss_last": last_loss,
        })
    sess.close()


# --------------------------------------------------------------------------- #
# The driver
# --------------------------------------------------------------------------- #


@functools.lru_cache(maxsize=1)
def namespace_prefix() -> tuple[str, ...]:
    """``unshare -n`` with loopback up (as tests/multiprocess/harness.py), or ``()`` where not allowed."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if not unshare or not ip:
        return ()
    try:
        probe = subprocess.run([unshare, "-n", "sh", "-c", f"{ip} link set lo up"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if probe.returncode != 0:
        return ()
    return (unshare, "-n", "sh", "-c", f'{ip} link set lo up && exec "$@"', "parallax-netns")


def resource_text(mode: str, ranks: int) -> str:
    if mode == "PS":  # one worker process per line, one replica each; Parallax adds the server
        return "".join(f"localhost: cpu:{i}\n" for i in range(ranks))
    return "localhost: " + ",".join(f"cpu:{i}" for i in range(ranks)) + "\n"


def run_job(mode: str, ranks: int, args: argparse.Namespace, work: str) -> dict:
    """Run one job and return its row (``error`` set when it failed)."""
    name = f"{mode.lower()}_{ranks}"
    resource = os.path.join(work, f"{name}.resources")
    with open(resource, "w") as f:
        f.write(resource_text(mode, ranks))
    out, log = os.path.join(work, f"{name}.json"), os.path.join(work, f"{name}.log")
    argv = [*namespace_prefix(), sys.executable, os.path.abspath(__file__), "job", "--mode", mode,
            "--resource_info", resource, "--out", out, "--steps", str(args.steps), "--warmup", str(args.warmup),
            "--vocab", str(args.vocab), "--dim", str(args.dim), "--hidden", str(args.hidden),
            "--batch", str(args.batch), "--seq_len", str(args.seq_len), "--num_sampled", str(args.num_sampled),
            "--corpus_sequences", str(args.corpus_sequences), f"--mpirun_options={args.mpirun_options}"]
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    row = {"mode": mode, "ranks": ranks, "words_per_sec": None, "steps_per_sec": None, "bytes_per_step": None,
           "bytes_per_step_per_worker": None, "vocab": args.vocab, "batch": args.batch, "seq_len": args.seq_len,
           "steps": args.steps, "mpirun_options": f"{MPIRUN_OPTIONS} {args.mpirun_options}".strip()}
    start = time.monotonic()
    with open(log, "w") as logfile:
        proc = subprocess.Popen(argv, stdout=logfile, stderr=subprocess.STDOUT, env=env, cwd=work,
                                start_new_session=True)
        try:
            returncode = proc.wait(timeout=args.timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            returncode = None
    row["wall_seconds"] = round(time.monotonic() - start, 1)
    if returncode != 0 or not os.path.exists(out):
        with open(log, errors="replace") as f:
            tail = f.read()[-3000:]
        why = f"timed out after {args.timeout} s" if returncode is None else f"exit code {returncode}"
        row["error"] = why
        print(f"    FAILED ({why}); the end of its output:\n" + "\n".join("    | " + line for line in
                                                                          tail.splitlines()[-25:]), flush=True)
        return row
    r = read_json(out)
    words = args.batch * args.seq_len * r["workers"] * r["replicas_per_worker"] * args.steps
    row.update(words_per_sec=words / r["seconds"], steps_per_sec=args.steps / r["seconds"],
               ran_as=r["ran_as"], processes=r["processes"], servers=r["servers"], workers=r["workers"],
               replicas_per_worker=r["replicas_per_worker"], loss_first=r["loss_first"], loss_last=r["loss_last"],
               estimated_bytes_per_worker=r.get("estimated_bytes_per_worker"))
    if namespace_prefix():
        row["bytes_per_step"] = r["loopback_bytes"] / args.steps
        row["bytes_per_step_per_worker"] = row["bytes_per_step"] / r["workers"]
    return row


def _plot(rows: list[dict], path: str, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = list(dict.fromkeys(r["mode"] for r in rows))
    ranks = sorted({r["ranks"] for r in rows})
    width = 0.8 / max(1, len(modes))
    colors = {"PS": "tab:orange", "MPI": "tab:blue", "HYBRID": "tab:green"}
    fig, panels = plt.subplots(1, 2, figsize=(11, 4.2))
    for ax, key, label, scale in ((panels[0], "words_per_sec", "words / s (whole job)", 1e3),
                                  (panels[1], "bytes_per_step", "bytes over loopback per step (MB)", 1e6)):
        for m, mode in enumerate(modes):
            xs, heights = [], []
            for i, n in enumerate(ranks):
                row = next((r for r in rows if r["mode"] == mode and r["ranks"] == n), None)
                x = i + (m - (len(modes) - 1) / 2) * width
                if row is None or row[key] is None:
                    ax.text(x, 0, "n/a", ha="center", va="bottom", fontsize=8)
                    continue
                xs.append(x)
                heights.append(row[key] / scale)
            bars = ax.bar(xs, heights, width, label=mode, color=colors.get(mode))
            ax.bar_label(bars, fmt="%.1f", fontsize=8)
        ax.set_xticks(range(len(ranks)), [f"{n} ranks" for n in ranks])
        ax.set_ylabel(label.replace("words / s", "thousand words / s"))
        ax.legend()
    panels[0].set_title("Throughput")
    panels[1].set_title("Traffic between processes")
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _table(rows: list[dict]) -> str:
    def fmt(v, spec):
        return "n/a" if v is None else format(v, spec)

    lines = [f"{'mode':<7} {'ranks':>5} {'ran as':<10} {'procs':>5} {'words/s':>9} {'steps/s':>8} "
             f"{'bytes/step':>11} {'per worker':>11} {'plan est.':>10} {'loss':>14}"]
    for r in rows:
        if "error" in r:
            lines.append(f"{r['mode']:<7} {r['ranks']:>5}  failed: {r['error']}")
            continue
        lines.append(f"{r['mode']:<7} {r['ranks']:>5} {r['ran_as']:<10} {r['processes']:>5} "
                     f"{fmt(r['words_per_sec'], '9.0f')} {fmt(r['steps_per_sec'], '8.1f')} "
                     f"{fmt(r['bytes_per_step'], '11,.0f')} {fmt(r['bytes_per_step_per_worker'], '11,.0f')} "
                     f"{fmt(r.get('estimated_bytes_per_worker'), '10,.0f')} "
                     f"{r['loss_first']:6.2f} -> {r['loss_last']:4.2f}")
    return "\n".join(lines)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job", nargs="?", choices=["job"], help="(internal) run one job's process")
    parser.add_argument("--mode", help="(job) the run option")
    parser.add_argument("--resource_info", help="(job) the resource file")
    parser.add_argument("--out", help="(job) where worker 0 writes its figures")
    parser.add_argument("--steps", type=int, default=None, help="timed steps per job (default 200; --quick 20)")
    parser.add_argument("--warmup", type=int, default=None, help="untimed steps first (default 10; --quick 3)")
    parser.add_argument("--vocab", type=int, default=None, help="default 100000; --quick 10000")
    parser.add_argument("--ranks", default="2,3", help="comma-separated process counts (default 2,3)")
    parser.add_argument("--modes", default=",".join(MODES), help="comma-separated run options (default PS,MPI,HYBRID)")
    parser.add_argument("--quick", action="store_true",
                        help="a small smoke run (vocab 10000, 20 steps), written to a temporary directory")
    parser.add_argument("--out_dir", default=None,
                        help=f"where sparse_lm.json/.png go (default {RESULTS}; --quick: a temporary directory)")
    parser.add_argument("--mpirun_options", default="", help=f"mpirun options added to {MPIRUN_OPTIONS!r}")
    parser.add_argument("--timeout", type=int, default=600, help="seconds before a job is killed")
    parser.add_argument("--dim", type=int, default=64)
    parser.add_argument("--hidden", type=int, default=64)
    parser.add_argument("--batch", type=int, default=32, help="sentences per replica and step")
    parser.add_argument("--seq_len", type=int, default=10)
    parser.add_argument("--num_sampled", type=int, default=64)
    parser.add_argument("--corpus_sequences", type=int, default=50_000)
    args = parser.parse_args()
    quick = args.quick
    args.steps = args.steps if args.steps is not None else (20 if quick else 200)
    args.warmup = args.warmup if args.warmup is not None else (3 if quick else 10)
    args.vocab = args.vocab if args.vocab is not None else (10_000 if quick else 100_000)
    if quick and args.timeout == 600:
        args.timeout = 240
    return args


def main() -> None:
    args = parse_args()
    if args.job:
        return job(args)

    modes = [m.strip().upper() for m in args.modes.split(",") if m.strip()]
    ranks = [int(n) for n in args.ranks.split(",") if n.strip()]
    bad = [m for m in modes if m not in ("PS", "MPI", "HYBRID", "AUTO")]
    if bad:
        raise SystemExit(f"--modes: unknown run option(s) {', '.join(bad)}; use PS, MPI, HYBRID, AUTO")
    work = tempfile.mkdtemp(prefix="parallax_bench_sparse_lm_")
    netns = bool(namespace_prefix())
    print(f"sparse LM: vocab {args.vocab}, batch {args.batch} x {args.seq_len} words per replica, "
          f"{args.warmup} warm-up + {args.steps} timed steps per job; jobs in {work}", flush=True)
    if not netns:
        print("no private network namespace here (needs root and unshare -n): bytes per step are not measured",
              flush=True)
    rows = []
    jobs = [(mode, n) for n in ranks for mode in modes]
    for i, (mode, n) in enumerate(jobs, 1):
        print(f"[{i}/{len(jobs)}] {mode}, {n} ranks ...", flush=True)
        row = run_job(mode, n, args, work)
        rows.append(row)
        if "error" not in row:
            traffic = "n/a" if row["bytes_per_step"] is None else f"{row['bytes_per_step'] / 1e6:.2f} MB"
            print(f"    done in {row['wall_seconds']:.0f} s: ran as {row['ran_as']} with {row['processes']} "
                  f"processes, {row['words_per_sec']:.0f} words/s, {traffic} over loopback per step", flush=True)

    out_dir = args.out_dir or (tempfile.mkdtemp(prefix="parallax_sparse_lm_quick_") if args.quick else RESULTS)
    json_path, png_path = os.path.join(out_dir, "sparse_lm.json"), os.path.join(out_dir, "sparse_lm.png")
    write_json(json_path, rows)
    title = (f"Sparse LM (vocab {args.vocab:,}, batch {args.batch}x{args.seq_len} per replica, Adagrad), "
             f"{args.steps} steps, localhost, {os.cpu_count()} cores" + ("" if netns else "; bytes not measured"))
    _plot(rows, png_path, title)
    print()
    print(_table(rows))
    print(f"\nwrote {json_path} and {png_path}")
    if any("error" in r for r in rows):
        raise SystemExit(f"some jobs failed; their logs are in {work}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
