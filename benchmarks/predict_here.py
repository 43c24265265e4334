"""The predictor of ``parallax plan --predict`` against this machine: costs fitted at 2 ranks, 3 forecast.

    python benchmarks/predict_here.py [--quick]   # writes benchmarks/results/predict_here.{json,png}

For each workload of ``benchmarks/compare.py`` (the dense CNN, the sparse language model):

1. the single-device step ``T`` and its spread on ``N`` devices of this machine: ``N`` copies of
   the single-device graph side by side (started together), each with the threads a rank of an
   ``N``-rank job gets, every step timed: ``T`` is their mean, the spread their standard deviation;
2. the link inside the host, as ``parallax probe`` measures it (MPI over TCP, as the jobs run);
3. each layout's step at 2 and 3 ranks, measured by compare.py's jobs (MPI, PS, HYBRID);
4. each layout's host costs fitted to its 2-rank step (one measurement: the fixed cost), and
   the 3-rank step forecast from them with ``T`` and the spread of 3 side-by-side devices; the
   bytes-only bound beside it.

Measurements 1 and 3 are taken in turn in each of ``--rounds`` rounds (default 3), and each
figure is the median of its rounds: this VM's speed drifts by 2x over minutes.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common import read_json, write_json  # noqa: E402

LAYOUTS = {"parallax-mpi": "MPI", "parallax-ps": "PS", "parallax-hybrid": "HYBRID"}
CALIBRATION, FORECAST = 2, 3


# --------------------------------------------------------------------------- #
# One single-device process of a side-by-side measurement
# --------------------------------------------------------------------------- #

def single(workload: str, vocab: int, threads: int, warmup: int, steps: int, out: str, go: str) -> None:
    import tensorflow as tf

    from benchmarks.workloads import workload as make

    wl = make(workload, vocab)
    graph = tf.Graph()
    with graph.as_default():
        t = wl.build(lambda opt: opt)
        init = tf.compat.v1.global_variables_initializer()
    config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=threads, inter_op_parallelism_threads=threads)
    with tf.compat.v1.Session(graph=graph, config=config) as sess:
        sess.run(init)
        feeds = [{graph.get_tensor_by_name(f"{k}:0"): v for k, v in feed.items()}
                 for _, feed in zip(range(16), wl.batches(0, 1))]
        for i in range(warmup):
            sess.run(t.train_op, feeds[i % len(feeds)])
        with open(out + ".ready", "w"):
            pass
        while not os.path.exists(go):  # every copy starts its timed steps together
            time.sleep(0.01)
        seconds = []
        for i in range(steps):
            start = time.perf_counter()
            sess.run(t.train_op, feeds[i % len(feeds)])
            seconds.append(time.perf_counter() - start)
    write_json(out, {"seconds": seconds})


def side_by_side(workload: str, devices: int, args, work: str) -> dict:
    """``T`` (mean step) and spread (standard deviation) of ``devices`` single-device copies run together."""
    threads = max(1, (os.cpu_count() or 1) // devices)
    go = os.path.join(work, f"go_{workload}_{devices}")
    outs = [os.path.join(work, f"single_{workload}_{devices}_{i}.json") for i in range(devices)]
    procs = [subprocess.Popen([sys.executable, os.path.abspath(__file__), "single", "--workload", workload,
                               "--vocab", str(args.vocab), "--threads", str(threads), "--warmup", str(args.warmup),
                               "--steps", str(args.steps[workload]), "--out", out, "--go", go]) for out in outs]
    try:
        deadline = time.monotonic() + args.timeout
        while not all(os.path.exists(o + ".ready") for o in outs):
            if time.monotonic() > deadline or any(p.poll() not in (None, 0) for p in procs):
                raise SystemExit(f"the single-device copies of {workload} did not get ready")
            time.sleep(0.05)
        with open(go, "w"):
            pass
        for p in procs:
            if p.wait(timeout=args.timeout) != 0:
                raise SystemExit(f"a single-device copy of {workload} failed (exit code {p.returncode})")
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    seconds = [s for o in outs for s in read_json(o)["seconds"]]
    return {"devices": devices, "threads": threads, "step_time_s": statistics.fmean(seconds),
            "spread_s": statistics.pstdev(seconds), "median_s": statistics.median(seconds)}


# --------------------------------------------------------------------------- #
# Driver
# --------------------------------------------------------------------------- #

def plan_variables(workload: str, vocab: int, work: str) -> list:
    """The predictor's variables of ``workload``, from the plan Parallax makes for it."""
    import tensorflow as tf

    import parallax
    from benchmarks.workloads import workload as make
    from parallax.plan.predict import variables_of_plan

    resource = os.path.join(work, "plan.resources")
    with open(resource, "w") as f:
        f.write("localhost: cpu:0,cpu:1\n")
    graph = tf.Graph()
    with graph.as_default():
        make(workload, vocab).build(lambda opt: opt)
    plan = parallax.preview_plan(graph, resource, True, parallax.Config(run_option="HYBRID"))
    return variables_of_plan(plan.to_dict())


