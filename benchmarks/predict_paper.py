"""The predictor of ``parallax plan --predict`` beside the Parallax paper's published figures.

    python benchmarks/predict_paper.py     # writes benchmarks/results/predict_paper.{json,png}

The paper (Kim et al., "Parallax: Sparsity-aware Data Parallel Training of Deep
Neural Networks", EuroSys 2019) trained on 8 machines of 6 TITAN Xp GPUs joined
by 100 Gbit/s InfiniBand. Its abstract: "up to 2.8x, 6.02x speedup for NLP
models than TensorFlow and Horovod with 48 GPUs", and image models "equal to
Horovod and 1.53x faster than TensorFlow". Throughput per GPU count is read
from the bar chart of the authors' repository (snuspl/parallax,
doc/figure/benchmark.png, August 2018, before the paper's final version; read
from pixels, about +-30 images/s and +-1,000 words/s): not the paper's own
tables, which we could not reach.

The models as the repository's examples build them: LM1B (vocabulary 793,470,
embedding 512, LSTM 2048 projected to 512, sampled softmax of 8,192, batch
128 x 20 words per GPU) and ResNet-50 (25.6 M parameters, all dense, batch 64
per GPU). The single-GPU step time is not published: it is set so that the
bytes-only prediction at one machine (6 GPUs) matches the published figure of
one layout (Parallax's HYBRID for LM1B, Horovod for ResNet-50).

Two predictions per figure: the bytes-only bound (no host costs), and the
forecast: each system's host costs (:class:`parallax.plan.predict.HostCosts`)
fitted to its published figures on one and two machines (6 and 12 GPUs), as a
user would measure them on a small cluster, and the model then run for four and
eight machines (24 and 48 GPUs), whose published figures it has not seen.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import write_json  # noqa: E402
from parallax.plan.predict import ClusterShape, Link, VariableCost, fit_costs, predict  # noqa: E402

GPUS_PER_HOST = 6
HOSTS = (1, 2, 4, 8)
#: The machines whose published figures calibrate each system's host costs; the others are forecast.
CALIBRATION_HOSTS = (1, 2)
LINK = Link(100e9 / 8, 5e-6)  # 100 Gbit/s InfiniBand
INSIDE = Link(100e9 / 8, 5e-6)  # PCIe 3.0 x16, about the same
# published (chart) throughput per GPU count: TF PS, Horovod, Parallax PS, Parallax MPI, Parallax HYBRID
PUBLISHED = {
    "LM1B": {6: (87.9e3, 67.7e3, 61.6e3, 76.8e3, 87.9e3), 12: (127.3e3, 46.5e3, 114.1e3, 101.0e3, 149.5e3),
             24: (146.5e3, 42.4e3, 194.9e3, 122.2e3, 249.5e3), 48: (101.0e3, 39.4e3, 230.3e3, 138.4e3, 276.8e3)},
    "ResNet-50": {6: (946, 1054, 973, 1027, 1054), 12: (1811, 2054, 1973, 2027, 2027),
                  24: (3459, 4027, 3865, 3919, 3946), 48: (5946, 7514, 7595, 7514, 7541)},
}
SYSTEMS = ("TF PS", "Horovod", "PS", "MPI", "HYBRID")  # PUBLISHED's order; Horovod is predicted as MPI


def lm1b() -> tuple[list[VariableCost], int]:
    vocab, dim, state = 793_470, 512, 2048
    words = 128 * 20
    sampled = 8192 + words  # the rows of the softmax one step touches (samples and targets, at most)
    return [
        VariableCost("emb", vocab * dim * 4, True, vocab, dim * 4, words),
        VariableCost("softmax_w", vocab * dim * 4, True, vocab, dim * 4, sampled),
        VariableCost("softmax_b", vocab * 4, True, vocab, 4, sampled),
        VariableCost("lstm/kernel", (dim + dim) * 4 * state * 4),
        VariableCost("lstm/bias", 4 * state * 4),
        VariableCost("lstm/projection", state * dim * 4),
    ], words


def resnet50() -> tuple[list[VariableCost], int]:
    """ResNet-50 v1's trainable variables (conv kernels without biases, batch norm's scale and
    offset, the 1000-way classifier): 161 variables, 25.56 M parameters, all dense."""
    shapes = [(7 * 7 * 3 * 64,), (64,), (64,)]
    width_in = 64
    for blocks, width in ((3, 64), (4, 128), (6, 256), (3, 512)):
        for b in range(blocks):
            convs = [(width_in, width, 1), (width, width, 3), (width, 4 * width, 1)]
            if b == 0:
                convs.append((width_in, 4 * width, 1))  # the projection shortcut
            for c_in, c_out, k in convs:
                shapes += [(k * k * c_in * c_out,), (c_out,), (c_out,)]
            width_in = 4 * width
    shapes += [(2048 * 1000,), (1000,)]
    return [VariableCost(f"v{i}", size * 4) for i, (size,) in enumerate(shapes)], 64


def _cluster(hosts: int) -> ClusterShape:
    return ClusterShape(hosts, GPUS_PER_HOST, LINK, INSIDE)


def _layout(system: str) -> str:
    return "MPI" if system == "Horovod" else system


def model_rows(name: str, variables: list[VariableCost], units: int, calibrate: str) -> list[dict]:
    """Per GPU count and system: the published throughput, the bytes-only bound and the forecast
    from the host costs fitted to ``CALIBRATION_HOSTS``."""
    published = PUBLISHED[name]
    one_host = _cluster(1)
    # the single-GPU step that makes the 6-GPU bytes-only prediction of `calibrate` equal the published figure
    step_6 = GPUS_PER_HOST * units / published[GPUS_PER_HOST][SYSTEMS.index(calibrate)]
    comm_6 = next(p for p in predict(variables, 1.0, one_host, [_layout(calibrate)])).communication_s
    step_time = step_6 - comm_6
    costs = {}
    for i, system in enumerate(SYSTEMS):
        measured = {_cluster(h): h * GPUS_PER_HOST * units / published[h * GPUS_PER_HOST][i]
                    for h in CALIBRATION_HOSTS}
        costs[system] = fit_costs(variables, step_time, measured, _layout(system))
    rows = []
    for hosts in HOSTS:
        cluster = _cluster(hosts)
        bound = {p.layout: p for p in predict(variables, step_time, cluster)}
        gpus = cluster.workers
        for system, measured in zip(SYSTEMS, published[gpus]):
            layout = _layout(system)
            (forecast,) = predict(variables, step_time, cluster, [layout], {layout: costs[system]})
            c = costs[system]
            rows.append({"model": name, "gpus": gpus, "system": system, "published": measured,
                         "predicted": gpus * units / bound[layout].step_s, "forecast": gpus * units / forecast.step_s,
                         "calibration": hosts in CALIBRATION_HOSTS, "step_time_s": step_time,
                         "between_hosts_mb": bound[layout].between_hosts_bytes / 1e6,
                         "fixed_s": c.fixed, "row_rate_gb_s": None if c.row_rate == float("inf") else c.row_rate / 1e9,
                         "transfer_s": c.transfer})
    return rows


def ratios(rows: list[dict], gpus: int) -> list[dict]:
    out = []
    for model in PUBLISHED:
        at = {r["system"]: r for r in rows if r["model"] == model and r["gpus"] == gpus}
        for other in ("TF PS", "Horovod"):
            out.append({"model": model, "gpus": gpus, "ratio": f"HYBRID / {other}",
                        **{key: at["HYBRID"][key] / at[other][key] for key in ("published", "predicted", "forecast")}})
    return out


def _plot(rows: list[dict], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, model in zip(axes, PUBLISHED):
        for i, system in enumerate(SYSTEMS):
            mine = [r for r in rows if r["model"] == model and r["system"] == system]
            color = f"C{i}"
            ax.plot([r["gpus"] for r in mine], [r["published"] for r in mine], "o-", color=color,
                    label=f"{system} published")
            ax.plot([r["gpus"] for r in mine], [r["forecast"] for r in mine], "x--", color=color,
                    label=f"{system} forecast")
        ax.axvspan(4, 14, color="0.92", zorder=0)  # the calibration figures
        ax.set_xlabel("GPUs (6 per machine, 100 Gbit/s; shaded: calibration)")
        ax.set_ylabel("words/s" if model == "LM1B" else "images/s")
        ax.set_title(model)
        ax.set_xticks([6, 12, 24, 48])
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("Parallax paper (repository chart) vs parallax/plan/predict.py: host costs fitted at 6 and 12 GPUs, "
                 "forecast at 24 and 48", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    results = os.path.join(ROOT, "benchmarks", "results")
    os.makedirs(results, exist_ok=True)
    lm_vars, lm_units = lm1b()
    rn_vars, rn_units = resnet50()
    rows = model_rows("LM1B", lm_vars, lm_units, "HYBRID") + model_rows("ResNet-50", rn_vars, rn_units, "Horovod")
    print(f"{'model':<10} {'GPUs':>4} {'system':<8} {'published':>10} {'bytes only':>10} {'forecast':>10} "
          f"{'forecast/published':>18}")
    for r in rows:
        note = "  (calibration)" if r["calibration"] else ""
        print(f"{r['model']:<10} {r['gpus']:>4} {r['system']:<8} {r['published']:>10,.0f} {r['predicted']:>10,.0f} "
              f"{r['forecast']:>10,.0f} {r['forecast'] / r['published']:>18.2f}{note}")
    at_48 = ratios(rows, 48)
    print()
    for r in at_48:
        print(f"{r['model']:<10} {r['ratio']:<18} published {r['published']:.2f}x  bytes only {r['predicted']:.2f}x  "
              f"forecast {r['forecast']:.2f}x")
    write_json(os.path.join(results, "predict_paper.json"), {"rows": rows, "ratios_48_gpus": at_48})
    _plot(rows, os.path.join(results, "predict_paper.png"))
    print(f"\nwrote {os.path.join(results, 'predict_paper.json')} and predict_paper.png")


if __name__ == "__main__":
    main()
