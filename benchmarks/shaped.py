"""Parallax beside TensorFlow's PS and Horovod on links shaped like a real cluster's: ``make bench-shaped``.

    sudo python benchmarks/shaped.py                 # writes benchmarks/results/shaped.{json,md,png}
    sudo python benchmarks/shaped.py --quick         # 2 hosts, fewer steps, vocab 10k, to a temporary directory
    sudo python benchmarks/shaped.py --hosts 4 --links 10gbit --workloads sparse

Every other benchmark here runs on two shared cores over loopback or unshaped virtual links, where
the processes' own work decides. Parallax's claims are about clusters where the network decides,
so this one makes a virtual cluster (tests/cluster/virtual_cluster.py: one worker per host, 2 to 4
hosts) and shapes every host's link (Linux ``tc``, a token bucket, ``tbf``, both directions) to the
rate at which this machine's ratio of communication to computation equals the real setup's:

    rate_here = rate_real * (bytes_here / bytes_real) * (step_real / step_here)

``bytes``: a worker's gradient bytes per step (dense variables whole, sparse ones the rows one
step touches); ``step``: one device's step. The real side is the Parallax paper's (EuroSys 2019):
LM1B (the sparse model's counterpart) and ResNet-50 (the dense CNN's), one TITAN Xp per worker,
the step from the published one-machine throughput (benchmarks/predict_paper.py), and a link of
100 Gbit/s InfiniBand (the paper's) and 10 Gbit/s Ethernet (``--links``; 25 Gbit/s too). The here side is
measured in the same run: the single-device step of each workload, and its plan's gradient bytes.
The derivation and the resulting rates are in docs/benchmarks.md. The link's latency is what
the virtual link has (measured with ``parallax probe`` after shaping, and reported); this kernel
has no ``netem`` to add more, and a veth's tens of microseconds are Ethernet's already.

On those links, each workload with every system, side by side in one run: Parallax PS, MPI, HYBRID
and AUTO, MPI and HYBRID also with bf16 gradients (``CommunicationConfig(compression="bf16")``), PS and
HYBRID also with their variables on every host's server (``PSConfig(num_servers=...)``; by default
Parallax weighs how many servers hold variables, ``parallax.plan.cost.servers_to_call``), TensorFlow's
own PS (``SyncReplicasOptimizer``) and Horovod (in ``.venv-horovod``, on its TensorFlow 2.15), and Parallax MPI
on that same TensorFlow (``parallax-mpi-hvdtf``: the like-for-like row beside Horovod). Per job: steps/s, bytes
across hosts per step (every host's interface counters), ``parallax plan --predict``'s steps/s for
the same shaped cluster (the plan's bytes over the measured link, plus the measured step), and the
ratios to TF PS and to Horovod beside the paper's published ratios at the nearest machine count.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import re
import sys
import tempfile
from dataclasses import replace

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import compare, multihost, predict_paper  # noqa: E402
from benchmarks.common import RESULTS, write_json  # noqa: E402

LINKS = {"100gbit": ("100 Gbit/s InfiniBand (the paper's)", 100e9), "25gbit": ("25 Gbit/s Ethernet", 25e9),
         "10gbit": ("10 Gbit/s Ethernet", 10e9)}
#: Each workload's counterpart in the paper: its name, its variables and units per GPU step, and the
#: published one-machine (6 GPUs) throughput the GPU's step is taken from (HYBRID's for LM1B,
#: Horovod's for ResNet-50, as benchmarks/predict_paper.py calibrates them).
PAPER = {"sparse": ("LM1B", predict_paper.lm1b, 4), "dense": ("ResNet-50", predict_paper.resnet50, 1)}
SYSTEMS = ("parallax-ps", "parallax-ps-everyserver", "parallax-mpi", "parallax-hybrid", "parallax-hybrid-everyserver",
           "parallax-auto", "parallax-mpi-bf16", "parallax-hybrid-bf16", "tf-ps", "parallax-mpi-hvdtf", "horovod")
#: Each Parallax system's layout in the predictor and in the paper's figures (AUTO: the one it ran as).
LAYOUT = {"ps": "PS", "mpi": "MPI", "hybrid": "HYBRID", "tf-ps": "TF PS", "horovod": "MPI"}
PAPER_COLUMN = {"TF PS": 0, "Horovod": 1, "PS": 2, "MPI": 3, "HYBRID": 4}
VHOSTS = ("vhost1", "vhost2", "vhost3", "vhost4")
MIN_BURST = 64 * 1024  # bytes: a token bucket must hold at least a TSO segment's worth


def gradient_bytes(variables) -> float:
    """A worker's gradient bytes per step: dense variables whole, sparse ones the rows a step touches."""
    return sum(v.rows_touched * v.row_bytes if v.sparse else v.num_bytes for v in variables)