def forecast_rows(workload: str, variables: list, devices: dict[int, dict], measured: dict[tuple[str, int], float],
                  inside) -> list[dict]:
    """Per layout and rank count: measured, bytes-only bound and (at FORECAST) forecast step times."""
    from parallax.plan.predict import ClusterShape, fit_costs, predict

    def cluster(n: int) -> ClusterShape:
        return ClusterShape(1, n, inside, inside)

    rows = []
    for layout in LAYOUTS.values():
        if (layout, CALIBRATION) not in measured:
            continue
        calib = devices[CALIBRATION]
        costs = fit_costs(variables, calib["step_time_s"], {cluster(CALIBRATION): measured[layout, CALIBRATION]},
                          layout, calib["spread_s"])
        for n in (CALIBRATION, FORECAST):
            if (layout, n) not in measured:
                continue
            d = devices[n]
            (bound,) = predict(variables, d["step_time_s"], cluster(n), [layout])
            (fore,) = predict(variables, d["step_time_s"], cluster(n), [layout], {layout: costs}, d["spread_s"])
            rows.append({"workload": workload, "layout": layout, "ranks": n, "calibration": n == CALIBRATION,
                         "measured_s": measured[layout, n], "bound_s": bound.step_s, "forecast_s": fore.step_s,
                         "step_time_s": d["step_time_s"], "spread_s": d["spread_s"], "fixed_s": costs.fixed,
                         "communication_s": bound.communication_s})
    return rows


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    shown = [r for r in rows if not r["calibration"]]
    fig, ax = plt.subplots(figsize=(8, 4.2))
    labels = [f"{r['workload']}\n{r['layout']}" for r in shown]
    xs = range(len(shown))
    for offset, key, label in ((-0.27, "measured_s", "measured"), (0, "forecast_s", "forecast (costs fitted at 2)"),
                               (0.27, "bound_s", "bytes only (a bound)")):
        ax.bar([x + offset for x in xs], [r[key] * 1e3 for r in shown], 0.27, label=label)
    ax.set_xticks(list(xs), labels, fontsize=8)
    ax.set_ylabel(f"ms per step at {FORECAST} ranks")
    ax.set_title(f"parallax plan --predict on this machine: {FORECAST} ranks forecast from {CALIBRATION}", fontsize=10)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=["single"], help=argparse.SUPPRESS)
    parser.add_argument("--workload", help=argparse.SUPPRESS)
    parser.add_argument("--threads", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--go", help=argparse.SUPPRESS)
    # a single-device copy's settings; the driver sets them as compare.py's jobs run (--quick or not)
    parser.add_argument("--vocab", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--steps", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--warmup", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--workloads", default="dense,sparse", help="comma-separated: dense, sparse")
    parser.add_argument("--quick", action="store_true", help="fewer steps, a smaller vocabulary, a temporary directory")
    parser.add_argument("--results", default=os.path.join(ROOT, "benchmarks", "results"))
    parser.add_argument("--timeout", type=int, default=600)
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every measurement; each figure is the "
                        "median of its rounds (default 3; --quick 1)")
    args = parser.parse_args()
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.mode == "single":
        single(args.workload, args.vocab, args.threads, args.warmup, args.steps, args.out, args.go)
        return 0

    from benchmarks import compare
    from parallax.launch.launcher import find_mpirun
    from parallax.launch.probe import probe
    from parallax.plan.predict import Link

    workloads = args.workloads.split(",")
    job_args = compare.parse_args(["--ranks", f"{CALIBRATION},{FORECAST}", "--workloads", args.workloads,
                                   "--timeout", str(args.timeout)] + (["--quick"] if args.quick else []))
    args.vocab, args.warmup, args.steps = job_args.vocab, job_args.warmup, job_args.steps
    work = tempfile.mkdtemp(prefix="parallax_predict_here_")
    results = tempfile.mkdtemp(prefix="parallax_predict_here_out_") if args.quick else args.results
    os.makedirs(results, exist_ok=True)
    link = probe(("localhost", "localhost"), find_mpirun(), mpirun_options=compare.MPI_TCP, timeout=args.timeout)
    inside = Link(link.bandwidth, link.latency)
    print(f"link inside this host (parallax probe, TCP): {link.bandwidth * 8 / 1e9:.3g} Gbit/s, "
          f"{link.latency * 1e6:.3g} us", flush=True)
    rows, devices_all = [], {}
    for workload in workloads:
        # rounds of every measurement in turn (this VM's speed drifts); each figure is the median of its rounds
        singles: dict[int, list[dict]] = {n: [] for n in (CALIBRATION, FORECAST)}
        steps: dict[tuple[str, int], list[float]] = {}
        for round_ in range(args.rounds):
            for n in (CALIBRATION, FORECAST):
                d = side_by_side(workload, n, args, work)
                singles[n].append(d)
                print(f"{workload}, round {round_ + 1}: {n} single-device copies side by side ({d['threads']} "
                      f"thread(s) each): T = {d['step_time_s'] * 1e3:.2f} ms, spread {d['spread_s'] * 1e3:.2f} ms",
                      flush=True)
            for system, layout in LAYOUTS.items():
                for n in (CALIBRATION, FORECAST):
                    row = compare.run_job(system, workload, n, job_args, work)
                    if row.get("error"):
                        raise SystemExit(f"{workload} {layout} at {n} ranks failed: {row['error']}\n"
                                         f"{row.get('log_tail', '')}")
                    steps.setdefault((layout, n), []).append(1.0 / row["steps_per_sec"])
                    print(f"{workload}, round {round_ + 1}: {layout} at {n} ranks: "
                          f"{steps[layout, n][-1] * 1e3:.2f} ms per step", flush=True)
        devices = {n: {key: statistics.median(d[key] for d in ds) for key in ds[0]} for n, ds in singles.items()}
        devices_all[workload] = {n: {**devices[n], "rounds": ds} for n, ds in singles.items()}
        measured = {key: statistics.median(values) for key, values in steps.items()}
        for r in forecast_rows(workload, plan_variables(workload, args.vocab, work), devices, measured, inside):
            rows.append({**r, "measured_rounds_s": steps[r["layout"], r["ranks"]]})
    print(f"\n{'workload':<8} {'layout':<7} {'ranks':>5} {'measured ms':>12} {'forecast ms':>12} {'bound ms':>9} "
          f"{'forecast/measured':>18}")
    for r in rows:
        print(f"{r['workload']:<8} {r['layout']:<7} {r['ranks']:>5} {r['measured_s'] * 1e3:>12.2f} "
              f"{r['forecast_s'] * 1e3:>12.2f} {r['bound_s'] * 1e3:>9.2f} {r['forecast_s'] / r['measured_s']:>18.2f}"
              + ("  (calibration)" if r["calibration"] else ""))
    json_path = os.path.join(results, "predict_here.json")
    write_json(json_path, {"link": {"bandwidth": link.bandwidth, "latency": link.latency},
                           "devices": {w: {str(n): d for n, d in ds.items()} for w, ds in devices_all.items()},
                           "rows": rows, "cpus": os.cpu_count()})
    _plot(rows, os.path.join(results, "predict_here.png"))
    print(f"\nwrote {json_path} and predict_here.png")
    return 0


if __name__ == "__main__":
    sys.exit(main())
