"""Which way each variable is synchronised: the cost model, HYBRID, AUTO and overrides (no processes)."""

from __future__ import annotations

import pytest
import tensorflow as tf

from parallax.analysis import analyse_graph
from parallax.errors import PlanError
from parallax.plan import PlanOptions, build_plan
from parallax.plan.cost import bytes_per_worker, choose, traffic
from parallax.plan.model import CrossWorker, PSSpec
from parallax.plan.policies import choose_sync, partition_of
from tests.models import build_embedding, build_mlp, build_sequence

SERVER = ("/job:ps/replica:0/task:0/device:CPU:0",)
VOCAB, DIM, IDS = 1000, 16, 8


def static_embedding(clip: float | None = None, vocab: int = VOCAB, dim: int = DIM, ids: int = IDS):
    """ids[ids] (static) -> embedding(vocab, dim) -> dense dim -> 1, Adam (by default 8 ids of 1000 x 16)."""
    graph = tf.Graph()
    with graph.as_default():
        ids = tf.compat.v1.placeholder(tf.int64, [ids], name="ids")
        emb = tf.compat.v1.get_variable("emb", [vocab, dim])
        w = tf.compat.v1.get_variable("w", [dim, 1])
        loss = tf.reduce_mean(tf.matmul(tf.nn.embedding_lookup(emb, ids), w))
        opt = tf.compat.v1.train.AdamOptimizer()
        gv = opt.compute_gradients(loss)
        if clip is not None:
            grads, variables = zip(*gv)
            gv = list(zip(tf.clip_by_global_norm(grads, clip)[0], variables))
        opt.apply_gradients(gv, global_step=tf.compat.v1.train.get_or_create_global_step())
    return analyse_graph(graph)


def workers(n: int, replicas: int = 1, hosts: int = 1):
    out = []
    for w in range(n):
        prefix = f"/job:worker/replica:0/task:{w}"
        out.append((f"h{w % hosts}", tuple(f"{prefix}/device:CPU:{i}" for i in range(replicas)),
                    f"{prefix}/device:CPU:0"))
    return out


def syncs(analysis, n, mode, overrides=None):
    choices, notes = choose_sync(analysis, n, 1, mode, overrides)
    return {name: c.sync for name, c in choices.items()}, notes


# ----------------------------------------------------------------------------- cost model
@pytest.mark.parametrize("n", [2, 3])
def test_all_gather_only_below_about_two_over_n_of_the_rows(n):
    shape, row = (10_000, 64), 64 * 4
    threshold = 2 / n * (row + 4) / (row + 8)  # all-gather (n-1)k(r+i) == all-reduce 2(n-1)/n R (r + a count)
    assert choose(shape, 4, True, threshold * 0.95, n) == "allgather"
    assert choose(shape, 4, True, min(1.0, threshold * 1.05), n) == "allreduce"


def test_servers_win_over_all_gather_from_four_workers():
    shape = (10_000, 64)
    assert choose(shape, 4, True, 0.01, 3) == "allgather"  # a tie at n = 3 keeps all-gather
    assert choose(shape, 4, True, 0.01, 4) == "ps"
    assert choose(shape, 4, True, 0.9, 4) == "allreduce"


def test_on_several_hosts_auto_counts_the_bytes_between_hosts_first():
    shape, m = (10_000, 64), 100 * 264  # k (r + i): 100 rows of 64 floats and their indices
    # one worker per host: across, all-gather 2 m; a server on one of the two hosts gets the pushes
    # and reads of the other's worker, 2 m too; in all all-gather sends less (2 m, servers 4 m)
    assert choose(shape, 4, True, 0.01, ["a", "b"]) == "allgather"
    # 2 x 2: across, all-gather sends each host's rows once (hierarchical), 4 m, the servers
    # 8 m / 2 = 4 m; in all, all-gather also broadcasts all rows inside each host: 14 m against 8 m
    two_by_two = ["a", "a", "b", "b"]
    gathered, served = (traffic(s, shape, 4, True, 0.01, two_by_two) for s in ("allgather", "ps"))
    assert gathered.crossing == pytest.approx(4 * m) and served.crossing == pytest.approx(4 * m)
    assert gathered.total == pytest.approx(14 * m) and served.total == pytest.approx(8 * m)
    assert choose(shape, 4, True, 0.01, two_by_two) == "ps"
    # 4 x 2: across, all-gather 8 m, the servers 16 m / 2 = 8 m; inside, all-gather far more
    assert choose(shape, 4, True, 0.01, ["a"] * 4 + ["b"] * 4) == "ps"


