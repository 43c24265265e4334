"""The speed predictor behind ``parallax plan --predict`` (parallax/plan/predict.py), by hand-computed cases."""

from __future__ import annotations

import math

import pytest

from parallax.plan.predict import (
    ClusterShape,
    HostCosts,
    HostLoad,
    Link,
    VariableCost,
    communication,
    expected_max,
    fit_costs,
    host_load,
    parse_bandwidth,
    parse_cluster,
    parse_latency,
    parse_measured,
    predict,
    variables_of_plan,
)

GB = 1e9
BETWEEN = Link(1 * GB, 0.0)  # 1 GB/s between hosts, no latency: seconds = GB moved
INSIDE = Link(10 * GB, 0.0)
DENSE = VariableCost("w", int(1 * GB))
# 1,000,000 rows of 1,000 bytes; a device touches 1,000 of them (1,008,000 bytes with the indices)
SPARSE = VariableCost("emb", 10**9, True, 10**6, 1000, 1000)


def cluster(hosts, devices):
    return ClusterShape(hosts, devices, BETWEEN, INSIDE)


def test_a_dense_gradient_is_all_reduced_hierarchically_in_mpi_and_hybrid():
    for layout in ("MPI", "HYBRID"):
        seconds, between = communication([DENSE], layout, cluster(4, 2))
        # across: the hosts' first devices all-reduce, 2 (H-1) GB in all, a quarter per host's link;
        # inside: each host reduces to its first device and broadcasts back, 2 (G-1) GB, over 2 device links
        assert between == pytest.approx(2 * 3 / 4 * GB)
        assert seconds == pytest.approx(1.5 + 2 * 1 / 2 / 10)


def test_parameter_servers_move_a_dense_gradient_per_device_in_tf_and_per_host_in_parallax():
    # TF: 8 devices push and read 1 GB each, 3/4 of it to servers on other hosts
    tf_seconds, tf_between = communication([DENSE], "TF PS", cluster(4, 2))
    assert tf_between == pytest.approx(8 * 2 * 3 / 4 / 4 * GB)
    assert tf_seconds == pytest.approx(3 + 8 * 2 / 4 / 8 / 10)
    # Parallax: a process per host sums its 2 replicas first (inside), then pushes and reads once
    ps_seconds, ps_between = communication([DENSE], "PS", cluster(4, 2))
    assert ps_between == pytest.approx(4 * 2 * 3 / 4 / 4 * GB)
    assert ps_seconds == pytest.approx(1.5 + (4 * 2 / 4 + 4 * 1) / 8 / 10)


def test_sparse_rows_are_gathered_by_mpi_and_merged_per_host_by_ps_and_hybrid():
    row = 1000 + 8
    seconds, between = communication([SPARSE], "MPI", cluster(4, 2))
    # all-gather: each host's 2 x 1000 rows to the 3 others; inside, gathered to the first device and
    # all 8 devices' rows broadcast to the second
    assert between == pytest.approx(3 * 8 * 1000 * row / 4)
    assert seconds == pytest.approx((6 * 1000 * row + 4 * 9 * 1000 * row / 8 / 10) / GB)
    for layout in ("PS", "HYBRID"):
        seconds, between = communication([SPARSE], layout, cluster(4, 2))
        # a host's 2000 rows pushed once and read (2 x 2000 x row), 3/4 of it to other hosts' servers
        assert between == pytest.approx(2 * 2000 * row * 3 / 4)
        assert seconds > between / GB


def test_one_host_uses_the_inside_link_and_one_device_nothing():
    seconds, between = communication([DENSE], "MPI", cluster(1, 4))
    assert between == 0 and seconds == pytest.approx(2 * 3 / 4 / 10)  # a ring, 1.5 GB per device's link
    assert communication([DENSE, SPARSE], "HYBRID", cluster(1, 1)) == (0.0, 0.0)


def test_latency_counts_each_round():
    slow = ClusterShape(2, 1, Link(1e30, 1e-3), Link(1e30, 0.0))
    assert communication([DENSE], "MPI", slow)[0] == pytest.approx(2 * 1 * 1e-3)  # 2 (N-1) rounds
    assert communication([DENSE], "PS", slow)[0] == pytest.approx(2e-3)  # a push and a pull


