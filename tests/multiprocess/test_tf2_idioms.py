"""TensorFlow 2 programs written in every idiom, covered pairwise (tests/tf2/idiom_programs.py: layout x optimizer
x loss scaling x how an embedding is looked up x input form and shuffle x synchronised batch norm x ``fit`` or
the step's signature and return), each moved onto Parallax with the one-line change and compared with the same
program run on one device as written: every weight of the model on every worker (rtol 1e-5), and ``fit``'s
History. Plain SGD meets every value of every other axis, so a gradient of the wrong scale shows. The reference
is the program's own run, never Parallax's code."""

from __future__ import annotations

import functools
import os

import numpy as np
import pytest

from tests.multiprocess.harness import LAYOUTS, ROOT, ScriptJobs
from tests.tf2.idiom_programs import TABLES, combinations, name_of, parse

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "idiom_script.py")
COMBINATIONS = [(c["layout"], name_of(c)) for c in combinations()]


def _job(layout: str, name: str) -> str:
    """HYBRID chooses the job's processes from the graph: servers where a table is looked up by the batch."""
    if layout != "HYBRID-2":
        return layout
    return f"{layout}:{'tables' if parse(name)['embedding'] in TABLES else 'dense'}"


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    keys = {_job(layout, name): layout for layout, name in COMBINATIONS}
    return {key: ScriptJobs(tmp_path_factory, SCRIPT, {layout: (LAYOUTS[layout][0], ["--run_option",
                                                                                    LAYOUTS[layout][1]])},
                            [name for where, name in COMBINATIONS if _job(where, name) == key])
            for key, layout in sorted(keys.items())}


@functools.cache
def reference(name: str):
    from tests.tf2.idiom_programs import run

    return run(name)


@pytest.mark.parametrize("layout, name", [
    pytest.param(layout, name, marks=pytest.mark.xdist_group(f"idioms-{_job(layout, name)}"), id=f"{layout}-{name}")
    for layout, name in COMBINATIONS])
def test_a_program_in_every_idiom_trains_as_it_does_on_one_device(jobs, layout, name):
    out = jobs[_job(layout, name)].case(layout, name)
    weights, losses = reference(name)
    for rank in range(LAYOUTS[layout][2]):
        where = f"{layout} {name} rank {rank}"
        with np.load(os.path.join(out, f"rank_{rank}.npz")) as got:
            np.testing.assert_allclose(got["losses"], losses, rtol=1e-5, err_msg=f"{where}: the History's losses")
            assert len([k for k in got.files if k.startswith("v")]) == len(weights), where
            for i, value in enumerate(weights):
                np.testing.assert_allclose(got[f"v{i}"], value, rtol=1e-5, atol=1e-6, err_msg=f"{where}: weight {i}")