def paper_step(workload: str) -> tuple[str, float, float]:
    """``(model, one GPU's step in seconds, its gradient bytes per step)`` of the workload's counterpart."""
    name, build, column = PAPER[workload]
    variables, units = build()
    per_gpu = predict_paper.PUBLISHED[name][predict_paper.GPUS_PER_HOST][column] / predict_paper.GPUS_PER_HOST
    return name, units / per_gpu, gradient_bytes(variables)


def shaped_rate(real_rate: float, bytes_here: float, bytes_real: float, step_here: float, step_real: float) -> float:
    """The link rate (bit/s) that gives this machine the real setup's ratio of communication to computation.

    >>> shaped_rate(100e9, 1e6, 1e8, 0.02, 0.2) / 1e9  # 100x fewer bytes, a 10x shorter step
    10.0
    """
    return real_rate * (bytes_here / bytes_real) * (step_real / step_here)


def tbf(rate_bits: float) -> list[str]:
    """``tc qdisc`` arguments of a token bucket at ``rate_bits`` bit/s (a burst of 10 ms of it, at least
    :data:`MIN_BURST`; packets wait up to a second)."""
    burst = max(MIN_BURST, int(rate_bits / 8 / 100))
    return ["tbf", "rate", f"{int(rate_bits)}bit", "burst", str(burst), "latency", "1s"]


def shape(cluster, rate_bits: float) -> None:
    """Every host's link shaped to ``rate_bits`` each way: its ``eth0`` (what it sends) and the bridge's end
    of its veth (what it receives)."""
    import subprocess

    for i, host in enumerate(cluster.hosts.values()):
        for netns, dev in ((host.netns, "eth0"), (cluster.switch, f"v{i}")):
            done = subprocess.run(["ip", "netns", "exec", netns, "tc", "qdisc", "replace", "dev", dev, "root",
                                   *tbf(rate_bits)], capture_output=True, text=True)
            if done.returncode != 0:
                raise RuntimeError(f"tc on {dev} of {host.name}: {done.stderr.strip()} (needs the kernel's sch_tbf)")


def probe_link(cluster, hosts: tuple[str, ...], work: str) -> tuple[float, float]:
    """``parallax probe`` between the first two hosts: (bytes/s each way, latency s)."""
    resource = os.path.join(work, "probe.resources")
    with open(resource, "w") as f:
        f.write("".join(f"{h}: cpu:0\n" for h in hosts))
    cli = os.path.join(os.path.dirname(sys.executable), "parallax")
    done = cluster.run(hosts[0], [cli, "probe", resource, "--hosts", f"{hosts[0]},{hosts[1]}"], cwd=work,
                       timeout=300, env=dict(os.environ, PYTHONPATH=ROOT))
    m = re.search(r"([0-9.e+]+) Gbit/s per direction, ([0-9.e+]+) us latency", done.stdout)
    if done.returncode != 0 or not m:
        raise RuntimeError(f"parallax probe failed: {done.stdout[-2000:]}{done.stderr[-2000:]}")
    return float(m.group(1)) * 1e9 / 8, float(m.group(2)) * 1e-6


def plan_variables(workload: str, hosts: tuple[str, ...], vocab: int, work: str):
    """The predictor's variables of the workload's plan on these hosts (one worker each)."""
    import tensorflow as tf

    import parallax
    from benchmarks.workloads import workload as make
    from parallax.plan.predict import variables_of_plan

    graph = tf.Graph()
    with graph.as_default():
        make(workload, vocab).build(lambda opt: opt)
    resource = os.path.join(work, f"{workload}.plan.resources")
    with open(resource, "w") as f:
        f.write("".join(f"{h}: cpu:0\n" for h in hosts))
    plan = parallax.preview_plan(graph, resource, True, parallax.Config(run_option="MPI"))
    return variables_of_plan(plan.to_dict())


