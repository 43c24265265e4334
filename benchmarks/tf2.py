"""TensorFlow 2 programs: ``parallax.fit`` beside ``model.fit`` and ``tf.distribute``, in one run: ``make bench-tf2``.

    python benchmarks/tf2.py              # everything, 3 rounds; writes benchmarks/results/tf2.{json,png}
    python benchmarks/tf2.py --quick      # a smoke run (few steps, 1 round), to a temporary directory
    python benchmarks/tf2.py --models A --inputs numpy --runs fit,parallax-mpi,mwms --rounds 1
    python benchmarks/tf2.py --models A --runs parallax-mpi,parallax-hybrid --vocab 400000  # a larger table

Two Keras 3 models (benchmarks/tf2_runs.py), each fed numpy arrays and a ``tf.data`` pipeline with a real map
step, global batch 256, trained for a few epochs by each run: ``model.fit`` in one process (also
with TensorFlow's intra-op pool at 1 and 2 threads: the ceiling of one process), ``parallax.fit`` on 1 worker
and on 2 worker processes in MPI, HYBRID and AUTO, the same model by a custom ``tf.function`` loop through
``parallax.parallel_run`` (2 workers, MPI), ``MirroredStrategy`` over two logical CPU devices, and
``MultiWorkerMirroredStrategy`` over two processes on localhost (with the model built in tf_keras: Keras 3's
``model.fit`` fails under that strategy in TensorFlow 2.21, keras-team/keras#20585; ``--runs mwms-keras3`` shows
it; ``fit-tfkeras`` is tf_keras's ``model.fit`` in one process); Horovod (``.venv-horovod``) when built, else
recorded as not measured. The runs are in benchmarks/tf2_runs.py.

Each run is a process of its own (this script again, with the run's name), killed after ``--timeout``, in a
private network namespace when one can be made (``benchmarks/common.py``). Its figure is the steps per second
of its fastest epoch after the first (which pays for tracing and starting the job), and beside it the steps
within its epochs (from an epoch's first batch's end to its last's: without the epoch's start and end, where
TensorFlow sometimes pauses about 0.5 s replacing the epoch's ``tf.data`` iterator, ``model.fit`` as much as
Parallax); each ratio is to ``model.fit`` of the same model and input in the same round, and the result is the
median over ``--rounds``.
A run that fails (a crash, or Parallax refusing the program) is recorded with its error, and the
benchmark goes on. On a 2-core machine the two workers of a job share the two cores that ``model.fit`` has to
itself: read the ratios as overhead, not scaling.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import shutil
import statistics
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common import RESULTS, namespace_prefix, read_json, run_logged, write_json  # noqa: E402
from benchmarks.tf2_runs import INPUTS, MODELS, NOT_BY_DEFAULT, RUNS, VOCAB, processes  # noqa: E402

LABELS = {"fit": "model.fit", "fit-1thread": "model.fit, 1 thread", "fit-2threads": "model.fit, 2 threads",
          "fit-tfkeras": "tf_keras model.fit", "mwms-keras3": "MultiWorkerMirroredStrategy x2, Keras 3",
          "parallax-1": "parallax.fit, 1 worker", "parallax-mpi": "parallax.fit MPI x2",
          "parallax-mpi-zero": "parallax.fit MPI x2, zero_stage=1",
          "parallax-hybrid": "parallax.fit HYBRID x2", "parallax-auto": "parallax.fit AUTO x2",
          "loop-mpi": "tf.function loop, parallel_run MPI x2", "mirrored": "MirroredStrategy, 2 logical CPUs",
          "mwms": "MultiWorkerMirroredStrategy x2, tf_keras", "horovod": "Horovod x2",
          "parallax-mpi-x3": "parallax.fit MPI x3", "parallax-hybrid-x3": "parallax.fit HYBRID x3",
          "parallax-auto-x3": "parallax.fit AUTO x3", "mwms-x3": "MultiWorkerMirroredStrategy x3, tf_keras",
          "horovod-x3": "Horovod x3"}
REFERENCE = "fit"
HOROVOD_PYTHON = os.path.join(ROOT, ".venv-horovod", "bin", "python")
HOROVOD_MISSING = "not measured: .venv-horovod missing (make horovod-venv)"
#: What ``--quick`` runs unless --models, --inputs or --runs say otherwise: each kind of job once, in about 3 minutes.
QUICK_JOBS = [("A", "numpy", run) for run in ("fit", "loop-mpi", "mirrored", "mwms", "horovod")] + \
    [("A", "tfdata", "fit"), ("A", "tfdata", "parallax-mpi"), ("B", "tfdata", "fit")]


def _error_text(log: str) -> str:
    """The last exception line of a run's log (``ValueError: ...`` / ``parallax.errors.AnalysisError: ...``),
    with the lines that continue it, or the log's last line."""
    lines = log.rstrip().splitlines()
    for i in range(len(lines) - 1, -1, -1):
        if re.match(r"^([\w.]+\.)?[A-Z]\w*(Error|Exception|Exit)\b:?", lines[i]):
            return "\n".join(lines[i:i + 6])[:2000]
    return lines[-1][:2000] if lines else ""


