"""The benchmark models across three virtual hosts, beside the same jobs on localhost: ``make bench-cluster``.

    sudo python benchmarks/multihost.py            # writes benchmarks/results/multihost.{json,md,png}
    python benchmarks/multihost.py --quick         # a smoke run, to a temporary directory

For each model of ``make bench`` (benchmarks/workloads.py: the dense CNN, the sparse
LSTM language model) and each Parallax run option (PS, MPI, HYBRID), two jobs of three
worker processes with one replica each:

* **localhost**: the three workers on this machine, in a network namespace with only
  loopback (as ``make bench``);
* **3 hosts**: one worker on each host of a virtual cluster (tests/cluster/virtual_cluster.py:
  network namespaces with their own names and addresses, joined by a bridge), started on
  vhost1 by ``python train.py`` with a resource file naming the hosts; ``mpirun`` reaches the
  others over ssh.

Both use MPI over TCP (``--mca btl self,tcp``), with the threads Parallax gives 3 ranks
sharing this machine's cores (see ``SHARED_CORES``). Bytes per step are measured: worker 0 reads
the interface counters of every host's namespace at the first and last timed step, so
``bytes/step`` is all the job's traffic (loopback inside a host and the hosts' links) and
``across hosts`` what crossed the links. The hosts share this machine's cores and the links
are virtual (no wire, no latency): read the figures as what changes when processes are
on different hosts (TCP between hosts instead of loopback, servers placed per host), not
as network speed. Needs root and what the virtual cluster needs (``make cluster-packages``).
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

from benchmarks import compare  # noqa: E402
from benchmarks.common import NETNS_PIDS_ENV, RESULTS, write_json  # noqa: E402

SYSTEMS = ("parallax-ps", "parallax-mpi", "parallax-hybrid")
HOSTS = ("vhost1", "vhost2", "vhost3")
WHERE = {"local": "localhost, 3 ranks", "hosts": "3 hosts x 1 rank"}
#: The virtual hosts share this machine's cores, which a rank alone on its host cannot know: each gets
#: the one TensorFlow thread per pool and the yielding MPI wait that Parallax gives 3 ranks on 2 cores
#: on localhost, so that the comparison is of where the processes are, not of oversubscribed cores.
SHARED_THREADS = {"TF_NUM_INTRAOP_THREADS": "1", "TF_NUM_INTEROP_THREADS": "1"}
SHARED_CORES = " ".join(f"-x {name}={value}" for name, value in SHARED_THREADS.items()) + " --mca mpi_yield_when_idle 1"


def cluster_job(cluster, system: str, workload: str, args, work: str, hosts: tuple[str, ...] = HOSTS,
                per_host: int = 1) -> dict:
    """One job with ``per_host`` workers on each of ``hosts`` (virtual hosts of ``cluster``), started
    on the first; its row. Parallax's PS jobs get a resource line per worker, its others one line per host;
    the peers (TF PS, Horovod) an mpirun with a rank per worker on its host."""
    def start(argv, **kwargs):
        argv = [f"{a} {SHARED_CORES}" if a.startswith("--mpirun_options=") else a for a in argv]
        if os.path.basename(argv[0]) == "mpirun":  # a peer's own mpirun: the same threads and waiting
            argv = [argv[0], *SHARED_CORES.split(), "-x", NETNS_PIDS_ENV, *argv[1:]]
        kwargs["env"] = {**kwargs["env"], NETNS_PIDS_ENV: ",".join(str(h.pid) for h in cluster.hosts.values())}
        return cluster.popen(hosts[0], argv, **kwargs)

    def resources(path: str) -> None:
        devices = [f"cpu:{i}" for i in range(per_host)]
        lines = [f"{h}: {d}" for h in hosts for d in devices] if system.startswith("parallax-ps") else \
            [f"{h}: {','.join(devices)}" for h in hosts]
        with open(path, "w") as f:
            f.write("".join(line + "\n" for line in lines))

    def cleanup() -> None:  # after a timeout: what the job left on the hosts
        for host in cluster.hosts:
            for pid in cluster.job_pids(host):
                try:
                    os.kill(pid, 9)
                except ProcessLookupError:
                    pass

    return compare.run_job(system, workload, len(hosts) * per_host, args, work, popen=start, resources=resources,
                           measured=True, cleanup=cleanup, hosts=[h for h in hosts for _ in range(per_host)])


def markdown(data: dict) -> str:
    env = data["environment"]
    lines = [f"# The benchmark models on 3 virtual hosts and on localhost ({env['date']})", "",
             f"{env['cores']} cores shared by every host, {env['platform']}; TensorFlow {env['tensorflow']}; "
             f"{env['warmup']} warm-up steps, then " + ", ".join(f"{k}: {v}" for k, v in env["steps"].items())
             + " timed steps; MPI over TCP; bytes counted on every interface of every host's namespace.", ""]
    for wl, description in data["workloads"].items():
        rows = [r for r in data["rows"] if r["workload"] == wl]
        unit = next((r["unit"] for r in rows if "unit" in r), "units")
        lines += [f"## {wl}: {description}", "",
                  f"| system | where | ran as | processes | steps/s | {unit}/s | hosts / localhost | bytes/step "
                  "| across hosts/step |", "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            if "error" in r:
                lines.append(f"| {r['label']} | {WHERE[r['where']]} | {r['error']} | | | | | | |")
                continue
            local = next((o for o in rows if o["system"] == r["system"] and o["where"] == "local"
                          and "error" not in o), None)
            ratio = f"{r['steps_per_sec'] / local['steps_per_sec']:.2f}x" if local and r["where"] == "hosts" else ""
            lines.append(f"| {r['label']} | {WHERE[r['where']]} | {r['ran_as']} | {r['processes']} | "
                         f"{r['steps_per_sec']:.1f} | {r['units_per_sec']:,.0f} | {ratio} | "
                         f"{compare._fmt(r['bytes_per_step'], ',.0f')} | "
                         f"{compare._fmt(r.get('network_bytes_per_step'), ',.0f')} |")
        lines.append("")
    return "\n".join(lines)


def plot(data: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    workloads = list(data["workloads"])
    fig, axes = plt.subplots(len(workloads), 2, figsize=(12, 4 * len(workloads)), squeeze=False)
    for row_axes, wl in zip(axes, workloads):
        rows = [r for r in data["rows"] if r["workload"] == wl and "error" not in r]
        systems = [s for s in SYSTEMS if any(r["system"] == s for r in rows)]
        for ax, key, label, scale in ((row_axes[0], "steps_per_sec", "steps / s", 1.0),
                                      (row_axes[1], "bytes_per_step", "MB per step (all interfaces)", 1e6)):
            for k, where in enumerate(WHERE):
                xs, heights = [], []
                for i, system in enumerate(systems):
                    r = next((r for r in rows if r["system"] == system and r["where"] == where), None)
                    if r is not None and r.get(key) is not None:
                        xs.append(i + (k - 0.5) * 0.4)
                        heights.append(r[key] / scale)
                bars = ax.bar(xs, heights, 0.4, label=WHERE[where], color=("tab:gray", "tab:blue")[k])
                ax.bar_label(bars, fmt="%.2f" if scale > 1 else "%.1f", fontsize=7)
            ax.set_xticks(range(len(systems)), [compare.LABELS[s] for s in systems])
            ax.set_ylabel(label)
            ax.set_title(f"{wl}: {'throughput' if key == 'steps_per_sec' else 'traffic'}")
        row_axes[0].legend(fontsize=8)
    fig.suptitle(f"3 workers: one per virtual host vs all on localhost, {data['environment']['cores']} shared "
                 f"cores ({data['environment']['date']})", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def cluster_options(parser: argparse.ArgumentParser, systems: tuple[str, ...], timeout: int,
                    quick: str = "a smoke run, written to a temporary directory") -> None:
    """The options the benchmarks on a virtual cluster share (this one and benchmarks/scale.py)."""
    parser.add_argument("--systems", default=",".join(systems), help=f"comma-separated, of {', '.join(systems)}")
    parser.add_argument("--quick", action="store_true", help=quick)
    parser.add_argument("--out_dir", default=None, help=f"where results go (default {RESULTS})")
    parser.add_argument("--timeout", type=int, default=timeout, help="seconds before a job is killed")


def cannot_make_cluster(what: str) -> bool:
    """Print why no virtual cluster can be made here (then True)."""
    from tests.cluster.virtual_cluster import missing_requirements

    reason = missing_requirements()
    if reason:
        print(f"{what}: {reason}", file=sys.stderr)
    return bool(reason)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workloads", default="dense,sparse")
    cluster_options(parser, SYSTEMS, 600)
    own = parser.parse_args(argv)
    from tests.cluster.virtual_cluster import VirtualCluster

    if cannot_make_cluster("multihost benchmark"):
        return 2
    args = compare.parse_args(["--no_extras", "--timeout", str(own.timeout), *(["--quick"] if own.quick else [])])
    workloads = [w for w in own.workloads.split(",") if w]
    systems = [s for s in own.systems.split(",") if s]
    bad = [w for w in workloads if w not in ("dense", "sparse")] + [s for s in systems if s not in SYSTEMS]
    if bad:
        parser.error(f"unknown workload(s)/system(s): {', '.join(bad)}")
    import tensorflow as tf

    from benchmarks.workloads import workload as make

    out_dir = own.out_dir or (tempfile.mkdtemp(prefix="parallax_bench_quick_") if own.quick else RESULTS)
    work = tempfile.mkdtemp(prefix="parallax_bench_hosts_")
    data = {"environment": {"date": datetime.date.today().isoformat(), "cores": os.cpu_count(),
                            "platform": platform.platform(), "tensorflow": tf.__version__, "warmup": args.warmup,
                            "steps": {w: args.steps[w] for w in workloads}, "vocab": args.vocab,
                            "mpirun_options": compare.MPI_TCP},
            "workloads": {w: make(w, args.vocab).description for w in workloads}, "rows": []}
    failed = False
    with VirtualCluster(HOSTS, tag=f"pbench{os.getpid()}") as cluster:
        for wl in workloads:
            for system in systems:
                for where in WHERE:
                    place = os.path.join(work, where)
                    os.makedirs(place, exist_ok=True)
                    row = (compare.run_job(system, wl, len(HOSTS), args, place) if where == "local"
                           else cluster_job(cluster, system, wl, args, place))
                    row["where"] = where
                    data["rows"].append(row)
                    if "error" in row:
                        failed = True
                        print(f"{wl:6} {compare.LABELS[system]:>16} {WHERE[where]:>18}: {row['error']}\n"
                              f"{row.get('log_tail', '')[-1500:]}", flush=True)
                    else:
                        print(f"{wl:6} {compare.LABELS[system]:>16} {WHERE[where]:>18}: "
                              f"{row['steps_per_sec']:6.1f} steps/s, {row['bytes_per_step'] / 1e3:,.0f} kB/step"
                              f" ({row.get('network_bytes_per_step', 0) / 1e3:,.0f} kB across hosts), "
                              f"{row['wall_seconds']:.0f} s", flush=True)
                    write_json(os.path.join(work, "partial.json"), data)
    return compare.finish(data, out_dir, "multihost", markdown, plot, work, failed)


if __name__ == "__main__":
    raise SystemExit(main())