def halved(variables):
    """The variables as 16-bit gradients send them (every model here is float32)."""
    return [replace(v, num_bytes=v.num_bytes // 2, row_bytes=v.row_bytes // 2) for v in variables]


def predicted(variables, step: float, hosts: int, link: tuple[float, float]) -> dict[str, float]:
    """``parallax plan --predict``'s steps/s per layout (and bf16 ones) on ``hosts`` shaped hosts."""
    from parallax.plan.predict import ClusterShape, Link, predict

    cluster = ClusterShape(hosts, 1, Link(*link), Link(100e9 / 8, 5e-6))
    out = {p.layout: 1 / p.step_s for p in predict(variables, step, cluster)}
    out.update({f"{p.layout} {fmt}": 1 / p.step_s for p in predict(halved(variables), step, cluster)
                for fmt in ("fp16", "bf16")})
    return out


def layout_of(row: dict) -> str:
    """A row's layout as the predictor names it (AUTO: the one it ran as), with its 16-bit format if any."""
    system = row["system"]
    option = system if system in ("tf-ps", "horovod") else system.split("-")[1]
    layout = LAYOUT.get(option) or str(row.get("ran_as", "")).split(" ")[0] or "HYBRID"
    fmt = compare.compression_of(system)
    return layout if fmt == "none" else f"{layout} {fmt}"


def paper_ratios(model: str, hosts: int) -> dict:
    """The published ratios at the machine count nearest ``hosts``: each layout's throughput over TF PS's
    and over Horovod's."""
    machines = min((1, 2, 4, 8), key=lambda m: (abs(m - hosts), m))
    figures = predict_paper.PUBLISHED[model][machines * predict_paper.GPUS_PER_HOST]
    return {"machines": machines, "gpus": machines * predict_paper.GPUS_PER_HOST,
            "vs_tf_ps": {k: figures[i] / figures[0] for k, i in PAPER_COLUMN.items()},
            "vs_horovod": {k: figures[i] / figures[1] for k, i in PAPER_COLUMN.items()}}


def _ratio(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def markdown(data: dict) -> str:
    env = data["environment"]
    lines = [f"# Shaped links: {env['hosts']} virtual hosts, one worker each ({env['date']})", "",
             f"{env['cores']} cores shared by every host, {env['platform']}; TensorFlow {env['tensorflow']}; "
             f"{env['warmup']} warm-up steps, then " + ", ".join(f"{k}: {v}" for k, v in env["steps"].items())
             + f" timed steps. Command: `{env['command']}`.", ""]
    for case, info in data["cases"].items():
        lines += [f"## {info['workload']} on links shaped as {LINKS[info['link']][0]}", "", info["description"], "",
                  f"Shaped for {info['paper_model']}: one GPU's step {info['paper_step_s'] * 1e3:.0f} ms and "
                  f"{info['paper_bytes'] / 1e6:.1f} MB of gradients; here {info['step_s'] * 1e3:.1f} ms and "
                  f"{info['bytes'] / 1e6:.2f} MB, so {info['rate_bits'] / 1e6:,.0f} Mbit/s "
                  f"(measured after shaping: {info['probed_bits'] / 1e6:,.0f} Mbit/s, "
                  f"{info['probed_latency_s'] * 1e6:.0f} us).", "",
                  "| system | ran as | steps/s | predicted | vs TF PS | paper | vs Horovod | paper | across hosts "
                  "MB/step |", "|---|---|---|---|---|---|---|---|---|"]
        paper = info["paper_ratios"]
        for r in (r for r in data["rows"] if r["case"] == case):
            if "error" in r:
                lines.append(f"| {r['label']} | {r['error']} | | | | | | | |")
                continue
            base = r["layout"].removesuffix(f" {compare.compression_of(r['system'])}")  # the layout without its format
            lines.append(f"| {r['label']} | {r.get('ran_as', '')} | {r['steps_per_sec']:.2f} | "
                         f"{compare._fmt(r.get('predicted_steps_per_sec'), '.2f')} | "
                         f"{_ratio(r.get('vs_tf_ps'))} | {_ratio(paper['vs_tf_ps'].get(base))} | "
                         f"{_ratio(r.get('vs_horovod'))} | {_ratio(paper['vs_horovod'].get(base))} | "
                         f"{compare._fmt((r.get('network_bytes_per_step') or 0) / 1e6, '.2f')} |")
        lines += ["", f"Paper: {paper['gpus']} GPUs on {paper['machines']} machines (the nearest machine count).", ""]
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = list(data["cases"])
    fig, axes = plt.subplots(len(cases), 2, figsize=(13, 4.2 * len(cases)), squeeze=False)
    for row_axes, case in zip(axes, cases):
        info = data["cases"][case]
        rows = [r for r in data["rows"] if r["case"] == case and "error" not in r]
        labels = [r["label"] for r in rows]
        xs = list(range(len(rows)))
        ax = row_axes[0]
        ax.bar([x - 0.2 for x in xs], [r["steps_per_sec"] for r in rows], 0.4, label="measured")
        ax.bar([x + 0.2 for x in xs], [r.get("predicted_steps_per_sec") or 0 for r in rows], 0.4,
               label="parallax plan --predict", color="tab:gray")
        ax.set_ylabel("steps / s")
        ax.set_title(f"{info['workload']}, as {LINKS[info['link']][0]}: {info['rate_bits'] / 1e6:,.0f} Mbit/s links",
                     fontsize=9)
        ax.legend(fontsize=8)
        ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize=8)
        ax = row_axes[1]
        ax.bar(xs, [(r.get("network_bytes_per_step") or 0) / 1e6 for r in rows], 0.6, color="tab:orange")
        ax.set_ylabel("MB across hosts per step")
        ax.set_title(f"{info['workload']}: traffic between hosts", fontsize=9)
        ax.set_xticks(xs, labels, rotation=30, ha="right", fontsize=8)
    env = data["environment"]
    fig.suptitle(f"{env['hosts']} virtual hosts with shaped links ({env['date']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="sparse,dense")
    parser.add_argument("--hosts", type=int, default=None, help="virtual hosts, one worker each: 2 to 4 (default 3; "
                        "--quick 2)")
    parser.add_argument("--links", default="10gbit,100gbit",
                        help=f"comma-separated real links to match, of {', '.join(LINKS)} (default 10gbit,100gbit)")
    parser.add_argument("--rate", default=None, help="shape to this rate (e.g. 800Mbit) instead of the derived one")
    multihost.cluster_options(parser, SYSTEMS, 900, quick="2 hosts, vocab 10k, few steps, to a temporary directory")
    own = parser.parse_args(argv)
    hosts = VHOSTS[:own.hosts or (2 if own.quick else 3)]
    if not 2 <= len(hosts) <= 4 or (own.hosts is not None and own.hosts != len(hosts)):
        parser.error(f"--hosts must be 2 to 4, got {own.hosts}")
    workloads = [w for w in own.workloads.split(",") if w]
    systems = [s for s in own.systems.split(",") if s]
    bad = [w for w in workloads if w not in PAPER] + [s for s in systems if s not in SYSTEMS]
    if bad:
        parser.error(f"unknown workload(s)/system(s): {', '.join(bad)}")
    if multihost.cannot_make_cluster("shaped-link benchmark"):
        return 2
    from parallax.plan.predict import parse_bandwidth
    from tests.cluster.virtual_cluster import VirtualCluster

    args = compare.parse_args(["--no_extras", "--timeout", str(own.timeout), *(["--quick"] if own.quick else [])])
    import tensorflow as tf

    from benchmarks.workloads import workload as make

    out_dir = own.out_dir or (tempfile.mkdtemp(prefix="parallax_bench_shaped_") if own.quick else RESULTS)
    work = tempfile.mkdtemp(prefix="parallax_bench_shaped_work_")
    links = [link for link in own.links.split(",") if link]
    if not links or any(link not in LINKS for link in links):
        parser.error(f"--links: expected some of {', '.join(LINKS)}, got {own.links!r}")
    data = {"environment": {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(),
                            "platform": platform.platform(), "tensorflow": tf.__version__, "warmup": args.warmup,
                            "steps": {w: args.steps[w] for w in workloads}, "vocab": args.vocab,
                            "hosts": len(hosts),
                            "command": " ".join(["python benchmarks/shaped.py", *(argv or sys.argv[1:])])},
            "cases": {}, "rows": []}
    failed = False
    for wl in workloads:  # the single-device step, measured first, alone
        single = compare.run_job("tf", wl, 1, args, work)
        if "error" in single:
            print(f"{wl}: the single-device reference failed: {single['error']}\n{single.get('log_tail', '')}")
            return 1
        variables = plan_variables(wl, hosts, args.vocab, work)
        model, step_real, bytes_real = paper_step(wl)
        step_here, bytes_here = 1 / single["steps_per_sec"], gradient_bytes(variables)
        for link in links:
            rate = parse_bandwidth(own.rate) * 8 if own.rate else \
                shaped_rate(LINKS[link][1], bytes_here, bytes_real, step_here, step_real)
            data["cases"][f"{wl}@{link}"] = {
                "workload": wl, "link": link, "description": make(wl, args.vocab).description, "paper_model": model,
                "paper_step_s": step_real, "paper_bytes": bytes_real, "step_s": step_here, "bytes": bytes_here,
                "rate_bits": rate, "single_device": single, "paper_ratios": paper_ratios(model, len(hosts))}
            print(f"{wl}: one device {step_here * 1e3:.1f} ms/step, {bytes_here / 1e6:.2f} MB of gradients; {model} "
                  f"{step_real * 1e3:.0f} ms and {bytes_real / 1e6:.1f} MB on {LINKS[link][0]}: shaped to "
                  f"{rate / 1e6:,.0f} Mbit/s", flush=True)
    with VirtualCluster(hosts, tag=f"pshape{os.getpid()}") as cluster:
        for case, info in data["cases"].items():
            wl = info["workload"]
            shape(cluster, info["rate_bits"])
            bandwidth, latency = probe_link(cluster, hosts, work)
            info["probed_bits"], info["probed_latency_s"] = bandwidth * 8, latency
            forecast = predicted(plan_variables(wl, hosts, args.vocab, work), info["step_s"], len(hosts),
                                 (bandwidth, latency))
            info["predicted"] = forecast
            print(f"{case}: the shaped link measures {bandwidth * 8 / 1e6:,.0f} Mbit/s, {latency * 1e6:.0f} us",
                  flush=True)
            for system in systems:
                place = os.path.join(work, case.replace("@", "_"))
                os.makedirs(place, exist_ok=True)
                row = multihost.cluster_job(cluster, system, wl, args, place, hosts=hosts)
                row["case"] = case
                data["rows"].append(row)
                if "error" in row:
                    failed = True
                    print(f"{case:14} {row['label']:>22}: {row['error']}\n{row.get('log_tail', '')[-1500:]}",
                          flush=True)
                    continue
                row["layout"] = layout_of(row)
                row["predicted_steps_per_sec"] = forecast.get(row["layout"])
                print(f"{case:14} {row['label']:>22}: {row['steps_per_sec']:6.2f} steps/s (predicted "
                      f"{compare._fmt(row['predicted_steps_per_sec'], '.2f')}), "
                      f"{(row.get('network_bytes_per_step') or 0) / 1e6:,.2f} MB across hosts/step, "
                      f"{row['wall_seconds']:.0f} s", flush=True)
                write_json(os.path.join(work, "partial.json"), data)
    for case in data["cases"]:
        rows = [r for r in data["rows"] if r["case"] == case and "error" not in r]
        peers = {s: next((r for r in rows if r["system"] == s), None) for s in ("tf-ps", "horovod")}
        for r in rows:
            for key, peer in (("vs_tf_ps", peers["tf-ps"]), ("vs_horovod", peers["horovod"])):
                r[key] = r["steps_per_sec"] / peer["steps_per_sec"] if peer else None
    return compare.finish(data, out_dir, "shaped", markdown, plot, work, failed)


if __name__ == "__main__":
    raise SystemExit(main())