def test_predict_adds_communication_to_the_step_and_scales_by_the_devices():
    (p,) = predict([DENSE], 1.0, cluster(4, 2), ["MPI"])
    assert p.step_s == pytest.approx(1.6 + 1.0)
    assert p.speedup == pytest.approx(8 / 2.6) and p.efficiency == pytest.approx(1 / 2.6)
    with pytest.raises(ValueError, match="step time must be positive"):
        predict([DENSE], 0, cluster(1, 1))
    with pytest.raises(ValueError, match="unknown layout"):
        communication([DENSE], "RING", cluster(1, 1))


def test_variables_of_a_plan_take_a_devices_share_of_the_workers_rows():
    plan = {"workers": [{"replica_devices": ["/gpu:0", "/gpu:1"]}], "variables": [
        {"name": "w", "shape": [10, 10], "dtype": "float32", "gradient": {"tensor": "g", "indices": None}},
        {"name": "emb", "shape": [1000, 4], "dtype": "float32", "density": 0.1,
         "gradient": {"tensor": "v", "indices": "i"}},
        {"name": "step", "shape": [], "dtype": "int64", "gradient": None},
    ]}
    w, emb = variables_of_plan(plan)
    assert (w.num_bytes, w.sparse) == (400, False)
    assert (emb.sparse, emb.rows, emb.row_bytes, emb.rows_touched) == (True, 1000, 16, 50.0)


@pytest.mark.parametrize("text, value", [("10Gbit", 1.25e9), ("100gbit", 12.5e9), ("12.5GB/s", 12.5e9),
                                         ("800MB", 8e8), ("1GiB", 2**30)])
def test_bandwidths(text, value):
    assert parse_bandwidth(text) == pytest.approx(value)


def test_latencies_and_clusters():
    assert parse_latency("20us") == pytest.approx(2e-5) and parse_latency("1.5ms") == pytest.approx(1.5e-3)
    assert parse_cluster("6x8") == (6, 8) and parse_cluster("2 X 4") == (2, 4)
    for bad, parse in (("fast", parse_bandwidth), ("0Gbit", parse_bandwidth), ("3 weeks", parse_latency),
                       ("0x8", parse_cluster), ("six", parse_cluster)):
        with pytest.raises(ValueError):
            parse(bad)


def test_host_load_counts_the_rows_from_other_hosts_and_the_transfers_a_server_serves():
    row = 1000 + 8
    # all-gather: each worker takes in the rows of the 6 devices on the 3 other hosts
    assert host_load([SPARSE, DENSE], "MPI", cluster(4, 2)) == HostLoad(6 * 1000 * row, 0)
    # Parallax's servers: a quarter of each of the 3 other hosts' 2000 merged rows; a push and a read per host
    for layout in ("PS", "HYBRID"):
        assert host_load([SPARSE], layout, cluster(4, 2)) == HostLoad(3 / 4 * 2000 * row, 8)
    # TensorFlow's: a quarter of each of the other 6 devices' rows, none merged; every device pushes and reads
    assert host_load([SPARSE], "TF PS", cluster(4, 2)) == HostLoad(6 / 4 * 1000 * row, 16)
    assert host_load([DENSE], "HYBRID", cluster(4, 2)) == HostLoad()  # all-reduced: no servers
    assert host_load([DENSE], "PS", cluster(4, 2)).transfers == 8
    assert host_load([SPARSE], "MPI", cluster(1, 1)) == HostLoad()