def test_dense_gradients_are_always_all_reduced():
    for n in (2, 3, 8, 64):
        assert choose((1000, 100), 4, False, None, n) == "allreduce"
        assert bytes_per_worker("allreduce", (1000, 100), 4, False, None, n) < \
            bytes_per_worker("ps", (1000, 100), 4, False, None, n)


def test_byte_estimates():
    assert bytes_per_worker("allreduce", (100, 10), 4, False, None, 2) == 4000  # 2 (n-1)/n B
    assert bytes_per_worker("ps", (100, 10), 4, False, None, 2) == 8000  # push + pull
    assert bytes_per_worker("allgather", (100, 10), 4, True, 0.1, 3) == 2 * 10 * 48  # (n-1) k (r + i)
    assert bytes_per_worker("ps", (100, 10), 4, True, 0.1, 3) == 2 * 10 * 48  # push rows, ask for them and read
    assert bytes_per_worker("allreduce", (100, 10), 4, True, 0.1, 2) == 4000 + 400  # made dense, with a count
    assert bytes_per_worker("local", (100, 10), 4, False, None, 3) == 0


# ----------------------------------------------------------------------------- per mode
def test_density_comes_from_the_static_shape_of_the_indices():
    choices, _ = choose_sync(static_embedding(), 2, 2, "auto")
    assert choices["emb"].density == pytest.approx(2 * IDS / VOCAB)  # 2 replicas per worker
    assert choices["emb"].density_source == "shapes"
    assert choices["w"].density is None


def lm1b_like():
    """An embedding of LM1B's size (793,470 x 512) and 128 x 20 words per worker: 5 MB of rows per step."""
    return static_embedding(vocab=793_470, dim=512, ids=128 * 20)


@pytest.mark.parametrize("n, expected", [(2, "allgather"), (3, "allgather"), (4, "allgather"), (8, "ps"),
                                         (16, "ps")])
def test_auto_flips_from_all_gather_to_servers_when_they_save_more_than_their_chain(n, expected):
    """From 4 workers the servers send fewer bytes, but only from about 8 (on one host's 100 Gbit/s) do
    those bytes take longer than the servers' synchronous chain costs a step."""
    chosen, notes = syncs(lm1b_like(), n, "auto")
    assert chosen == {"emb": expected, "w": "allreduce"}
    assert bool(notes) == (n == 4)  # where bytes alone chose the servers, a note says why not


@pytest.mark.parametrize("hosts, expected", [(2, "allgather"), (4, "ps")])
def test_on_several_hosts_the_servers_save_over_the_slower_link(hosts, expected):
    """4 workers: on one host the servers' saving (0.7 ms) is below their chain; spread over 4 hosts of a
    10 Gbit/s network, the same bytes take 10 ms."""
    choices, _ = choose_sync(lm1b_like(), 4, 1, "auto", hosts=[f"h{w % hosts}" for w in range(4)])
    assert choices["emb"].sync == expected


@pytest.mark.parametrize("n", [4, 8, 64])
def test_auto_keeps_a_small_embedding_off_the_servers(n):
    chosen, notes = syncs(static_embedding(), n, "auto")
    assert chosen == {"emb": "allgather", "w": "allreduce"}
    assert len(notes) == 1 and "emb: not on the servers" in notes[0] and "synchronous chain" in notes[0]
    c = choose_sync(static_embedding(), n, 1, "auto")[0]["emb"]
    assert c.reason.startswith("AUTO: the servers would save") and "10 Gbit/s between hosts" in c.reason


def test_servers_an_override_asks_for_take_auto_s_choices_too():
    """Once an override puts a variable on the servers, their chain is paid: AUTO's byte choice stands."""
    chosen, notes = syncs(static_embedding(), 8, "auto", {"w": "ps"})
    assert chosen == {"emb": "ps", "w": "ps"} and not notes


@pytest.mark.parametrize("density, expected", [(0.5, "allgather"), (0.99, "allreduce")])
def test_auto_flips_to_all_reduce_when_most_rows_are_touched(density, expected):
    chosen, _ = syncs(static_embedding(), 2, "auto", {"emb": {"density": density}})
    assert chosen["emb"] == expected


