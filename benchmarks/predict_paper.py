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
prediction at one machine (6 GPUs) matches the published figure of one layout
(Parallax's HYBRID for LM1B, Horovod for ResNet-50); every other figure is then
predicted.
"""

from __future__ import annotations

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from benchmarks.common import write_json  # noqa: E402
from parallax.plan.predict import ClusterShape, Link, VariableCost, predict  # noqa: E402

GPUS_PER_HOST = 6
HOSTS = (1, 2, 4, 8)
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
    return [VariableCost("weights", 25_557_032 * 4)], 64


def _cluster(hosts: int) -> ClusterShape:
    return ClusterShape(hosts, GPUS_PER_HOST, LINK, INSIDE)


def model_rows(name: str, variables: list[VariableCost], units: int, calibrate: str) -> list[dict]:
    published = PUBLISHED[name]
    one_host = _cluster(1)
    # the single-GPU step that makes the 6-GPU prediction of `calibrate` equal the published figure
    step_6 = GPUS_PER_HOST * units / published[GPUS_PER_HOST][SYSTEMS.index(calibrate)]
    layout = "MPI" if calibrate == "Horovod" else calibrate
    comm_6 = next(p for p in predict(variables, 1.0, one_host, [layout])).communication_s
    step_time = step_6 - comm_6
    rows = []
    for hosts in HOSTS:
        cluster = _cluster(hosts)
        predicted = {p.layout: p for p in predict(variables, step_time, cluster)}
        gpus = cluster.workers
        for system, measured in zip(SYSTEMS, published[gpus]):
            p = predicted["MPI" if system == "Horovod" else system]
            rows.append({"model": name, "gpus": gpus, "system": system, "published": measured,
                         "predicted": gpus * units / p.step_s, "step_time_s": step_time,
                         "between_hosts_mb": p.between_hosts_bytes / 1e6})
    return rows


def ratios(rows: list[dict], gpus: int) -> list[dict]:
    out = []
    for model in PUBLISHED:
        at = {r["system"]: r for r in rows if r["model"] == model and r["gpus"] == gpus}
        for other in ("TF PS", "Horovod"):
            out.append({"model": model, "gpus": gpus, "ratio": f"HYBRID / {other}",
                        "published": at["HYBRID"]["published"] / at[other]["published"],
                        "predicted": at["HYBRID"]["predicted"] / at[other]["predicted"]})
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
            ax.plot([r["gpus"] for r in mine], [r["predicted"] for r in mine], "x--", color=color,
                    label=f"{system} predicted")
        ax.set_xlabel("GPUs (6 per machine, 100 Gbit/s)")
        ax.set_ylabel("words/s" if model == "LM1B" else "images/s")
        ax.set_title(model)
        ax.set_xticks([6, 12, 24, 48])
    axes[0].legend(fontsize=7, ncol=2)
    fig.suptitle("Parallax paper (repository chart) vs parallax/plan/predict.py", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main() -> None:
    results = os.path.join(ROOT, "benchmarks", "results")
    os.makedirs(results, exist_ok=True)
    lm_vars, lm_units = lm1b()
    rn_vars, rn_units = resnet50()
    rows = model_rows("LM1B", lm_vars, lm_units, "HYBRID") + model_rows("ResNet-50", rn_vars, rn_units, "Horovod")
    print(f"{'model':<10} {'GPUs':>4} {'system':<8} {'published':>10} {'predicted':>10} {'pred/pub':>8}")
    for r in rows:
        print(f"{r['model']:<10} {r['gpus']:>4} {r['system']:<8} {r['published']:>10,.0f} {r['predicted']:>10,.0f} "
              f"{r['predicted'] / r['published']:>8.2f}")
    at_48 = ratios(rows, 48)
    print()
    for r in at_48:
        print(f"{r['model']:<10} {r['ratio']:<18} published {r['published']:.2f}x  predicted {r['predicted']:.2f}x")
    write_json(os.path.join(results, "predict_paper.json"), {"rows": rows, "ratios_48_gpus": at_48})
    _plot(rows, os.path.join(results, "predict_paper.png"))
    print(f"\nwrote {os.path.join(results, 'predict_paper.json')} and predict_paper.png")


if __name__ == "__main__":
    main()