def test_host_costs_add_to_the_step_and_an_overlap_never_beats_the_compute():
    costs = HostCosts(fixed=0.1, row_rate=1 * GB, transfer=0.01)
    (bound,) = predict([SPARSE], 1.0, cluster(4, 2), ["PS"])
    (p,) = predict([SPARSE], 1.0, cluster(4, 2), ["PS"], {"PS": costs})
    assert p.host_s == pytest.approx(0.1 + 3 / 4 * 2000 * 1008 / GB + 8 * 0.01)
    assert p.step_s == pytest.approx(bound.step_s + p.host_s)
    (overlapped,) = predict([DENSE], 1.0, cluster(4, 2), ["MPI"], {"MPI": HostCosts(fixed=-10.0)})
    assert overlapped.step_s == 1.0 and overlapped.speedup == pytest.approx(8)
    (alone,) = predict([DENSE], 1.0, cluster(1, 1), ["MPI"], {"MPI": costs})
    assert alone.host_s == 0 and alone.step_s == 1.0


def test_fit_costs_recovers_the_costs_that_made_the_steps_and_forecasts_larger_clusters():
    variables = [SPARSE, DENSE]
    for layout, truth in (("MPI", HostCosts(0.05, row_rate=0.5 * GB)), ("PS", HostCosts(0.02, transfer=0.003)),
                          ("TF PS", HostCosts(-0.2, transfer=0.01))):
        def step(hosts, devices, costs=truth, layout=layout):
            return predict(variables, 1.0, cluster(hosts, devices), [layout], {layout: costs})[0].step_s
        fitted = fit_costs(variables, 1.0, {cluster(1, 2): step(1, 2), cluster(2, 2): step(2, 2)}, layout)
        assert fitted.fixed == pytest.approx(truth.fixed), layout
        assert fitted.row_rate == pytest.approx(truth.row_rate) and fitted.transfer == pytest.approx(truth.transfer)
        forecast = predict(variables, 1.0, cluster(8, 2), [layout], {layout: fitted})[0].step_s
        assert forecast == pytest.approx(step(8, 2)), layout


def test_fit_costs_with_one_cluster_or_no_growth_fits_a_fixed_cost():
    one = fit_costs([DENSE], 1.0, {cluster(1, 2): 2.0}, "MPI")
    assert one.fixed == pytest.approx(2.0 - 1.0 - communication([DENSE], "MPI", cluster(1, 2))[0])
    assert one.row_rate == float("inf") and one.transfer == 0
    # steps that fall as the cluster grows (noise) give no negative rate
    falling = fit_costs([SPARSE], 1.0, {cluster(1, 2): 3.0, cluster(2, 2): 2.0}, "PS")
    assert falling.transfer == 0
    with pytest.raises(ValueError, match="more than one device"):
        fit_costs([DENSE], 1.0, {cluster(1, 1): 1.0}, "MPI")


def test_measured_steps_from_yaml():
    assert parse_measured("MPI: {1x2: 2.5ms, 2x2: 0.004}\n'TF PS': {1x4: 1}\n", "m.yaml") == {
        "MPI": {(1, 2): 0.0025, (2, 2): 0.004}, "TF PS": {(1, 4): 1.0}}
    for text, message in (("MPI: [1]", "m.yaml: MPI: expected"), ("HOROVOD: {1x2: 1}", "unknown layout"),
                          ("MPI: {2: 1}", "m.yaml: MPI: 2: cluster '2'"), ("MPI: {1x2: -1}", "positive step"),
                          ("{", "m.yaml: not YAML"), ("", "expected a mapping")):
        with pytest.raises(ValueError, match=message):
            parse_measured(text, "m.yaml")


def test_a_synchronous_step_waits_for_the_slowest_device():
    assert expected_max(1) == 0 and expected_max(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-4)
    assert expected_max(6) == pytest.approx(1.2672, abs=1e-3)  # the tabulated value
    (p,) = predict([DENSE], 1.0, cluster(4, 2), ["MPI"], spread=0.1)
    (bound,) = predict([DENSE], 1.0, cluster(4, 2), ["MPI"])
    assert p.host_s == pytest.approx(0.1 * expected_max(8)) and p.step_s == pytest.approx(bound.step_s + p.host_s)
    # fitted with the same spread, the fixed cost is what is left besides the wait
    assert fit_costs([DENSE], 1.0, {cluster(4, 2): bound.step_s + 0.3}, "MPI", spread=0.1).fixed == \
        pytest.approx(0.3 - 0.1 * expected_max(8))