def test_hybrid_puts_sparse_on_servers_and_all_reduces_dense():
    assert syncs(static_embedding(), 2, "hybrid")[0] == {"emb": "ps", "w": "allreduce"}
    assert syncs(analyse_graph(build_mlp("adam").graph), 2, "hybrid")[0] == \
        {"dense/bias": "allreduce", "dense/kernel": "allreduce", "out/kernel": "allreduce"}


def test_mpi_all_gathers_sparse_and_ps_puts_everything_on_servers():
    assert syncs(static_embedding(), 2, "allreduce")[0] == {"emb": "allgather", "w": "allreduce"}
    assert syncs(static_embedding(), 2, "ps")[0] == {"emb": "ps", "w": "ps"}
    assert syncs(static_embedding(), 1, "hybrid")[0] == {"emb": "local", "w": "local"}


def test_a_server_variable_coupled_to_all_reduced_updates_is_all_gathered():
    chosen, notes = syncs(static_embedding(clip=1.0), 2, "hybrid")
    assert chosen == {"emb": "allgather", "w": "allreduce"}
    assert any("clip_by_global_norm" in n for n in notes)
    with pytest.raises(PlanError, match='puts "emb" on the parameter servers.*feeds the update of w'):
        syncs(static_embedding(clip=1.0), 2, "hybrid", {"emb": "ps"})


def test_overrides_match_globs_and_partitioned_variables():
    analysis = analyse_graph(build_sequence("adam", partitions=2).graph)
    chosen, _ = syncs(analysis, 2, "hybrid", {"embedding": "allgather", "rnn/*": "ps"})
    assert chosen["embedding/part_0"] == chosen["embedding/part_1"] == "allgather"
    assert partition_of("embedding/part_1") == "embedding" and partition_of("embedding") is None
    assert all(s == "ps" for name, s in chosen.items() if name.startswith("rnn/"))


def test_bad_overrides_are_refused():
    with pytest.raises(PlanError, match='"w": "allgather" needs a sparse gradient'):
        syncs(static_embedding(), 2, "auto", {"w": "allgather"})
    with pytest.raises(PlanError, match="sync must be one of"):
        syncs(static_embedding(), 2, "auto", {"w": "broadcast"})


# ----------------------------------------------------------------------------- the whole plan
def test_mixed_plan_keeps_non_slot_variables_on_every_worker():
    plan = build_plan(static_embedding(), workers(3, hosts=2), run_option="HYBRID", sync=True, average_sparse=True,
                      cross_worker="hybrid", server_devices=SERVER)
    where = {v.name: v.server for v in plan.variables}
    assert where["emb"] == where["emb/Adam"] == where["emb/Adam_1"] == 0
    assert where["w"] is where["w/Adam"] is where["global_step"] is where["beta1_power"] is None
    assert plan.ps.host_aggregation
    # h0 has 2 workers, h1 one: each pushes and reads its rows (the first of h0 pushes both), and
    # the other worker of h0 sends it its rows: 3 x 2 + 1 = 7 x rows, over 3 workers
    assert plan.variable("emb").bytes_per_worker == round(7 * IDS * (DIM * 4 + 8) / 3)
    assert plan.bytes_per_worker == plan.variable("emb").bytes_per_worker + plan.variable("w").bytes_per_worker
    assert "ps:0" in plan.describe() and "host_aggregation=True" in plan.describe()


@pytest.mark.parametrize("count, hosts, aggregated", [(3, 2, True), (4, 1, False), (2, 2, False)])
def test_host_aggregation_only_where_it_can_save_traffic_between_hosts(count, hosts, aggregated):
    """One host: the gather would only add bytes; one worker per host: nothing to gather."""
    plan = build_plan(static_embedding(), workers(count, hosts=hosts), run_option="HYBRID", sync=True,
                      average_sparse=True, cross_worker="hybrid", server_devices=SERVER)
    assert plan.ps.host_aggregation is aggregated


def test_pure_ps_plan_puts_every_variable_on_servers():
    plan = build_plan(analyse_graph(build_embedding("adam").graph), workers(2), run_option="PS", sync=True,
                      average_sparse=True, cross_worker="ps", server_devices=SERVER)
    assert all(v.server == 0 for v in plan.variables)
    assert not plan.ps.host_aggregation


