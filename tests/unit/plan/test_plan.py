import json

import pytest

from parallax.plan import Plan
from tests.models import build_embedding
from tests.unit.rewrite.helpers import plan_for


def test_round_trips_through_json():
    plan, _ = plan_for(build_embedding("adam"), 2)
    again = Plan.from_dict(json.loads(json.dumps(plan.to_dict())))
    assert again == plan


def test_counts_and_replica_offsets():
    plan, _ = plan_for(build_embedding("gd"), 3)
    assert (plan.num_workers, plan.num_replicas, plan.first_replica(0)) == (1, 3, 0)


def test_describe_is_a_table():
    plan, _ = plan_for(build_embedding("gd"), 2)
    assert plan.describe() == "\n".join([
        "run_option=HYBRID sync=True workers=1 replicas=2",
        "  worker 0 on localhost: replicas on /device:CPU:0, /device:CPU:1; shared state on /device:CPU:0",
        "  variable     shape   dtype    bytes  gradient  density  aggregation  sync   where         partition of"
        "  bytes/worker/step",
        "  embedding    [20,4]  float32  320    sparse    unknown  sum          local  every worker  -"
        "             0",
        "  global_step  []      int64    8      -         -        -            -      every worker  -"
        "             0",
        "  proj/kernel  [4,1]   float32  16     dense     -        mean         local  every worker  -"
        "             0",
        "  memory per worker: 344 bytes of variables, 0 bytes of optimizer slots",
        "  estimated bytes each worker sends per step: 0 (see parallax/plan/cost.py)",
    ])


def test_a_layout_is_one_of_four_cases_and_a_misspelt_one_is_an_error():
    from parallax.plan.model import Layout

    assert [str(layout) for layout in Layout] == ["local", "MPI", "PS", "HYBRID"]
    assert Layout("MPI") is Layout.MPI and Layout.MPI == "MPI"  # what the launcher sends its ranks
    assert json.loads(json.dumps({"layout": Layout.HYBRID})) == {"layout": "HYBRID"}
    assert [layout.launched for layout in Layout] == [False, True, True, True]
    assert [layout.all_reduces for layout in Layout] == [False, True, False, True]
    with pytest.raises(ValueError, match="'MPII' is not a valid Layout"):
        Layout("MPII")


def test_a_variables_sync_is_one_of_four_and_cannot_contradict_where_it_lives():
    from parallax.plan.model import Sync, VariablePlacement

    placed = VariablePlacement("w", (2,), "float32", True, None, sync="ps", server=1)
    assert placed.sync is Sync.PS and placed.sync == "ps" and str(placed.sync) == "ps"
    assert VariablePlacement("s", (2,), "float32", False, None, server=0).sync is Sync.LOCAL  # a slot on a server
    with pytest.raises(ValueError, match="allreduce with server 0"):
        VariablePlacement("w", (2,), "float32", True, None, sync="allreduce", server=0)
    with pytest.raises(ValueError, match="sync ps with server None"):
        VariablePlacement("w", (2,), "float32", True, None, sync="ps")
    with pytest.raises(ValueError):
        VariablePlacement("w", (2,), "float32", True, None, sync="all-reduce")
