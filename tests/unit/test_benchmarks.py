"""benchmarks/compare.py (``make bench``): arguments, the report, and a small real run."""

from __future__ import annotations

import json

import pytest

from benchmarks import compare


def test_steps_argument():
    assert compare.parse_args([]).steps == {"dense": 200, "sparse": 100}
    assert compare.parse_args(["--steps", "7"]).steps == {"dense": 7, "sparse": 7}
    assert compare.parse_args(["--steps", "sparse=9", "--quick"]).steps == {"dense": 20, "sparse": 9}
    with pytest.raises(SystemExit):
        compare.parse_args(["--steps", "dense=0"])


def _data():
    ok = {"system": "tf", "label": "TF single device", "workload": "dense", "ranks": 1, "ran_as": "single device",
          "processes": 1, "steps_per_sec": 100.0, "units_per_sec": 6400.0, "unit": "images", "bytes_per_step": 0.0,
          "loss_first": 2.2, "loss_last": 1.1}
    mpi = {**ok, "system": "parallax-mpi", "label": "Parallax MPI", "ranks": 2, "ran_as": "MPI", "processes": 2,
           "units_per_sec": 9600.0, "bytes_per_step": 307_000.0}
    skipped = {"system": "horovod", "label": "Horovod", "workload": "dense", "ranks": 2,
               "error": "skipped: no .venv-horovod (make horovod-venv)"}
    return {"environment": {"date": "2026-11-22", "cores": 2, "platform": "linux", "tensorflow": "2.21.0",
                            "horovod_tensorflow": None, "netns": True, "warmup": 3, "steps": {"dense": 20}},
            "workloads": {"dense": "CNN"}, "rows": [ok, mpi, skipped],
            "overhead": [{"model": "linear", "plain_us": 300.0, "raw_us": 350.0, "wrapper_us": 400.0,
                          "wrapper_overhead_us": 50.0, "wrapper_overhead_pct": 14.3}],
            "rewrite": [{"layout": "MPI", "ops_before": 10548, "ops_after": 15394, "variables": 966, "export_s": 0.2,
                         "plan_s": 2.0, "rewrite_s": 1.5, "import_s": 2.3, "total_s": 6.0}]}


