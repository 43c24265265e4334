"""How often ``parallax tune``'s cost model puts the fastest layout first: every candidate measured.

    python benchmarks/tune.py [--models simple,cnn,lm] [--trials N]
        # writes benchmarks/results/tune.{json,csv,png}

For each example program (``examples/``: linear regression, the CNN image classifier, the
sparse LSTM LM) on ``localhost: cpu:0,cpu:1``, ``parallax tune`` runs a trial of *every*
candidate of a reduced space (the ``mpi`` backend, fusion 64 MiB or none), in the cost
model's order, so the fastest layout is known from measurement. Reported per model: where
the fastest stood in the model's order (1: the first choice), and the first position whose
trial was within 5 % of the fastest (timing noise on a shared 2-core machine is a few %).
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common import RESULTS, write_json  # noqa: E402

MODELS = {
    "simple": ("examples/simple/simple_train.py", ["--steps", "60"]),
    "cnn": ("examples/image_classifier/cnn_train.py", ["--steps", "60", "--train_images", "2000", "--log_every",
                                                       "1000"]),
    "lm": ("examples/sparse_lm/lm_train.py", ["--steps", "60", "--vocab", "20000"]),
}
SPACE = {"backend": ["mpi"], "fusion_bytes": [64 * 2**20, 0]}


def tune_model(name: str, trials: int, directory: str) -> dict:
    from parallax.tuning.tuner import tune

    script, args = MODELS[name]
    os.makedirs(directory, exist_ok=True)
    resources = os.path.join(directory, "resources")
    with open(resources, "w") as f:
        f.write("localhost: cpu:0,cpu:1\n")
    report = tune(os.path.join(ROOT, script), resources, ["--resource_info", resources, *args], trials=trials,
                  space=SPACE, warmup=5, steps=30, output=os.path.join(directory, name), store=False)
    measured = [t for t in report.trials if t.ok]
    best = report.best
    within = min(t.candidate.order for t in measured if t.step_seconds <= best.step_seconds * 1.05)
    position = report.trials.index(best) + 1  # tried in this order: the model's, corrected by what was measured
    near = next(i for i, t in enumerate(report.trials, 1) if t.ok and t.step_seconds <= best.step_seconds * 1.05)
    print(report.table(), flush=True)
    return {"model": name, "candidates": len(report.trials) + len(report.untried), "measured": len(measured),
            "fastest": best.candidate.label, "fastest_ms": round(best.step_seconds * 1e3, 3),
            "model_rank_of_fastest": best.candidate.order, "first_within_5pct": within,
            "trial_of_fastest": position, "first_trial_within_5pct": near,
            "trials": [t.row() for t in report.trials]}


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(rows), figsize=(5 * len(rows), 3.6), squeeze=False)
    for ax, row in zip(axes[0], rows):
        done = [t for t in row["trials"] if t["step_ms"] is not None]
        orders = [t["model_order"] for t in done]
        ax.bar(orders, [t["step_ms"] for t in done],
               color=["tab:green" if t["step_ms"] == row["fastest_ms"] else "tab:blue" for t in done])
        ax.set_xlabel("the cost model's order (1 = first tried)")
        ax.set_ylabel("ms per step (measured)")
        ax.set_title(f"{row['model']}: fastest is the model's #{row['model_rank_of_fastest']}", fontsize=9)
    fig.suptitle("parallax tune: every candidate measured, in the cost model's order (2 CPU devices)", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--trials", type=int, default=100, help="at most this many trials per model")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            rows.append(tune_model(name, args.trials, os.path.join(tmp, name)))
    firsts = sum(r["model_rank_of_fastest"] == 1 for r in rows)
    top3 = sum(r["model_rank_of_fastest"] <= 3 for r in rows)
    near = sum(r["first_within_5pct"] == 1 for r in rows)
    in_budget = sum(r["trial_of_fastest"] <= 8 for r in rows)
    near_budget = sum(r["first_trial_within_5pct"] <= 8 for r in rows)
    summary = {"models": len(rows), "fastest_first": firsts, "fastest_in_first_three": top3,
               "first_within_5pct_of_fastest": near, "fastest_within_8_trials": in_budget,
               "within_5pct_within_8_trials": near_budget}
    write_json(os.path.join(RESULTS, "tune.json"), {"summary": summary, "space": SPACE, "models": rows})
    with open(os.path.join(RESULTS, "tune.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["model", "trial", "model_order", "choice", "layout", "processes",
                                               "status", "step_ms", "predicted_comm_ms", "bytes_per_step"])
        writer.writeheader()
        for row in rows:
            for t in row["trials"]:
                writer.writerow({"model": row["model"], **{k: t[k] for k in writer.fieldnames if k in t}})
    plot(rows, os.path.join(RESULTS, "tune.png"))
    print(f"the cost model's first choice was the fastest for {firsts} of {len(rows)} models, among its first "
          f"three for {top3}; its first choice was within 5 % of the fastest for {near}; in the order tune tries "
          f"them, the fastest came within the default 8 trials for {in_budget}, one within 5 % of it for "
          f"{near_budget}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