def test_the_options_as_a_record_or_as_keywords_make_one_plan():
    asked = PlanOptions(run_option="HYBRID", sync=True, average_sparse=True, cross_worker=CrossWorker.HYBRID,
                        server_devices=SERVER)
    plan = build_plan(static_embedding(), workers(2), asked)
    assert plan == build_plan(static_embedding(), workers(2), run_option="HYBRID", sync=True, average_sparse=True,
                              cross_worker="hybrid", server_devices=SERVER)
    assert {v.name: str(v.sync) for v in plan.variables if v.gradient is not None} == {"emb": "ps", "w": "allreduce"}
    with pytest.raises(TypeError, match="not both"):
        build_plan(static_embedding(), workers(2), asked, sync=False)


def test_servers_asked_for_but_none_given():
    with pytest.raises(PlanError, match="puts emb on parameter servers, but the job has none"):
        build_plan(static_embedding(), workers(2), run_option="MPI", sync=True, average_sparse=True,
                   cross_worker="allreduce", overrides={"emb": "ps"})


# ----------------------------------------------------------------------------- how many servers a step calls


def servers(count: int, hosts: list[str]):
    return tuple(f"/job:ps/replica:0/task:{i}/device:CPU:0" for i in range(count)), tuple(hosts)


def hybrid_plan(analysis, hosts: int, worker_hosts: list[str] | None = None, server_hosts: list[str] | None = None,
                ps: PSSpec | None = None):
    where = worker_hosts or [f"h{i}" for i in range(hosts)]
    devices, on = servers(len(server_hosts or where), server_hosts or sorted(set(where)))
    jobs = [(h, (f"/job:worker/replica:0/task:{w}/device:CPU:0",), f"/job:worker/replica:0/task:{w}/device:CPU:0")
            for w, h in enumerate(where)]
    return build_plan(analysis, jobs, run_option="HYBRID", sync=True, average_sparse=True, cross_worker="hybrid",
                      server_devices=devices, server_hosts=on, ps=ps)


def test_a_small_embedding_stays_on_one_server_of_three_hosts():
    """0.3 MB of rows a step: spreading them over three hosts' links saves less than two more calls cost."""
    plan = hybrid_plan(static_embedding(vocab=100_000, dim=64, ids=320), 3)
    assert plan.server_devices == ("/job:ps/replica:0/task:0/device:CPU:0",) and plan.server_hosts == ("h0",)
    assert {v.server for v in plan.variables if v.sync == "ps" or v.slot_of == "emb"} == {0}
    note = next(n for n in plan.notes if n.startswith("servers:"))
    assert "1 of 3 hold variables (ps 0 on h0)" in note and "PSConfig.num_servers" in note


def test_lm1b_s_table_is_spread_over_a_server_on_each_host():
    plan = hybrid_plan(lm1b_like(), 3)
    assert plan.server_hosts == ("h0", "h1", "h2")
    assert "servers: 3 of 3 hold variables" in " ".join(plan.notes)


def test_the_one_server_is_on_the_host_with_the_most_workers():
    """Its workers' pushes and reads stay inside their host."""
    plan = hybrid_plan(static_embedding(), 0, worker_hosts=["a", "b", "b", "b"], server_hosts=["a", "b"])
    assert plan.server_devices == ("/job:ps/replica:0/task:1/device:CPU:0",) and plan.server_hosts == ("b",)
    assert all(v.server in (None, 0) for v in plan.variables)


def test_servers_on_one_host_spread_nothing_so_one_holds_the_variables():
    plan = hybrid_plan(lm1b_like(), 0, worker_hosts=["a", "a"], server_hosts=["a", "a", "a"])
    assert len(plan.server_devices) == 1


@pytest.mark.parametrize("wanted, expected", [(2, ("h0", "h1")), (3, ("h0", "h1", "h2")), (9, ("h0", "h1", "h2"))])
def test_ps_config_num_servers_chooses_how_many(wanted, expected):
    plan = hybrid_plan(static_embedding(), 3, ps=PSSpec(num_servers=wanted))
    assert plan.server_hosts == expected
    assert f"PSConfig.num_servers={wanted}" in " ".join(plan.notes)
    assert {v.server for v in plan.variables if v.server is not None} <= set(range(len(expected)))
