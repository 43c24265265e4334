"""Bytes per worker and step at 2 to 8 ranks on two virtual hosts, inside a host and between hosts,
beside what the plan's traffic model predicts: ``make bench-scale``.

    sudo python benchmarks/scale.py                 # writes benchmarks/results/scale.{json,md,png}
    sudo python benchmarks/scale.py --quick         # ranks 2,4, vocab 10k, fewer steps, to a temporary directory
    sudo python benchmarks/scale.py --ranks 4 --systems parallax-hybrid

For each worker count ``n`` (2, 4, 6, 8) and each run option (PS, MPI, HYBRID, AUTO), the
sparse language model of ``make bench`` (benchmarks/workloads.py) trains with ``n / 2``
workers on each of two hosts of a virtual cluster (tests/cluster/virtual_cluster.py: one
network namespace per host, joined by a bridge), one replica per worker, MPI over TCP.
Worker 0 reads every host's interface counters at the first and last timed step: what the
hosts sent on ``lo`` stayed inside a host, what they sent on their link to the bridge
crossed between hosts. Both are divided by ``n`` and by the steps: bytes per worker and step.
Bytes do not depend on speed, so the ranks may share this machine's two cores.

The prediction is :func:`parallax.plan.traffic.step_traffic` on the plan the job ran with
(worker 0 writes it), given the rows a worker's and a host's batches really touch, counted
here by running the single-device model's gradient indices on each worker's batches (the
model's own estimate, from static shapes, counts repeated words: see docs/benchmarks.md).

Targets, printed as met or MISSED (exit 1 on a miss): HYBRID sends no more bytes between hosts
than the better of PS and MPI; every prediction within 10 % of the measured figure (inside and
between hosts, for figures of at least 1 kB); AUTO within 10 % of the cheapest layout's bytes
between hosts, of every layout when it ran with servers, of MPI's when it kept off them (their
saving in time below their synchronous chain, ``parallax.plan.cost``: it trades bytes for that
on purpose). Needs root and the virtual cluster's packages (``make cluster-packages``).
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import compare, multihost  # noqa: E402
from benchmarks.common import RESULTS, write_json  # noqa: E402

SYSTEMS = ("parallax-ps", "parallax-mpi", "parallax-hybrid", "parallax-auto")
HOSTS = ("vhost1", "vhost2")
TOLERANCE = 0.10
#: Figures below this many bytes per worker and step are not held to the tolerance (a few control messages).
SMALL = 1000


def touched_rows(workload: str, vocab: int, counts: list[int], per_host: dict[int, int], batches: int = 5) -> dict:
    """``{n: {variable: {group size: distinct rows}}}``: the distinct rows of each sparse gradient that one
    worker's batch, and one host's ``per_host[n]`` workers' batches, touch in a step, averaged over
    ``batches`` steps; counted by running the single-device model's gradient indices."""
    import numpy as np
    import tensorflow as tf

    from benchmarks.workloads import workload as make
    from parallax.analysis import analyse_graph

    wl = make(workload, vocab)
    graph = tf.Graph()
    with graph.as_default():
        wl.build(lambda opt: opt)
        init = tf.compat.v1.global_variables_initializer()
    indices = {g.variable: graph.get_tensor_by_name(g.aggregation_tensors[1])
               for g in analyse_graph(graph).gradients if g.sparse}
    out: dict = {}
    with tf.compat.v1.Session(graph=graph) as sess:
        sess.run(init)
        for n in counts:
            feeds = [wl.batches(shard, n) for shard in range(n)]
            sums: dict = {v: dict.fromkeys({1, per_host[n]}, 0.0) for v in indices}
            for _ in range(batches):
                seen = [sess.run(indices, {graph.get_tensor_by_name(f"{k}:0"): v for k, v in next(f).items()})
                        for f in feeds]
                for v in indices:
                    for h in sums[v]:
                        sums[v][h] += np.mean([len(np.unique(np.concatenate([s[v] for s in seen[i:i + h]])))
                                               for i in range(0, n, h)])
            out[n] = {v: {size: total / batches for size, total in by.items()} for v, by in sums.items()}
    return out


def predicted(row: dict, rows: dict) -> tuple[float, float] | None:
    """(inside, between hosts) bytes per worker and step that the traffic model predicts for ``row``'s plan."""
    from parallax.plan.model import Plan
    from parallax.plan.traffic import step_traffic

    if "plan" not in row:
        return None
    plan = Plan.from_dict(row["plan"])
    counted = {v: (lambda size, by=by: by.get(size, by[1] * size)) for v, by in rows.items()}
    each = step_traffic(plan, counted).total.per(plan.num_workers)
    return each.inside, each.crossing


