"""Pipeline stages and micro-batches across real processes, combined with data parallelism (and ZeRO).

Each rank holds one replica cut into stages on virtual CPU devices of its own; the ranks all-reduce
(MPI) or use servers too (HYBRID). With one device a resource line, each stage is a process of its own
(a stage server, reached over TensorFlow's gRPC runtime; tests/cluster puts them on two hosts). Every
case is compared, variable by variable, with single-device training on the union batch.
"""

from __future__ import annotations

import pathlib
import re

import pytest

from tests.models import train_single_device
from tests.multiprocess.harness import SharedJobs
from tests.multiprocess.test_mpi_mode import BATCH, STEPS, check_ranks_match
from tests.multiprocess.test_zero import expected as expected_without_slots
from tests.multiprocess.train_script import BUILDERS, DATA

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

PLACED = '{"embedding": {"stage": 1}, "proj/*": {"stage": 0}}'
# BATCH rows over 2 ranks: 6 a rank, in 2 or 3 micro-batches
CASES = {
    "dp+pp-adam": ["--model", "mlp", "--optimizer", "adam", "--micro_batches", "3"],
    "dp+pp-1f1b": ["--model", "deep_mlp", "--optimizer", "adam", "--micro_batches", "3", "--pipeline_schedule", "1f1b"],
    "dp+pp-clipped": ["--model", "mlp", "--optimizer", "momentum", "--clip", "0.05", "--micro_batches", "2"],
    "dp+pp-embedding": ["--model", "embedding", "--optimizer", "adam", "--micro_batches", "2"],
    "dp+pp-sequence": ["--model", "sequence", "--optimizer", "adam", "--micro_batches", "3"],
    "dp+pp-idioms": ["--model", "everything", "--optimizer", "adagrad", "--micro_batches", "2"],
    "dp+mp-named-cut": ["--model", "mlp", "--optimizer", "adam", "--pipeline_cuts", "MatMul_1"],
    "dp+zr+pp": ["--model", "mlp", "--optimizer", "adam", "--micro_batches", "3", "--zero_stage", "2"],
    "dp+zr+mp": ["--model", "mlp", "--optimizer", "adam", "--zero_stage", "1"],
    # the user places the embedding (and its lookup) on stage 1, the projection on stage 0
    "dp+pp+mp": ["--model", "embedding", "--optimizer", "adam", "--micro_batches", "2", "--overrides", PLACED],
    "dp+zr+pp+mp": ["--model", "embedding", "--optimizer", "adam", "--micro_batches", "3", "--zero_stage", "2",
                    "--overrides", PLACED],
}
COMMON = ["--steps", str(STEPS), "--batch", str(BATCH), "--average_sparse", "--pipeline_stages", "2",
          "--export_graph_path", "out"]
TWO_RANKS = "localhost: cpu:0,cpu:1,cpu:2,cpu:3\n"  # 2 ranks x 2 stages
FOUR_PROCESSES = "localhost: cpu:0\nlocalhost: cpu:1\nlocalhost: cpu:2\nlocalhost: cpu:3\n"  # 2 x (worker + stage)
GROUPS = {
    "MPI": (TWO_RANKS, COMMON + ["--run_option", "MPI"], CASES),
    "stage-processes": (FOUR_PROCESSES, COMMON + ["--run_option", "MPI"],
                        {c: CASES[c] for c in ("dp+pp-1f1b", "dp+zr+pp", "dp+pp+mp")}),
    "HYBRID": (TWO_RANKS, COMMON + ["--run_option", "HYBRID"],
               {c: CASES[c] for c in ("dp+pp-embedding", "dp+pp-idioms", "dp+pp+mp")}),
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return SharedJobs(tmp_path_factory, GROUPS)


def expected(case: str):
    options = dict(zip(CASES[case][::2], CASES[case][1::2]))
    if "--zero_stage" in options:  # the same models, optimizer and data
        return expected_without_slots("adam-2" if options["--model"] == "mlp" else "embedding-adam-2")
    model, clip = options["--model"], options.get("--clip")
    optimizer = options["--optimizer"]
    graph = BUILDERS[model](optimizer, clip=float(clip)) if clip else BUILDERS[model](optimizer)
    return train_single_device(graph, DATA[model](STEPS, BATCH))


@pytest.mark.parametrize("group, case", [pytest.param(g, c, id=f"{g}-{c}", marks=pytest.mark.xdist_group(f"pp-{g}"))
                                         for g in GROUPS for c in GROUPS[g][2]])
def test_pipelined_ranks_train_as_one_device(jobs, group, case):
    run = jobs.case(group, case)
    check_ranks_match(run, expected(case), 2)
    graph = (pathlib.Path(run.out_dir) / "worker-1_metagraph").read_text()
    options = dict(zip(CASES[case][::2], CASES[case][1::2]))
    micro = int(options.get("--micro_batches", 1))
    assert f"parallax_micro_{micro - 1}/" in graph if micro > 1 else "parallax_micro_" not in graph
    for stage in (0, 1):  # worker 1's replica: its stages on its two devices, cpu:2 and cpu:3 of the line
        assert re.search(f'device: "[^"]*/device:CPU:{2 + stage}"', graph), stage
    if group == "stage-processes":  # stage 1 of worker 1's replica: the second stage server's device
        assert 'device: "/job:stage/replica:0/task:1/device:CPU:3"' in graph
        assert "stage server 1 serving on localhost" in run.output


def test_a_killed_stage_server_ends_the_job_naming_it(tmp_path):
    """Ranks of FOUR_PROCESSES: 0 and 2 the workers, 1 and 3 their stage servers (rank 3: worker 1's stage 1)."""
    from tests.multiprocess.harness import assert_killed_rank_ended_the_job, run_script

    run = run_script(tmp_path, FOUR_PROCESSES, *COMMON, "--run_option", "MPI", "--model", "mlp", "--optimizer", "adam",
                     "--micro_batches", "2", "--kill_server_rank", "3", "--kill_step", "2", "--steps", "60")
    assert_killed_rank_ended_the_job(run, tmp_path, rank="3")
