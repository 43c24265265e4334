"""ProfileConfig: which steps, and what is written (one process, no launch)."""

from __future__ import annotations

import json

import numpy as np

import parallax
from parallax.runtime.profiling import Profiler, is_communication
from tests.conftest import cpu_resources
from tests.models import batches, build_mlp


def test_only_the_chosen_steps_and_worker():
    cfg = parallax.ProfileConfig(profile_dir="/p", profile_range=(2, 4), profile_worker=1)
    assert Profiler.from_config(cfg, 0) is None
    profiler = Profiler.from_config(cfg, 1)
    seen = []
    for _ in range(5):
        profiler.run(lambda options, metadata: seen.append(options), None, None)
    assert seen[:2] == [None, None] and seen[4] is None  # untouched: no options, no extra run
    assert all(o is not None and o.trace_level == o.FULL_TRACE for o in seen[2:4])
    assert Profiler.from_config(parallax.ProfileConfig(), 0) is None


def test_communication_ops_are_told_apart():
    assert is_communication("parallax_aggregate/allreduce/allreduce_0")
    assert is_communication("parallax_sync/embedding/take")
    assert is_communication("edge_12_x", "edge_12_x = _Recv()")
    assert not is_communication("dense/MatMul", "dense/MatMul = MatMul(x, w)")


def test_profiled_step_writes_metadata_chrome_trace_and_summary(tmp_path, resource_file):
    model = build_mlp("adam")
    cfg = parallax.Config(run_option="PS", profile_config=parallax.ProfileConfig(profile_dir=str(tmp_path / "prof"),
                                                                                 profile_steps=[1]))
    sess, _, _, n = parallax.parallel_run(model.graph, cpu_resources(resource_file, 2), parallax_config=cfg)
    for feed in batches("mlp", 3, 8):
        sess.run(model.train_op, {model.inputs[k]: np.split(v, n) for k, v in feed.items()})
    sess.close()
    out = tmp_path / "prof" / "worker_0"
    assert sorted(p.name for p in out.iterdir()) == ["run_metadata_step_1.pb", "summary_step_1.txt",
                                                     "timeline_step_1.json"]
    trace = json.loads((out / "timeline_step_1.json").read_text())
    assert any(e.get("name") == "MatMul" or "MatMul" in str(e.get("args", {})) for e in trace["traceEvents"])
    summary = (out / "summary_step_1.txt").read_text()
    assert "computation:" in summary and "communication:" in summary


def test_steps_are_numbered_by_the_global_step_as_in_the_original(tmp_path, resource_file):
    model = build_mlp("adam")
    cfg = parallax.Config(run_option="PS", profile_config=parallax.ProfileConfig(profile_dir=str(tmp_path / "prof"),
                                                                                 profile_steps=[2]))
    sess, _, _, n = parallax.parallel_run(model.graph, cpu_resources(resource_file, 2), parallax_config=cfg)
    feeds = [{model.inputs[k]: np.split(v, n) for k, v in feed.items()} for feed in batches("mlp", 3, 8)]
    for feed in feeds:  # three evaluations: the global step stays 0, nothing is profiled
        sess.run(model.loss, feed)
    assert not (tmp_path / "prof").exists()
    for feed in feeds:  # global steps 0, 1, 2: the third training step is step 2
        sess.run(model.train_op, feed)
    sess.close()
    trace = (tmp_path / "prof" / "worker_0" / "timeline_step_2.json").read_text()
    assert "ResourceApplyAdam" in trace  # the profiled run is a training step, not an evaluation