def test_report_tables_and_plot(tmp_path):
    text = compare.markdown(_data())
    assert "| Parallax MPI | 2 | MPI | 2 | 100.0 | 9,600 | 1.50x | 307,000 | 2.20 -> 1.10 |" in text
    assert "| Horovod | 2 | skipped: no .venv-horovod" in text
    assert "+50 us (+14.3 %)" in text and "| MPI | 10,548 | 15,394 | 966 |" in text
    compare.plot(_data(), str(tmp_path / "p.png"))
    assert (tmp_path / "p.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
@pytest.mark.multiprocess
@pytest.mark.extended  # make bench runs it in full
def test_a_small_run_trains_the_same_model_in_every_system(tmp_path):
    rc = compare.main(["--quick", "--workloads", "dense", "--systems", "tf,parallax-mpi,tf-ps", "--ranks", "1",
                       "--steps", "5", "--no_extras", "--out_dir", str(tmp_path)])
    data = json.loads((tmp_path / "compare.json").read_text())
    assert rc == 0, data
    rows = {r["system"]: r for r in data["rows"]}
    assert set(rows) == {"tf", "parallax-mpi", "tf-ps"}
    assert rows["parallax-mpi"]["ran_as"] == "in-process" and rows["tf-ps"]["processes"] == 2
    for r in rows.values():  # same model, seed and first batch: the same first loss
        assert r["loss_first"] == pytest.approx(rows["tf"]["loss_first"], rel=1e-5)
        assert r["units_per_sec"] > 0
    assert (tmp_path / "compare.md").exists() and (tmp_path / "compare.png").exists()


def test_multihost_report_sets_each_host_job_beside_its_localhost_job(tmp_path):
    from benchmarks import multihost

    data = _data()
    local = {**data["rows"][1], "ranks": 3, "processes": 3, "where": "local", "steps_per_sec": 50.0}
    hosts = {**local, "where": "hosts", "steps_per_sec": 40.0, "network_bytes_per_step": 300_000.0}
    failed = {"system": "parallax-ps", "label": "Parallax PS", "workload": "dense", "ranks": 3, "where": "hosts",
              "error": "exit code 1"}
    data["rows"] = [local, hosts, failed]
    text = multihost.markdown(data)
    assert "| Parallax MPI | localhost, 3 ranks | MPI | 3 | 50.0 | 9,600 |  | 307,000 | n/a |" in text
    assert "| Parallax MPI | 3 hosts x 1 rank | MPI | 3 | 40.0 | 9,600 | 0.80x | 307,000 | 300,000 |" in text
    assert "| Parallax PS | 3 hosts x 1 rank | exit code 1 |" in text
    multihost.plot(data, str(tmp_path / "m.png"))
    assert (tmp_path / "m.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_sent_bytes_sums_the_namespaces_of_the_given_processes(monkeypatch):
    import os

    from benchmarks.common import NETNS_PIDS_ENV, sent_bytes

    monkeypatch.delenv(NETNS_PIDS_ENV, raising=False)
    alone = sent_bytes()
    monkeypatch.setenv(NETNS_PIDS_ENV, f"{os.getpid()},{os.getpid()}")  # this namespace, twice
    twice = sent_bytes()
    assert twice[0] >= 2 * alone[0] and twice[1] >= 2 * alone[1]


def test_the_speed_targets_compare_like_with_like_at_each_rank_count():
    rows = [{"workload": "dense", "system": s, "ranks": n, "steps_per_sec": v}
            for s, n, v in (("parallax-mpi-hvdtf", 2, 110.0), ("horovod", 2, 100.0), ("parallax-mpi-hvdtf", 3, 90.0),
                            ("horovod", 3, 100.0), ("parallax-ps", 2, 130.0), ("tf-ps", 2, 100.0),
                            ("parallax-mpi", 2, 1e6))]
    rows.append({"workload": "dense", "system": "tf-ps", "ranks": 3, "error": "exit code 1"})
    found = {(t["name"], t["ranks"]): (round(t["ratio"], 2), t["met"]) for t in compare.targets([rows])}
    assert found == {("MPI vs Horovod", 2): (1.1, True), ("MPI vs Horovod", 3): (0.9, False),
                     ("PS vs TF PS", 2): (1.3, True)}  # no PS figure at 3 ranks: its peer failed
    # more rounds: each round's ratio, judged by the median
    again = [dict(r, steps_per_sec=r["steps_per_sec"] * (1.3 if r["system"] == "parallax-mpi-hvdtf" else 1))
             for r in rows if "error" not in r]
    found = {(t["name"], t["ranks"]): t for t in compare.targets([rows, again, again])}
    assert [round(x, 2) for x in found["MPI vs Horovod", 3]["ratios"]] == [0.9, 1.17, 1.17]
    assert found["MPI vs Horovod", 3]["met"]


def test_the_paper_forecast_fits_one_and_two_machines_and_forecasts_four_and_eight():
    from benchmarks import predict_paper

    variables, units = predict_paper.resnet50()
    assert (len(variables), sum(v.num_bytes for v in variables) // 4) == (161, 25_557_032)  # ResNet-50 v1
    variables, units = predict_paper.lm1b()
    rows = predict_paper.model_rows("LM1B", variables, units, "HYBRID")
    for r in rows:
        if r["calibration"]:  # two figures, two costs per system: fitted exactly
            assert r["forecast"] == pytest.approx(r["published"], rel=1e-6), r
    at_48 = {r["system"]: r for r in rows if r["gpus"] == 48}
    # the all-gathers grow with the rows from other hosts, as the published figures do
    for system in ("MPI", "Horovod"):
        assert at_48[system]["forecast"] == pytest.approx(at_48[system]["published"], rel=0.1)
    assert at_48["HYBRID"]["forecast"] > at_48["HYBRID"]["published"]  # servers: too fast at 48 (docs say so)


def test_the_machine_check_fits_at_two_ranks_and_forecasts_three():
    from benchmarks import predict_here
    from parallax.plan.predict import ClusterShape, Link, VariableCost, communication, expected_max

    link = Link(1e9, 1e-5)
    variables = [VariableCost("w", 10**6)]
    devices = {2: {"step_time_s": 0.002, "spread_s": 0.0004}, 3: {"step_time_s": 0.004, "spread_s": 0.002}}
    rows = predict_here.forecast_rows("dense", variables, devices, {("MPI", 2): 0.004, ("MPI", 3): 0.008}, link)
    calibration, forecast = rows
    assert calibration["forecast_s"] == pytest.approx(0.004)
    comm_2 = communication(variables, "MPI", ClusterShape(1, 2, link, link))[0]
    fixed = 0.004 - 0.002 - comm_2 - 0.0004 * expected_max(2)
    assert forecast["fixed_s"] == pytest.approx(fixed)
    assert forecast["forecast_s"] == pytest.approx(
        0.004 + communication(variables, "MPI", ClusterShape(1, 3, link, link))[0] + fixed + 0.002 * expected_max(3))


def test_the_accumulator_benchmark_sums_alike_both_ways(tmp_path):
    from benchmarks import accumulator

    assert accumulator.main(["--rows", "40", "--dim", "8", "--vocab", "500", "--senders", "2,3",
                             "--results", str(tmp_path)]) == 0
    rows = json.loads((tmp_path / "accumulator.json").read_text())["rows"]
    assert [r["senders"] for r in rows] == [2, 3]
    for r in rows:
        # the accumulator merges rows of equal index; Parallax's take keeps every sender's rows
        assert r["rows_returned"]["parallax_take"] == 40 * r["senders"]
        assert r["rows_returned"]["tf_accumulator"] <= 40 * r["senders"]
    assert (tmp_path / "accumulator.png").stat().st_size > 0
    with pytest.raises(SystemExit):
        accumulator.main(["--senders", "two"])


def test_the_shaped_rate_gives_this_machine_the_papers_ratio_of_communication_to_computation(tmp_path):
    from benchmarks import shaped

    model, step, num_bytes = shaped.paper_step("sparse")
    assert model == "LM1B" and step == pytest.approx(128 * 20 / (87.9e3 / 6))  # HYBRID's 6-GPU words/s, per GPU
    assert 40e6 < num_bytes < 80e6  # LSTM and projection whole, the touched rows of embedding and softmax
    rate = shaped.shaped_rate(100e9, num_bytes / 50, num_bytes, step / 10, step)
    assert rate == pytest.approx(100e9 / 50 * 10)
    # the same seconds of communication per second of computation on both sides
    assert (num_bytes / 50 * 8 / rate) / (step / 10) == pytest.approx(num_bytes * 8 / 100e9 / step)
    assert shaped.tbf(800e6)[:3] == ["tbf", "rate", "800000000bit"] and int(shaped.tbf(800e6)[4]) == 1_000_000
    assert int(shaped.tbf(1e6)[4]) == shaped.MIN_BURST
    assert shaped.layout_of({"system": "parallax-hybrid-bf16"}) == "HYBRID bf16"
    assert shaped.layout_of({"system": "parallax-auto", "ran_as": "HYBRID (2 workers)"}) == "HYBRID"
    assert shaped.layout_of({"system": "horovod"}) == "MPI"
    ratios = shaped.paper_ratios("LM1B", 3)
    assert ratios["machines"] == 2 and ratios["vs_tf_ps"]["TF PS"] == 1.0
    assert ratios["vs_horovod"]["HYBRID"] == pytest.approx(149.5 / 46.5)


def test_the_shaped_report_sets_measured_predicted_and_published_ratios_side_by_side(tmp_path):
    from benchmarks import shaped

    info = {"description": "d", "paper_model": "LM1B", "paper_step_s": 0.17, "paper_bytes": 6e7, "step_s": 0.02,
            "bytes": 2e6, "rate_bits": 5e8, "probed_bits": 4.8e8, "probed_latency_s": 6e-5,
            "paper_ratios": shaped.paper_ratios("LM1B", 2), "workload": "sparse", "link": "100gbit"}
    rows = [{"system": "parallax-hybrid", "label": "Parallax HYBRID", "case": "sparse@100gbit", "ran_as": "HYBRID",
             "steps_per_sec": 4.0, "predicted_steps_per_sec": 5.0, "layout": "HYBRID", "vs_tf_ps": 2.0,
             "vs_horovod": 3.0, "network_bytes_per_step": 1.5e6},
            {"system": "tf-ps", "label": "TF PS", "case": "sparse@100gbit", "error": "exit code 1"}]
    data = {"environment": {"date": "2026-11-28", "cores": 2, "platform": "p", "tensorflow": "2", "warmup": 1,
                            "steps": {"sparse": 5}, "hosts": 2, "command": "c"}, "cases": {"sparse@100gbit": info},
            "rows": rows}
    text = shaped.markdown(data)
    assert "| Parallax HYBRID | HYBRID | 4.00 | 5.00 | 2.00x | 1.17x | 3.00x | 3.22x | 1.50 |" in text
    assert "| TF PS | exit code 1 |" in text and "500 Mbit/s" in text
    shaped.plot(data, str(tmp_path / "s.png"))
    assert (tmp_path / "s.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_system_s_suffixes_set_its_config_and_its_label(tmp_path):
    from benchmarks import compare

    assert compare.compression_of("parallax-hybrid-bf16") == "bf16" and compare.compression_of("horovod") == "none"
    assert compare.variants_of("parallax-mpi-nooverlap") == ["nooverlap"]
    assert compare.label("parallax-mpi-nooverlap") == "Parallax MPI no overlap"
    assert compare.label("parallax-hybrid-bf16") == "Parallax HYBRID bf16"
    argv, _, _ = compare.job_command("parallax-mpi-nooverlap", "deep", 2, _args(deep=3), str(tmp_path))
    assert "--no_overlap" in argv and argv[argv.index("--compression") + 1] == "none"


def _args(**steps):
    from benchmarks import compare

    args = compare.parse_args(["--quick"])
    args.steps.update(steps)
    return args


def test_the_overlap_report_sets_each_step_beside_the_sum_and_the_bound(tmp_path):
    from benchmarks import overlap

    assert overlap.hidden(1.0, 1.0, 1.5) == pytest.approx(0.5)
    case = {"description": "d", "rate_bits": 4e8, "probed_bits": 3.9e8, "probed_latency_s": 3e-5, "compute_s": 0.2,
            "comm_s": 0.3}
    rows = [{"label": "Parallax MPI no overlap", "step_s": 0.5, "vs_sum": 1.0, "vs_max": 0.5 / 0.3, "hidden": 0.0,
             "network_bytes_per_step": 2.5e7},
            {"label": "Parallax MPI", "step_s": 0.35, "vs_sum": 0.7, "vs_max": 0.35 / 0.3, "hidden": 0.75},
            {"label": "Horovod", "error": "skipped: no .venv-horovod (make horovod-venv)"}]
    data = {"environment": {"date": "2026-11-29", "cores": 2, "tensorflow": "2", "warmup": 1, "steps": 5, "hosts": 2,
                            "command": "c"}, "case": case, "rows": rows}
    text = overlap.markdown(data)
    assert "| Parallax MPI | 350 | 0.70 | 1.17 | 75 % | 0.0 |" in text
    assert "| Horovod | skipped" in text and "sum 500 ms, perfect overlap 300 ms" in text
    overlap.plot(data, str(tmp_path / "o.png"))
    assert (tmp_path / "o.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_input_share_benchmark_maps_each_workers_share_alone(tmp_path):
    from benchmarks import input_share

    input_share.main(["--examples", "1536", "--rounds", "1", "--out_dir", str(tmp_path)])
    rows = json.loads((tmp_path / "input_share.json").read_text())["rows"]
    assert (tmp_path / "input_share.png").exists()
    assert sorted({(r["pipeline"], r["workers"], r["worker"]) for r in rows}) == sorted(
        (p, n, w) for p in input_share.PIPELINES for n in (1, 2, 3) for w in range(n))
    for r in rows:  # 4 global batches of 384: each worker maps its 384 / N of each
        assert r["mapped"] == 1536 // r["workers"], r
    assert not input_share._RECORDS  # the record files are removed
