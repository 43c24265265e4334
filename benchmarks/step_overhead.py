"""What ``parallel_run``'s step adds around the session's own run, per step (issue 50, item 5).

    python benchmarks/step_overhead.py                 # models A and B (benchmarks/tf2_runs.py), one worker
    python benchmarks/step_overhead.py --models B --steps 30

The program's custom loop: a ``tf.function`` step (Keras 3 model, Adam, binary cross-entropy) through
``parallax.parallel_run`` on one worker (``resource_info`` ``localhost``: the job in this process). Each round
times, one after the other on the same batches: the step as the program calls it (``step(ids, labels)``:
the arguments checked and fed, the session's run, the metrics' sums, the return value rebuilt), the
session's run alone with the same feeds made beforehand (what the step cannot do without), and the same
``tf.function`` called eagerly on one device (the program before Parallax). The overhead is
``(step - run) / step``, the median over the steps. Results: ``benchmarks/results/step_overhead.{json,png}``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks.common import RESULTS, finish_plot, save_results  # noqa: E402
from benchmarks.tf2_runs import BATCH, MODELS, build, examples  # noqa: E402


def measure(model_name: str, steps: int) -> dict:
    """Median milliseconds per step of the three ways (see the module docstring) for ``model_name``."""
    import keras
    import tensorflow as tf

    import parallax

    model = build(model_name, compile_it=False)
    optimizer, loss_fn = keras.optimizers.Adam(1e-3), keras.losses.BinaryCrossentropy()
    x, y = examples(model_name, BATCH * steps)

    @tf.function(input_signature=[tf.TensorSpec([None, x.shape[1]], tf.int32), tf.TensorSpec([None, 1])])
    def train_step(ids, labels):
        with tf.GradientTape() as tape:
            loss = loss_fn(labels, model(ids, training=True))
        optimizer.apply_gradients(zip(tape.gradient(loss, model.trainable_variables), model.trainable_variables))
        return loss

    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write("localhost\n")
    step, _, _, _ = parallax.parallel_run(train_step, f.name, parallax_config=parallax.Config(run_option="MPI"))
    os.unlink(f.name)
    batches = [(x[i:i + BATCH], y[i:i + BATCH]) for i in range(0, len(x), BATCH)]
    fetches = step._fetches  # what the step's run fetches, fed as the step feeds it (one replica)
    inputs = step._traced.inputs
    times: dict[str, list[float]] = {"step": [], "run": [], "eager": []}
    for i, (ids, labels) in enumerate(batches[:3] + batches):
        feeds = {inputs[0]: [ids], inputs[1]: [labels]}
        timed = [("step", step, (ids, labels)), ("run", _run, (step.session, fetches, feeds)),
                 ("eager", train_step, (ids, labels))]
        for name, call, arguments in timed:
            began = time.perf_counter()
            call(*arguments)
            if i >= 3:  # after warming up
                times[name].append((time.perf_counter() - began) * 1000)
    step.close()
    median = {name: statistics.median(values) for name, values in times.items()}
    return {"model": model_name, "description": MODELS[model_name], "steps": steps,
            "step_ms": median["step"], "run_ms": median["run"], "eager_ms": median["eager"],
            "overhead": (median["step"] - median["run"]) / median["step"]}


def _run(session, fetches, feeds):
    return session.run(fetches, feed_dict=feeds)


def plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    names = [f"model {r['model']}" for r in rows]
    width = 0.27
    for k, (key, label) in enumerate([("eager_ms", "tf.function, one device"), ("run_ms", "session run alone"),
                                      ("step_ms", "parallel_run's step")]):
        ax.bar([i + (k - 1) * width for i in range(len(rows))], [r[key] for r in rows], width, label=label)
    for i, r in enumerate(rows):
        ax.annotate(f"+{100 * r['overhead']:.1f} %", (i + width, r["step_ms"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(rows)), names)
    finish_plot(fig, ax, path, "parallel_run's step around the session's run (1 worker)", "ms per step (median)")


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="A,B", help="comma-separated, of A, B")
    parser.add_argument("--steps", type=int, default=20, help="timed steps per model")
    parser.add_argument("--out_dir", default=RESULTS)
    args = parser.parse_args(argv)
    rows = [measure(m, args.steps) for m in args.models.split(",")]
    for r in rows:
        print(f"model {r['model']}: step {r['step_ms']:.2f} ms, session run alone {r['run_ms']:.2f} ms "
              f"(overhead {100 * r['overhead']:.1f} %), tf.function on one device {r['eager_ms']:.2f} ms", flush=True)
    save_results(args.out_dir, "step_overhead", {"rows": rows}, lambda data, path: plot(data["rows"], path))
    return 0


if __name__ == "__main__":
    sys.exit(main())