def run_one(run: str, model: str, form: str, args, work: str, round_: int) -> dict:
    """One run in its own process; its row: ``steps_per_sec`` (its fastest epoch after the first) or ``error``."""
    row = {"run": run, "label": LABELS[run], "model": model, "input": form, "round": round_}
    if run.startswith("horovod") and not os.access(HOROVOD_PYTHON, os.X_OK):
        row["error"] = HOROVOD_MISSING
        return row
    name = f"{model}_{form}_{run}_{round_}"
    out, log = os.path.join(work, f"{name}.json"), os.path.join(work, f"{name}.log")
    argv = [sys.executable, os.path.abspath(__file__), "run", "--run", run, "--model", model, "--input", form,
            "--out", out, "--examples", str(args.examples[model]), "--epochs", str(args.epochs),
            "--vocab", str(args.vocab)]
    if run.startswith(("parallax", "loop")):
        resources = os.path.join(work, f"{name}.resources")
        with open(resources, "w") as f:  # one line per worker
            f.write("".join(f"localhost: cpu:{i}\n" for i in range(processes(run))))
        argv += ["--resource_info", resources]
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    if os.geteuid() == 0:
        env.update(OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    code, row["wall_seconds"] = run_logged(argv, log, env, work, args.timeout)
    if code != 0 or not os.path.exists(out):
        with open(log, errors="replace") as f:
            text = f.read()
        row["error"] = (f"timed out after {args.timeout} s" if code is None else f"exit code {code}") + \
            (": " + _error_text(text) if code is not None else "")
        row["log_tail"] = text[-3000:]
        return row
    result = read_json(out)
    later = result["epochs"][1:] or result["epochs"]
    best = max(later, key=lambda e: e["steps"] / e["seconds"])
    row.update(workers=result.get("workers"), epochs=result["epochs"], steps=best["steps"],
               steps_per_sec=best["steps"] / best["seconds"], loss_last=result["epochs"][-1]["loss"])
    within = [(e["steps"] - 1) / e["within"] for e in later if e.get("within")]
    if within:  # the steps between an epoch's first and last: without its start and end (TensorFlow's iterators)
        row["within_steps_per_sec"] = max(within)
    return row


def summarize(rows: list[dict], rounds: int) -> list[dict]:
    """Per model, input and run: the median steps/s over the rounds, each round's ratio to ``model.fit`` of the
    same model and input in that round, and their median."""
    summary = []
    keys = list(dict.fromkeys((r["model"], r["input"], r["run"]) for r in rows))
    for model, form, run in keys:
        mine = [r for r in rows if (r["model"], r["input"], r["run"]) == (model, form, run)]
        ok = [r for r in mine if "error" not in r]
        entry = {"model": model, "input": form, "run": run, "label": LABELS[run], "rounds": len(mine)}
        if not ok:
            entry["error"] = mine[-1]["error"]
            summary.append(entry)
            continue
        ratios, within_ratios = [], []
        for r in ok:
            ref = next((s for s in rows if (s["model"], s["input"], s["run"], s["round"]) ==
                        (model, form, REFERENCE, r["round"]) and "error" not in s), None)
            if ref is not None:
                r["ratio"] = r["steps_per_sec"] / ref["steps_per_sec"]
                ratios.append(r["ratio"])
                if "within_steps_per_sec" in r and "within_steps_per_sec" in ref:
                    r["within_ratio"] = r["within_steps_per_sec"] / ref["within_steps_per_sec"]
                    within_ratios.append(r["within_ratio"])
        entry.update(steps_per_sec=statistics.median(r["steps_per_sec"] for r in ok),
                     steps_per_sec_rounds=[r["steps_per_sec"] for r in ok], ratios=ratios,
                     ratio=statistics.median(ratios) if ratios else None,
                     within_ratios=within_ratios,
                     within_ratio=statistics.median(within_ratios) if within_ratios else None)
        if len(ok) < len(mine):
            entry["errors"] = [r["error"] for r in mine if "error" in r]
        summary.append(entry)
    return summary


def table(data: dict) -> str:
    lines = []
    for model in data["models"]:
        for form in data["inputs"]:
            entries = [e for e in data["summary"] if (e["model"], e["input"]) == (model, form)]
            if not entries:
                continue
            lines += [f"### Model {model} ({MODELS[model]}), {INPUTS[form]}", "",
                      "| run | steps/s | vs model.fit | within epochs, vs model.fit |", "|---|---|---|---|"]
            for e in entries:
                if "error" in e:
                    lines.append(f"| {e['label']} | {e['error'].splitlines()[0][:160]} | | |")
                    continue
                ratio, within = _ratios(e["ratio"], e["ratios"]), _ratios(e["within_ratio"], e["within_ratios"])
                lines.append(f"| {e['label']} | {e['steps_per_sec']:.1f} | {ratio} | {within} |")
            lines.append("")
    return "\n".join(lines)


def _ratios(median: float | None, rounds: list[float]) -> str:
    """``0.91x (0.95, 0.87)``: the median ratio and each round's."""
    text = "n/a" if median is None else f"{median:.2f}x"
    return text + (f" ({', '.join(f'{x:.2f}' for x in rounds)})" if len(rounds) > 1 else "")


def plot(data: dict, path: str) -> None:
    """Grouped bars: per model and input, each run's ratio to model.fit (a run that failed: "failed" at 0)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    groups = list(dict.fromkeys((e["model"], e["input"]) for e in data["summary"]))
    colors = {run: plt.get_cmap("tab20")(k % 20) for k, run in enumerate(data["runs"])}
    most = max(sum((e["model"], e["input"]) == g for e in data["summary"]) for g in groups)
    width = 0.85 / max(1, most)
    fig, ax = plt.subplots(figsize=(max(8.0, 0.3 * most * len(groups) + 2), 5.5))
    labelled = set()
    for i, group in enumerate(groups):
        entries = [e for e in data["summary"] if (e["model"], e["input"]) == group]
        for k, e in enumerate(entries):
            x = i + (k - (len(entries) - 1) / 2) * width
            if e.get("ratio") is None:
                error = e.get("error")
                ax.text(x, 0.02, "no model.fit" if error is None else
                        "not measured" if error.startswith("not measured") else "failed",
                        rotation=90, ha="center", va="bottom", fontsize=6, color="gray")
                continue
            bars = ax.bar([x], [e["ratio"]], width, color=colors[e["run"]],
                          label=None if e["run"] in labelled else e["label"])
            labelled.add(e["run"])
            ax.bar_label(bars, fmt="%.2f", fontsize=6, rotation=90, padding=2)
    ax.axhline(1.0, color="black", linewidth=0.6, linestyle="--")
    ax.set_xticks(range(len(groups)), [f"model {m}, {INPUTS[f].split(':')[0]}" for m, f in groups])
    ax.set_ylabel("steps/s relative to model.fit (same round)")
    env = data["environment"]
    ax.set_title(f"TensorFlow 2 programs, global batch {env['global_batch']}, {env['cores']} cores ({env['date']}; "
                 f"median of {env['rounds']} round(s); fastest epoch after the first)", fontsize=9)
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("mode", nargs="?", choices=["run"], help=argparse.SUPPRESS)
    parser.add_argument("--run", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--input", help=argparse.SUPPRESS)
    parser.add_argument("--out", help=argparse.SUPPRESS)
    parser.add_argument("--resource_info", help=argparse.SUPPRESS)
    parser.add_argument("--examples", default=None, help="examples per epoch: N, or A=N,B=M (default A=32768,"
                        "B=8192; --quick A=2048,B=1024)")
    parser.add_argument("--epochs", type=int, default=None, help="epochs per run (default 5; --quick 2)")
    parser.add_argument("--vocab", type=int, default=VOCAB, help=f"rows of the token embedding (default {VOCAB}); "
                        "results go to tf2_vocab<N>.{json,png} when it is not the default")
    parser.add_argument("--models", default=None, help="comma-separated, of A, B (default both)")
    parser.add_argument("--inputs", default=None, help="comma-separated, of numpy, tfdata (default both)")
    parser.add_argument("--runs", default=None, help=f"comma-separated, of {', '.join(RUNS)} (default all but "
                        f"{', '.join(NOT_BY_DEFAULT)}; --quick: each kind of job once, model B by model.fit alone)")
    parser.add_argument("--rounds", type=int, default=None, help="rounds of every run (default 3; --quick 1)")
    parser.add_argument("--quick", action="store_true", help="a smoke run, written to a temporary directory")
    parser.add_argument("--timeout", type=int, default=None, help="seconds before a run is killed "
                        "(default 900; --quick 120)")
    parser.add_argument("--out_dir", default=None, help=f"where results go (default {RESULTS})")
    args = parser.parse_args(argv)
    if args.mode == "run":
        args.examples = int(args.examples)
        return args
    examples = {"A": 2048, "B": 1024} if args.quick else {"A": 32768, "B": 8192}
    for part in (args.examples or "").split(","):
        key, sep, value = part.strip().rpartition("=")
        if not part.strip():
            continue
        if not value.isdigit() or (sep and key not in MODELS):
            parser.error(f"--examples {args.examples!r}: expected N or A=N,B=M")
        for model in [key] if sep else list(MODELS):
            examples[model] = int(value)
    args.examples = examples
    args.epochs = args.epochs or (2 if args.quick else 5)
    args.rounds = args.rounds or (1 if args.quick else 3)
    args.timeout = args.timeout or (120 if args.quick else 900)
    chosen = [args.models, args.inputs, args.runs]
    models, inputs, runs = ([x.strip() for x in (given or default).split(",") if x.strip()] for given, default in
                            zip(chosen, (",".join(MODELS), ",".join(INPUTS),
                                         ",".join(r for r in RUNS if r not in NOT_BY_DEFAULT))))
    bad = [m for m in models if m not in MODELS] + [i for i in inputs if i not in INPUTS] + \
        [r for r in runs if r not in RUNS]
    if bad:
        parser.error(f"unknown model(s), input(s) or run(s): {', '.join(bad)}")
    runs = list(dict.fromkeys([REFERENCE, *runs]))  # every ratio is to it
    args.jobs = QUICK_JOBS if args.quick and chosen == [None] * 3 else \
        [(m, f, r) for m in models for f in inputs for r in runs]
    args.models = list(dict.fromkeys(m for m, _, _ in args.jobs))
    args.inputs = list(dict.fromkeys(f for _, f, _ in args.jobs))
    args.runs = list(dict.fromkeys(r for _, _, r in args.jobs))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.mode == "run":
        from benchmarks import tf2_runs

        tf2_runs.run(args)
        return 0
    import tensorflow as tf

    out_dir = args.out_dir or (tempfile.mkdtemp(prefix="parallax_bench_tf2_quick_") if args.quick else RESULTS)
    work = tempfile.mkdtemp(prefix="parallax_bench_tf2_")
    data = {"environment": {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(),
                            "platform": platform.platform(), "python": platform.python_version(),
                            "tensorflow": tf.__version__, "netns": bool(namespace_prefix()), "rounds": args.rounds,
                            "epochs": args.epochs, "examples": args.examples, "global_batch": 256, "vocab": args.vocab,
                            "figure": "steps/s of the fastest epoch after the first; ratio to model.fit in the "
                                      "same round, median over the rounds"},
            "models": {m: MODELS[m] for m in args.models}, "inputs": {i: INPUTS[i] for i in args.inputs},
            "runs": args.runs, "rows": []}
    jobs = args.jobs
    print(f"{len(jobs)} runs x {args.rounds} round(s); logs in {work}", flush=True)
    for round_ in range(args.rounds):
        for n, (model, form, run) in enumerate(jobs):
            row = run_one(run, model, form, args, work, round_)
            data["rows"].append(row)
            head = f"[round {round_ + 1}/{args.rounds}, {n + 1}/{len(jobs)}] model {model} {form:6} {LABELS[run]:>38}"
            if "error" in row:
                print(f"{head}: {row['error'].splitlines()[0][:300]}", flush=True)
            else:
                print(f"{head}: {row['steps_per_sec']:6.1f} steps/s ({row['wall_seconds']:.0f} s)", flush=True)
            write_json(os.path.join(work, "partial.json"), data)
    data["summary"] = summarize(data["rows"], args.rounds)
    stem = "tf2" if args.vocab == VOCAB else f"tf2_vocab{args.vocab}"
    paths = [os.path.join(out_dir, f"{stem}.{ext}") for ext in ("json", "png")]
    write_json(paths[0], data)
    plot(data, paths[1])
    print("\n" + table(data))
    print(f"wrote {', '.join(paths)}")
    failed = [e for e in data["summary"] if "error" in e and e["error"] != HOROVOD_MISSING]
    if failed:
        print(f"{len(failed)} run(s) failed; their logs are in {work}", file=sys.stderr)
    else:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
