"""Communication overlapped with the backward pass, on shaped links: ``make bench-overlap`` (``make bench-shaped`` too).

    sudo python benchmarks/overlap.py            # writes benchmarks/results/overlap.{json,md,png}
    sudo python benchmarks/overlap.py --quick    # fewer steps, to a temporary directory

A model deep enough to show it (benchmarks/workloads.py ``deep``: 12 tanh layers 512 wide, 12 MiB of
gradients) on a virtual cluster of 2 hosts (``--hosts`` up to 4), one worker each, whose links are
shaped (``tc tbf``, as benchmarks/shaped.py does) so that all-reducing the gradients takes about as
long as computing them: where overlap can hide the most. Measured in one run, on the same links:

* **compute**: one device's step, on every host at once (each with the threads a worker gets there);
* **communication**: a Parallax MPI job of the same variables whose gradients cost nothing to compute
  (``deepcomm``): its step is their all-reduce;
* **Parallax MPI, no overlap** (``MPIConfig(overlap=False)``): every all-reduce waits for the whole
  backward pass: its step should be about compute + communication;
* **Parallax MPI** (the default, ``overlap=True``): the gradients all-reduced in the order the
  backward pass makes them ready, in 8 buckets, each as soon as its gradients are there;
* **Horovod** (in ``.venv-horovod``, when it is there): its own tensor fusion, which fills buffers with
  what is ready.

The report gives each step beside ``compute + communication`` and ``max(compute, communication)`` (what
perfect overlap would reach) and the share of the shorter of the two that the step hides.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from benchmarks import compare, multihost, shaped  # noqa: E402
from benchmarks.common import RESULTS, read_json, write_json  # noqa: E402

SYSTEMS = ("parallax-mpi-nooverlap", "parallax-mpi", "horovod")


def compute_alone(cluster, hosts: tuple[str, ...], args, work: str) -> float:
    """Seconds per step of one device, on every host at once (the mean over the hosts)."""
    argv, _, _ = compare.job_command("tf", "deep", 1, args, work)
    env = {**os.environ, **multihost.SHARED_THREADS,  # the threads a worker gets there
           "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    outs, procs = [], []
    for host in hosts:
        out = os.path.join(work, f"compute_{host}.json")
        at = argv.index("--out") + 1
        log = open(os.path.join(work, f"compute_{host}.log"), "w")  # noqa: SIM115 - closed below
        procs.append((cluster.popen(host, [*argv[:at], out, *argv[at + 1:]], cwd=work, env=env, stdout=log,
                                    stderr=subprocess.STDOUT), log))
        outs.append(out)
    for proc, log in procs:
        try:
            code = proc.wait(timeout=args.timeout)
        finally:
            log.close()
        if code != 0:
            raise RuntimeError(f"the single-device step failed on a host (exit {code}); logs in {work}")
    return sum(read_json(out)["seconds"] for out in outs) / len(outs) / args.steps["deep"]


def hidden(compute: float, comm: float, step: float) -> float:
    """The share of the shorter of ``compute`` and ``comm`` that a step of ``step`` seconds hides.

    >>> hidden(1.0, 1.0, 2.0), hidden(1.0, 1.0, 1.0), hidden(1.0, 0.5, 1.25)
    (0.0, 1.0, 0.5)
    """
    return (compute + comm - step) / min(compute, comm)


def markdown(data: dict) -> str:
    env = data["environment"]
    case = data["case"]
    lines = [f"Command: `{env['command']}`; {env['date']}, {env['cores']} cores, TensorFlow {env['tensorflow']}, "
             f"{env['hosts']} virtual hosts x 1 worker, {env['steps']} timed steps after {env['warmup']}.", "",
             f"{case['description']}; links shaped to {case['rate_bits'] / 1e6:,.0f} Mbit/s each way (measured "
             f"{case['probed_bits'] / 1e6:,.0f} Mbit/s, {case['probed_latency_s'] * 1e6:.0f} us).", "",
             f"compute alone {case['compute_s'] * 1e3:.0f} ms/step, communication alone {case['comm_s'] * 1e3:.0f} "
             f"ms/step: sum {(case['compute_s'] + case['comm_s']) * 1e3:.0f} ms, perfect overlap "
             f"{max(case['compute_s'], case['comm_s']) * 1e3:.0f} ms.", "",
             "| system | ms/step | / (compute + comm) | / max(compute, comm) | hidden | across hosts MB/step |",
             "|---|---:|---:|---:|---:|---:|"]
    for row in data["rows"]:
        if "error" in row:
            lines.append(f"| {row['label']} | {row['error']} | | | | |")
            continue
        lines.append(f"| {row['label']} | {row['step_s'] * 1e3:.0f} | {row['vs_sum']:.2f} | {row['vs_max']:.2f} | "
                     f"{row['hidden'] * 100:.0f} % | {(row.get('network_bytes_per_step') or 0) / 1e6:.1f} |")
    return "\n".join(lines) + "\n"


def plot(data: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    case = data["case"]
    rows = [r for r in data["rows"] if "error" not in r]
    names = ["compute", "communication", *(r["label"] for r in rows)]
    values = [case["compute_s"] * 1e3, case["comm_s"] * 1e3, *(r["step_s"] * 1e3 for r in rows)]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.barh(names, values, color=["#999999", "#bbbbbb", *["#4c72b0"] * len(rows)])
    ax.axvline((case["compute_s"] + case["comm_s"]) * 1e3, color="#c44e52", linestyle="--",
               label="compute + communication")
    ax.axvline(max(case["compute_s"], case["comm_s"]) * 1e3, color="#55a868", linestyle=":", label="perfect overlap")
    ax.set_xlabel("ms per step")
    ax.set_title(f"Overlap with the backward pass, {data['environment']['hosts']} hosts, "
                 f"{case['rate_bits'] / 1e6:,.0f} Mbit/s links")
    ax.invert_yaxis()
    fig.legend(loc="lower center", ncol=2, frameon=False)
    fig.tight_layout(rect=(0, 0.07, 1, 1))
    fig.savefig(path, dpi=110)
    plt.close(fig)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hosts", type=int, default=2, help="virtual hosts, one worker each: 2 to 4 (default 2)")
    parser.add_argument("--rate", default=None, help="shape to this rate (e.g. 800Mbit) instead of the one that "
                        "makes communication as long as compute")
    multihost.cluster_options(parser, SYSTEMS, 900, quick="fewer steps, to a temporary directory")
    own = parser.parse_args(argv)
    if not 2 <= own.hosts <= 4:
        parser.error(f"--hosts must be 2 to 4, got {own.hosts}")
    hosts = shaped.VHOSTS[:own.hosts]
    systems = [s for s in own.systems.split(",") if s]
    if any(s not in SYSTEMS for s in systems):
        parser.error(f"--systems: expected some of {', '.join(SYSTEMS)}, got {own.systems!r}")
    if multihost.cannot_make_cluster("overlap benchmark"):
        return 2
    import tensorflow as tf

    from benchmarks.workloads import workload as make
    from parallax.plan.predict import parse_bandwidth
    from tests.cluster.virtual_cluster import VirtualCluster

    args = compare.parse_args(["--no_extras", "--timeout", str(own.timeout), *(["--quick"] if own.quick else [])])
    steps = 10 if own.quick else 40
    args.steps.update(deep=steps, deepcomm=steps)
    out_dir = own.out_dir or (tempfile.mkdtemp(prefix="parallax_bench_overlap_") if own.quick else RESULTS)
    work = tempfile.mkdtemp(prefix="parallax_bench_overlap_work_")
    wl = make("deep")
    data = {"environment": {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(),
                            "platform": platform.platform(), "tensorflow": tf.__version__, "warmup": args.warmup,
                            "steps": steps, "hosts": len(hosts),
                            "command": " ".join(["python benchmarks/overlap.py", *(argv or sys.argv[1:])])},
            "case": {"workload": "deep", "description": wl.description}, "rows": []}
    case = data["case"]
    failed = False
    with VirtualCluster(hosts, tag=f"poverlap{os.getpid()}") as cluster:
        case["compute_s"] = compute_alone(cluster, hosts, args, work)
        case["gradient_bytes"] = shaped.gradient_bytes(shaped.plan_variables("deep", hosts, args.vocab, work))
        # each worker sends and receives about the gradients' bytes once per all-reduce (ring or halving)
        case["rate_bits"] = parse_bandwidth(own.rate) * 8 if own.rate else \
            8 * case["gradient_bytes"] * 2 * (len(hosts) - 1) / len(hosts) / case["compute_s"]
        shaped.shape(cluster, case["rate_bits"])
        bandwidth, latency = shaped.probe_link(cluster, hosts, work)
        case["probed_bits"], case["probed_latency_s"] = bandwidth * 8, latency
        print(f"compute alone {case['compute_s'] * 1e3:.0f} ms/step, {case['gradient_bytes'] / 2**20:.0f} MiB of "
              f"gradients: links shaped to {case['rate_bits'] / 1e6:,.0f} Mbit/s (measured {bandwidth * 8 / 1e6:,.0f} "
              f"Mbit/s, {latency * 1e6:.0f} us)", flush=True)
        comm = multihost.cluster_job(cluster, "parallax-mpi", "deepcomm", args, work, hosts=hosts)
        if "error" in comm:
            print(f"communication alone: {comm['error']}\n{comm.get('log_tail', '')[-1500:]}")
            return 1
        case["comm_s"] = 1 / comm["steps_per_sec"]
        case["comm_row"] = comm
        print(f"communication alone {case['comm_s'] * 1e3:.0f} ms/step", flush=True)
        for system in systems:
            row = multihost.cluster_job(cluster, system, "deep", args, work, hosts=hosts)
            data["rows"].append(row)
            if "error" in row:
                failed = failed or not row["error"].startswith("skipped")
                print(f"{row['label']:>28}: {row['error']}\n{row.get('log_tail', '')[-1500:]}", flush=True)
                continue
            row["step_s"] = 1 / row["steps_per_sec"]
            row["vs_sum"] = row["step_s"] / (case["compute_s"] + case["comm_s"])
            row["vs_max"] = row["step_s"] / max(case["compute_s"], case["comm_s"])
            row["hidden"] = hidden(case["compute_s"], case["comm_s"], row["step_s"])
            print(f"{row['label']:>28}: {row['step_s'] * 1e3:6.0f} ms/step, {row['vs_sum']:.2f} of compute + "
                  f"communication, {row['hidden'] * 100:.0f} % of the shorter hidden", flush=True)
            write_json(os.path.join(work, "partial.json"), data)
    return compare.finish(data, out_dir, "overlap", markdown, plot, work, failed)


if __name__ == "__main__":
    raise SystemExit(main())