def verdicts(data: dict) -> list[tuple[str, bool]]:
    """The targets (module docstring), each ``(what, met)``."""
    out = []
    rows = [r for r in data["rows"] if "error" not in r]
    for n in sorted({r["ranks"] for r in rows}):
        at = {r["system"]: r for r in rows if r["ranks"] == n}
        if {"parallax-ps", "parallax-mpi", "parallax-hybrid"} <= set(at):
            best = min(at["parallax-ps"]["crossing"], at["parallax-mpi"]["crossing"])
            hybrid = at["parallax-hybrid"]["crossing"]
            out.append((f"{n} ranks: HYBRID between hosts {hybrid:,.0f} B <= better of PS and MPI {best:,.0f} B "
                        f"(+{TOLERANCE:.0%})", bool(hybrid <= best * (1 + TOLERANCE))))
        if "parallax-auto" in at and len(at) > 1:
            ran_as = at["parallax-auto"].get("ran_as")
            weighed = [r for s, r in at.items() if ran_as != "MPI" or s in ("parallax-mpi", "parallax-auto")]
            cheapest = min(r["crossing"] for r in weighed)
            auto = at["parallax-auto"]["crossing"]
            among = "" if ran_as != "MPI" else " without servers"
            out.append((f"{n} ranks: AUTO between hosts {auto:,.0f} B within {TOLERANCE:.0%} of the cheapest"
                        f"{among} {cheapest:,.0f} B (ran as {ran_as})",
                        bool(auto <= cheapest * (1 + TOLERANCE))))
        for system, r in sorted(at.items()):
            for key in ("inside", "crossing"):
                guess, real = r.get(f"predicted_{key}"), r[key]
                if guess is None or max(guess, real) < SMALL:
                    continue
                error = (guess - real) / real if real else float("inf")
                out.append((f"{n} ranks: {compare.LABELS[system]} {key.replace('crossing', 'between hosts')} "
                            f"predicted {guess:,.0f} B, measured {real:,.0f} B ({error:+.1%})",
                            bool(abs(error) <= TOLERANCE)))
    return out


