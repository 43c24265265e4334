"""The plan's traffic model (parallax/plan/traffic.py): bytes inside hosts and between them."""

from __future__ import annotations

import pytest

from parallax.analysis import analyse_graph
from parallax.plan import build_plan
from parallax.plan.traffic import Payload, allgather, allreduce, servers, step_traffic, variable_traffic
from tests.models import build_embedding
from tests.unit.plan.test_policies import IDS, VOCAB, static_embedding


def test_collectives_on_one_host_are_rings():
    assert allreduce(100, ["a"] * 4).inside == 2 * 3 * 100 and allreduce(100, ["a"] * 4).crossing == 0
    assert allgather(10, ["a"] * 4).inside == 4 * 3 * 10 and allgather(10, ["a"] * 4).crossing == 0


def test_collectives_on_several_hosts_are_hierarchical():
    # 3 + 1 workers: host a reduces to its first worker and broadcasts back (2 x 2 B), the two
    # first workers all-reduce across (2 (H-1) B)
    t = allreduce(100, ["a", "a", "a", "b"])
    assert (t.inside, t.crossing) == (400, 200)
    # all-gather: host a gathers 2 blocks to its first worker and broadcasts all 4 to 2 others
    t = allgather(10, ["a", "a", "a", "b"])
    assert (t.inside, t.crossing) == (2 * 10 + 2 * 4 * 10, 4 * 10)
    assert allreduce(100, ["a"]).total == 0


def test_servers_split_by_the_host_of_the_server():
    sent = [("a", 10.0), ("a", 10.0), ("b", 10.0)]
    t = servers(sent, "a", ["a", "a", "b"])
    assert (t.inside, t.crossing) == (20, 10)
    t = servers(sent, None, ["a", "a", "b"])  # unknown: half of everything crosses on two hosts
    assert (t.inside, t.crossing) == (15, 15)


def test_sparse_rows_to_servers_merged_and_read_once():
    p = Payload(num_bytes=1000 * 16, sparse=True, rows=1000, row_bytes=16, index_bytes=8, k=10,
                distinct=lambda j: {1: 6, 2: 11}[j])
    hosts = ["a", "a", "b", "b"]
    plain = variable_traffic(p, "ps", hosts, "a")
    # each worker pushes its 6 distinct rows and asks for and reads them: 2 x 6 x 24, half across
    assert (plain.inside, plain.crossing) == (2 * 2 * 6 * 24, 2 * 2 * 6 * 24)
    unmerged = variable_traffic(p, "ps", hosts, "a", merged=False)  # pushes all 10 rows
    assert unmerged.total == 4 * (10 + 6) * 24
    aggregated = variable_traffic(p, "ps", hosts, "a", host_aggregation=True)
    # the second worker of each host sends its 6 rows to the first, which pushes the host's 11
    assert aggregated.crossing == 11 * 24 + 2 * 6 * 24
    assert aggregated.inside == 2 * 6 * 24 + 11 * 24 + 2 * 6 * 24
    gathered = variable_traffic(p, "allgather", hosts, merged=False)  # repeats kept: k rows
    assert gathered.crossing == (2 - 1) * 4 * 10 * 24
    assert variable_traffic(p, "allgather", hosts, merged=True).crossing == 4 * 6 * 24


def test_step_traffic_of_a_hybrid_plan_on_two_hosts():
    workers = [(h, (f"/job:worker/replica:0/task:{w}/device:CPU:0",), f"/job:worker/replica:0/task:{w}/device:CPU:0")
               for w, h in enumerate(["a", "a", "b", "b"])]
    servers_ = ("/job:ps/replica:0/task:0/device:CPU:0", "/job:ps/replica:0/task:1/device:CPU:0")
    plan = build_plan(static_embedding(), workers, run_option="HYBRID", sync=True, average_sparse=True,
                      cross_worker="hybrid", server_devices=servers_, server_hosts=("a", "b"))
    assert plan.ps.host_aggregation and plan.variable("emb").server == 0
    step = step_traffic(plan)
    row = plan.variable("emb").num_bytes // VOCAB + 8
    # no counted rows: u(j) = min(rows, j k), k = IDS per worker
    emb = step.variables["emb"]
    assert emb.crossing == pytest.approx(2 * IDS * row + 2 * IDS * row)  # host b's push of 2k, its 2 reads of k
    w = plan.variable("w")
    assert step.variables["w"].crossing == pytest.approx(2 * w.num_bytes)  # hosts' first workers all-reduce
    assert step.total.total == pytest.approx(sum(t.total for t in step.variables.values()))
    assert plan.variable("emb").bytes_per_worker == round(emb.total / 4)


def test_counted_rows_replace_the_static_estimate():
    analysis = analyse_graph(build_embedding("adam").graph)
    workers = [("h", (f"/job:worker/replica:0/task:{w}/device:CPU:0",), f"/job:worker/replica:0/task:{w}/device:CPU:0")
               for w in range(2)]
    plan = build_plan(analysis, workers, run_option="PS", sync=True, average_sparse=True, cross_worker="ps",
                      server_devices=("/job:ps/replica:0/task:0/device:CPU:0",), server_hosts=("h",))
    fewer = step_traffic(plan, {"embedding": lambda j: 0.1}).variables["embedding"]  # static: 1 % of 20 rows
    assert fewer.total < step_traffic(plan).variables["embedding"].total
    assert fewer.crossing == 0  # one host


def test_sixteen_bit_gradients_halve_what_carries_gradients_and_nothing_else():
    dense = Payload(num_bytes=4000, itemsize=4)
    half = Payload(num_bytes=4000, itemsize=4, wire_ratio=0.5)
    hosts = ["a", "b"]
    assert variable_traffic(half, "allreduce", hosts).total == variable_traffic(dense, "allreduce", hosts).total / 2
    # a dense variable on a server: the push is halved, the read of the new value is not
    assert variable_traffic(half, "ps", hosts, "a").total == variable_traffic(dense, "ps", hosts, "a").total * 0.75
    rows = dict(num_bytes=1000 * 16, sparse=True, rows=1000, row_bytes=16, index_bytes=8, k=10, itemsize=4)
    gathered = variable_traffic(Payload(**rows, wire_ratio=0.5), "allgather", hosts).total
    assert gathered == variable_traffic(Payload(**rows), "allgather", hosts).total * (8 + 8) / (16 + 8)  # indices kept
