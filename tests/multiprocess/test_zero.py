"""Sharded optimizer states (``zero_stage``, ZeRO stages 1 and 2) across real processes.

Every case trains a few steps on worker processes that each keep and update their part of
every dense variable's slots, and is compared, variable by variable, with single-device
training on the union batch (the slots themselves are held in parts, so they are compared
through what they do: the variables they update, step after step).
"""

from __future__ import annotations

import numpy as np
import pytest

from parallax.analysis import analyse_graph
from tests.models import train_single_device
from tests.multiprocess.harness import SharedJobs
from tests.multiprocess.test_mpi_mode import BATCH, STEPS, check_ranks_match, resources
from tests.multiprocess.train_script import BUILDERS, DATA

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

# case: (model, optimizer, zero stage, clip by global norm)
CASES = {
    "adam-1": ("mlp", "adam", 1, None),
    "adam-2": ("mlp", "adam", 2, None),
    "momentum-2-clipped": ("mlp", "momentum", 2, 0.05),
    "adagrad-1-clipped": ("mlp", "adagrad", 1, 0.05),
    "rmsprop-2": ("mlp", "rmsprop", 2, None),
    "ref-variables-adam-2": ("mlp_ref", "adam", 2, None),
    "embedding-adam-2": ("embedding", "adam", 2, None),
    "idioms-1": ("everything", "adagrad", 1, None),
    "two-optimizers-2": ("two_optimizers", "adam", 2, None),
}


def options(case: str) -> list[str]:
    model, optimizer, stage, clip = CASES[case]
    return ["--model", model, "--optimizer", optimizer, "--zero_stage", str(stage)] + \
        (["--clip", str(clip)] if clip else [])


COMMON = ["--steps", str(STEPS), "--batch", str(BATCH), "--average_sparse"]
GROUPS = {
    # two workers: every case; three: parts padded (the variables' sizes are not multiples of 3)
    "MPI-2": (resources(2), COMMON + ["--run_option", "MPI"], {c: options(c) for c in CASES}),
    "MPI-3": (resources(3), COMMON + ["--run_option", "MPI"],
              {c: options(c) for c in ("adam-2", "momentum-2-clipped", "adagrad-1-clipped", "idioms-1")}),
    # HYBRID: the sparse variables on a server, the dense ones all-reduced and sharded
    "HYBRID-3": (resources(3), COMMON + ["--run_option", "HYBRID"],
                 {c: options(c) for c in ("embedding-adam-2", "idioms-1")}),
}


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    return SharedJobs(tmp_path_factory, GROUPS)


def expected(case: str) -> dict[str, np.ndarray]:
    """Single-device values of every variable but the optimizer slots."""
    model_name, optimizer, _, clip = CASES[case]
    model = BUILDERS[model_name](optimizer, clip=clip) if clip else BUILDERS[model_name](optimizer)
    slots = {v.name for v in analyse_graph(model.graph).variables if v.slot_of}
    values = train_single_device(model, DATA[model_name](STEPS, BATCH))
    return {k: v for k, v in values.items() if k not in slots}


def grouped(group: str, case: str, extended: bool = False):
    marks = [pytest.mark.xdist_group(f"zero-{group}")] + ([pytest.mark.extended] if extended else [])
    return pytest.param(group, case, id=f"{group}-{case}", marks=marks)


@pytest.mark.parametrize("group, case", [grouped(g, c, extended=g == "MPI-3") for g in GROUPS
                                         for c in GROUPS[g][2]])
def test_sharded_optimizer_states_train_as_one_device(jobs, group, case):
    check_ranks_match(jobs.case(group, case), expected(case), int(GROUPS[group][0].count("cpu:")))
