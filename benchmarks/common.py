"""Helpers shared by the benchmarks: result files, the private network namespace, the timed loop."""

from __future__ import annotations

import functools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
RESULTS = os.path.join(ROOT, "benchmarks", "results")


def mlp(batch_features: int = 256, widths=(512, 512), classes: int = 10):
    """A small MLP classifier in the current default graph: returns (x, y, loss)."""
    import tensorflow as tf

    x = tf.compat.v1.placeholder(tf.float32, [None, batch_features], name="x")
    y = tf.compat.v1.placeholder(tf.int64, [None], name="y")
    h = x
    for i, width in enumerate(widths):
        w = tf.compat.v1.get_variable(f"dense{i}/kernel", [h.shape[-1], width])
        h = tf.nn.relu(tf.matmul(h, w))
    logits = tf.matmul(h, tf.compat.v1.get_variable("out/kernel", [h.shape[-1], classes]))
    loss = tf.reduce_mean(tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=logits))
    return x, y, loss


def batch(seed: int, rows: int, batch_features: int = 256, classes: int = 10):
    """A batch of random features and labels for :func:`mlp` (``seed``: e.g. the worker id): ``(xs, ys)``."""
    import numpy as np

    rng = np.random.default_rng(seed)
    return (rng.standard_normal((rows, batch_features)).astype(np.float32),
            rng.integers(0, classes, rows).astype(np.int64))


def write_json(path: str, data) -> None:
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    with open(path, "w") as f:
        json.dump(data, f, indent=2)


def save_results(out_dir: str, name: str, data, plot) -> None:
    """``<out_dir>/<name>.json`` holding ``data`` and ``<name>.png`` drawn by ``plot(data, path)``, said on stdout."""
    write_json(os.path.join(out_dir, f"{name}.json"), data)
    plot(data, os.path.join(out_dir, f"{name}.png"))
    print(f"wrote {os.path.join(out_dir, name)}.{{json,png}}", flush=True)


def finish_plot(fig, ax, path: str, title: str, ylabel: str) -> None:
    """Label ``ax`` (``title``, ``ylabel``, a small legend) and write ``fig`` to ``path``."""
    import matplotlib.pyplot as plt

    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def read_json(path: str):
    with open(path) as f:
        return json.load(f)


@functools.lru_cache(maxsize=1)
def namespace_prefix() -> tuple[str, ...]:
    """``unshare -n`` with loopback up (as tests/multiprocess/harness.py), or ``()`` where not allowed
    (it needs root). Inside, every byte one process of a job sends another crosses ``lo`` and
    nothing else does, so ``lo``'s counter is the job's traffic."""
    unshare, ip = shutil.which("unshare"), shutil.which("ip")
    if not unshare or not ip:
        return ()
    try:
        probe = subprocess.run([unshare, "-n", "sh", "-c", f"{ip} link set lo up"], capture_output=True, timeout=20)
    except (OSError, subprocess.TimeoutExpired):
        return ()
    if probe.returncode != 0:
        return ()
    return (unshare, "-n", "sh", "-c", f'{ip} link set lo up && exec "$@"', "parallax-netns")


#: Set by benchmarks/multihost.py: pids whose network namespaces (the virtual hosts) a job's traffic crosses.
NETNS_PIDS_ENV = "PARALLAX_BENCH_NETNS_PIDS"


def sent_bytes() -> tuple[int, int]:
    """Bytes sent so far over loopback and over the other interfaces: of this network namespace, or
    summed over the namespaces of the processes named in ``$PARALLAX_BENCH_NETNS_PIDS`` (one per
    virtual host; ``/proc/<pid>/net/dev`` shows the namespace of ``pid``)."""
    pids = [p for p in os.environ.get(NETNS_PIDS_ENV, "").split(",") if p]
    loopback = other = 0
    for path in [f"/proc/{p}/net/dev" for p in pids] or ["/proc/net/dev"]:
        with open(path) as f:
            for line in f.readlines()[2:]:
                name, _, counters = line.partition(":")
                sent = int(counters.split()[8])
                if name.strip() == "lo":
                    loopback += sent
                else:
                    other += sent
    return loopback, other


def timed_steps(step: Callable[[], tuple[float, int] | None], warmup: int, steps: int) -> dict | None:
    """Run ``step`` (returns ``(loss, global step after it)``, or ``None`` when the job has ended)
    until the global step passes ``warmup + steps`` (one step of slack: a SyncReplicasOptimizer
    chief reads the global step of before or after its update); time the global steps from ``warmup`` to
    ``warmup + steps`` and count the bytes sent meanwhile (:func:`sent_bytes`).

    Counting global steps rather than calls keeps every system comparable: in TensorFlow's
    SyncReplicasOptimizer a worker's call is not one global step.

    Returns:
        ``seconds``, ``loopback_bytes``, ``network_bytes``, ``loss_first``, ``loss_last`` (``None`` if the job ended
        before the last mark).
    """
    marks: dict[int, tuple[float, int]] = {}
    first = last = None
    while True:
        result = step()
        if result is None:
            break
        loss, global_step = result
        first = loss if first is None else first
        last = loss
        for mark in (warmup, warmup + steps):
            if global_step >= mark and mark not in marks:
                marks[mark] = (time.perf_counter(), *sent_bytes())
        if global_step > warmup + steps:
            break
    if warmup + steps not in marks or warmup not in marks:
        return None
    (t0, lo0, net0), (t1, lo1, net1) = marks[warmup], marks[warmup + steps]
    return {"seconds": t1 - t0, "loopback_bytes": lo1 - lo0, "network_bytes": net1 - net0, "loss_first": first,
            "loss_last": last}


def run_logged(argv: list[str], log: str, env: dict, cwd: str, timeout: float, popen: Callable | None = None,
               cleanup: Callable[[], None] | None = None) -> tuple[int | None, float]:
    """Run ``argv`` in a session of its own (in :func:`namespace_prefix`'s namespace, unless ``popen`` starts it),
    its output into ``log``; its whole group is killed past ``timeout`` seconds (then ``cleanup()``). Returns the
    exit code (``None`` when it timed out) and the seconds it took."""
    import subprocess

    start = time.monotonic()
    with open(log, "w") as logfile:
        kwargs = {"stdout": logfile, "stderr": subprocess.STDOUT, "env": env, "cwd": cwd, "start_new_session": True}
        proc = popen(argv, **kwargs) if popen else subprocess.Popen([*namespace_prefix(), *argv], **kwargs)
        try:
            code = proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, 9)
            proc.wait()
            code = None
            if cleanup is not None:
                cleanup()
    return code, round(time.monotonic() - start, 1)

