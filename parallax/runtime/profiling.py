"""Profiling chosen steps (``ProfileConfig``): RunMetadata, a Chrome trace and a summary.

For each profiled step of a profiled worker, in ``<profile_dir>/worker_<id>/``:

* ``run_metadata_step_<n>.pb``: the step's ``RunMetadata`` (binary proto);
* ``timeline_step_<n>.json``: the Chrome-trace timeline of it (open it in
  ``chrome://tracing`` or https://ui.perfetto.dev);
* ``summary_step_<n>.txt``: time spent in computation vs communication.

Steps are numbered by the global step, as in the original Parallax: a run is
step ``n`` when the graph's global step reads ``n`` just before it (one extra
read of the global step per ``sess.run``, only when profiling is configured).
A graph without a global step numbers its ``sess.run`` calls from 0 instead.
A step that is not profiled runs with no extra options.

Communication ops are Parallax's all-reduce/all-gather calls
(``parallax_aggregate/allreduce|allgather|host/``), its parameter-server
protocol (``parallax_sync/``: accumulators, tokens) and TensorFlow's
transfers between processes and devices (``_Send``/``_Recv``,
``Collective*``); everything else is computation. Op times are summed over
all devices (threads run in parallel, so the sum may exceed the step).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

__all__ = ["Profiler", "summarize", "is_communication"]

_COMM_SCOPES = ("parallax_aggregate/allreduce/", "parallax_aggregate/allgather/", "parallax_aggregate/host/",
                "parallax_sync/")


def is_communication(node_name: str, label: str = "") -> bool:
    """Whether a profiled op is communication (see the module docstring)."""
    name = node_name.split(":")[0]
    op_type = label.split("=", 1)[-1].strip().split("(", 1)[0].strip() if "=" in label else ""
    return (any(scope in name for scope in _COMM_SCOPES) or op_type in ("_Send", "_Recv", "_HostSend", "_HostRecv")
            or "Send" in name.split("/")[-1] or "Recv" in name.split("/")[-1] or op_type.startswith("Collective"))


def summarize(run_metadata, wall_seconds: float) -> str:
    """The text summary of one step's ``RunMetadata``."""
    comm = compute = 0
    top: dict[str, int] = {}
    for device in run_metadata.step_stats.dev_stats:
        for node in device.node_stats:
            micros = max(0, node.op_end_rel_micros - node.op_start_rel_micros)
            if node.node_name in ("_SOURCE", "RecvTensor"):
                continue
            if is_communication(node.node_name, node.timeline_label):
                comm += micros
            else:
                compute += micros
            top[node.node_name] = top.get(node.node_name, 0) + micros
    total = comm + compute
    lines = [f"step wall time: {wall_seconds * 1e3:.2f} ms",
             f"computation: {compute / 1e3:.2f} ms of op time ({100 * compute / total if total else 0:.0f} %)",
             f"communication: {comm / 1e3:.2f} ms of op time ({100 * comm / total if total else 0:.0f} %)",
             "slowest ops (ms):"]
    for name, micros in sorted(top.items(), key=lambda kv: -kv[1])[:10]:
        kind = "comm" if is_communication(name) else "comp"
        lines.append(f"  {micros / 1e3:9.3f}  {kind}  {name}")
    return "\n".join(lines) + "\n"


@dataclass
class Profiler:
    """Decides which steps to profile and writes their files."""

    directory: str
    steps: frozenset[int] | None = None
    step_range: tuple[int, int] | None = None
    step: int = 0

    @classmethod
    def from_config(cls, profile_config, worker_id: int) -> Profiler | None:
        """The profiler of worker ``worker_id``, or ``None`` when it profiles nothing."""
        if profile_config is None or not profile_config.profile_dir:
            return None
        if profile_config.profile_worker is not None and profile_config.profile_worker != worker_id:
            return None
        if profile_config.profile_steps is None and profile_config.profile_range is None:
            return None
        steps = frozenset(profile_config.profile_steps) if profile_config.profile_steps is not None else None
        return cls(os.path.join(profile_config.profile_dir, f"worker_{worker_id}"), steps,
                   tuple(profile_config.profile_range) if profile_config.profile_range is not None else None)

    def wants(self, step: int) -> bool:
        """Whether step ``step`` is profiled."""
        if self.steps is not None:
            return step in self.steps
        start, end = self.step_range  # type: ignore[misc]
        return start <= step < end

    def run(self, run, options, run_metadata, global_step: int | None = None):
        """Run one step through ``run(options, run_metadata)``, profiled when wanted.

        ``global_step``: the global step's value before this run (``None``: count runs)."""
        step = self.step if global_step is None else int(global_step)
        profiled = self.wants(step)
        self.step += 1
        if not profiled:
            return run(options, run_metadata)
        from tensorflow.core.protobuf import config_pb2
        from tensorflow.python.client import timeline

        opts = config_pb2.RunOptions()
        if options is not None:
            opts.CopyFrom(options)
        opts.trace_level = config_pb2.RunOptions.FULL_TRACE
        metadata = run_metadata if run_metadata is not None else config_pb2.RunMetadata()
        start = time.perf_counter()
        result = run(opts, metadata)
        wall = time.perf_counter() - start
        os.makedirs(self.directory, exist_ok=True)
        def path(kind: str, ext: str) -> str:
            return os.path.join(self.directory, f"{kind}_step_{step}.{ext}")

        with open(path("run_metadata", "pb"), "wb") as f:
            f.write(metadata.SerializeToString())
        with open(path("timeline", "json"), "w", encoding="utf-8") as f:
            f.write(timeline.Timeline(metadata.step_stats).generate_chrome_trace_format())
        with open(path("summary", "txt"), "w", encoding="utf-8") as f:
            f.write(summarize(metadata, wall))
        return result