def markdown(data: dict) -> str:
    env = data["environment"]
    lines = [f"# Bytes per worker and step on two virtual hosts ({env['date']})", "",
             f"{data['workloads']['sparse']}; {env['warmup']} warm-up steps, then {env['steps']} counted steps; "
             f"TensorFlow {env['tensorflow']}; {env['cores']} shared cores; MPI over TCP. Workers split evenly "
             "over the two hosts; \"inside\": sent on a host's loopback, \"between\": sent on its link; "
             "\"model\": parallax.plan.traffic on the job's plan.", "",
             "| ranks | system | ran as | inside | model | between hosts | model | steps/s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in data["rows"]:
        if "error" in r:
            lines.append(f"| {r['ranks']} | {r['label']} | {r['error']} | | | | | |")
            continue
        lines.append(f"| {r['ranks']} | {r['label']} | {r['ran_as']} | {r['inside']:,.0f} | "
                     f"{compare._fmt(r.get('predicted_inside'), ',.0f')} | {r['crossing']:,.0f} | "
                     f"{compare._fmt(r.get('predicted_crossing'), ',.0f')} | {r['steps_per_sec']:.2f} |")
    lines += ["", "## Targets", ""] + [f"- {'met' if ok else 'MISSED'}: {what}" for what, ok in data["verdicts"]]
    return "\n".join(lines) + "\n"


def plot(data: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [r for r in data["rows"] if "error" not in r]
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for ax, key, title in ((axes[0], "crossing", "between hosts"), (axes[1], "inside", "inside a host")):
        for system in SYSTEMS:
            mine = sorted((r for r in rows if r["system"] == system), key=lambda r: r["ranks"])
            if not mine:
                continue
            color = compare.COLORS[system]
            ax.plot([r["ranks"] for r in mine], [r[key] / 1e3 for r in mine], "o-", color=color,
                    label=compare.LABELS[system])
            ax.plot([r["ranks"] for r in mine], [(r.get(f"predicted_{key}") or 0) / 1e3 for r in mine], "x--",
                    color=color, alpha=0.6)
        ax.set_xlabel("worker processes (half on each host)")
        ax.set_ylabel("kB per worker and step")
        ax.set_title(f"{title} (o measured, x model)")
        ax.legend(fontsize=8)
    fig.suptitle(f"sparse LM on 2 virtual hosts ({data['environment']['date']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=" ".join(__doc__.split("\n\n")[0].split()))
    parser.add_argument("--ranks", default=None, help="comma-separated even worker counts (default 2,4,6,8)")
    parser.add_argument("--steps", type=int, default=None, help="counted steps per job (default 10; --quick 5)")
    multihost.cluster_options(parser, SYSTEMS, 900, quick="ranks 2,4, vocab 10k, 5 steps, to a temporary directory")
    own = parser.parse_args(argv)
    from tests.cluster.virtual_cluster import VirtualCluster

    if multihost.cannot_make_cluster("scale benchmark"):
        return 2
    counts = sorted({int(n) for n in (own.ranks or ("2,4" if own.quick else "2,4,6,8")).split(",") if n.strip()})
    systems = [s for s in own.systems.split(",") if s]
    bad = [s for s in systems if s not in SYSTEMS]
    if bad or any(n < 2 or n % len(HOSTS) for n in counts):
        parser.error(f"unknown system(s) {', '.join(bad)}" if bad else f"--ranks: even counts >= {len(HOSTS)}")
    steps = own.steps or (5 if own.quick else 10)
    args = compare.parse_args(["--no_extras", "--timeout", str(own.timeout), "--steps", f"sparse={steps}",
                               "--warmup", "3", *(["--quick"] if own.quick else [])])
    import tensorflow as tf

    from benchmarks.workloads import workload as make

    per_host = {n: n // len(HOSTS) for n in counts}
    print(f"counting the rows each worker's and host's batches touch ({', '.join(map(str, counts))} ranks)",
          flush=True)
    rows = touched_rows("sparse", args.vocab, counts, per_host)
    out_dir = own.out_dir or (tempfile.mkdtemp(prefix="parallax_bench_quick_") if own.quick else RESULTS)
    work = tempfile.mkdtemp(prefix="parallax_bench_scale_")
    data = {"environment": {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(),
                            "platform": platform.platform(), "tensorflow": tf.__version__, "warmup": args.warmup,
                            "steps": steps, "vocab": args.vocab, "hosts": len(HOSTS)},
            "workloads": {"sparse": make("sparse", args.vocab).description},
            "touched_rows": {str(n): by for n, by in rows.items()}, "rows": []}
    failed = False
    with VirtualCluster(HOSTS, tag=f"pscale{os.getpid()}") as cluster:
        for n in counts:
            for system in systems:
                place = os.path.join(work, f"{n}")
                os.makedirs(place, exist_ok=True)
                row = multihost.cluster_job(cluster, system, "sparse", args, place, hosts=HOSTS,
                                            per_host=per_host[n])
                if "error" not in row:
                    row["inside"] = row["loopback_bytes"] / steps / n
                    row["crossing"] = row["network_bytes"] / steps / n
                    guess = predicted(row, rows[n])
                    if guess is not None:
                        row["predicted_inside"], row["predicted_crossing"] = guess
                    print(f"{n} ranks {compare.LABELS[system]:>16}: inside {row['inside'] / 1e3:8,.1f} kB "
                          f"(model {(row.get('predicted_inside') or 0) / 1e3:8,.1f}), between hosts "
                          f"{row['crossing'] / 1e3:8,.1f} kB (model {(row.get('predicted_crossing') or 0) / 1e3:8,.1f})"
                          f" per worker and step; ran as {row['ran_as']}, {row['wall_seconds']:.0f} s", flush=True)
                else:
                    failed = True
                    print(f"{n} ranks {compare.LABELS[system]:>16}: {row['error']}\n{row.get('log_tail', '')[-1500:]}",
                          flush=True)
                row.pop("log_tail", None)
                data["rows"].append(row)
                write_json(os.path.join(work, "partial.json"), data)
    data["verdicts"] = verdicts(data)
    code = compare.finish(data, out_dir, "scale", markdown, plot, work, failed)
    missed = [what for what, ok in data["verdicts"] if not ok]
    for what in missed:
        print(f"MISSED: {what}", file=sys.stderr)
    return code or (1 if missed else 0)


if __name__ == "__main__":
    raise SystemExit(main())
