"""A TensorFlow 2 program's checkpoints in its own form (``CheckPointConfig(checkpoint=tf.train.Checkpoint(...))``,
parallax/tf2/checkpoints.py): a job of 2 processes in MPI trains 4 steps, saving every 2; a job of another
mode (PS) goes on from its last checkpoint to step 8. Every checkpoint restores into the plain single-device
program and holds what eager training on one device holds after as many steps: the model's variables, the
optimizer's slots and its iteration counter."""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import pytest

from tests.multiprocess.harness import ROOT, in_group, run_command
from tests.requirements import unavailable

# one worker runs the module's two jobs for both cases (each xdist worker that took a case ran them: 44 s twice)
pytestmark = [pytest.mark.multiprocess, pytest.mark.slow, in_group("tf2-checkpoints")]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "checkpoint_script.py")
CASES = ["keras3-adam", "tfkeras-adam"]
RUNS = [("MPI", "localhost: cpu:0,cpu:1\n", 4), ("PS", "localhost: cpu:0\nlocalhost: cpu:1\n", 8)]


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    import importlib.util

    if importlib.util.find_spec("tf_keras") is None:
        unavailable("tf_keras is not installed (a case needs it)",
                    "`make test` installs it (pip install --no-deps tf_keras)")
    root = tmp_path_factory.mktemp("tf2-checkpoints")
    ckpt_dir, outs = root / "ckpt", []
    for option, text, until in RUNS:
        tmp = root / option
        tmp.mkdir()
        (tmp / "resource_info").write_text(text)
        run = run_command(tmp, [sys.executable, SCRIPT, "--resource_info", str(tmp / "resource_info"), "--run_option",
                                option, "--out", str(tmp / "out"), "--ckpt_dir", str(ckpt_dir), "--until", str(until),
                                *CASES], timeout=300)
        assert run.returncode == 0, run.output[-4000:]
        outs.append(tmp / "out")
    return ckpt_dir, outs


def _eager_state(case: str, steps: int, tmp_path) -> dict[str, np.ndarray]:
    from tests.tf2.checkpoint_programs import build, state
    from tests.tf2.programs import batches

    step, _, _, checkpoint = build(case)
    for ids, y in batches(steps):
        step(ids, y)
    return state(checkpoint.save(str(tmp_path / case / "reference")))


@pytest.mark.parametrize("case", CASES)
def test_a_resumed_job_goes_on_from_the_programs_own_checkpoint(jobs, case, tmp_path):
    from tests.tf2.checkpoint_programs import state

    ckpt_dir, outs = jobs
    for out, (option, _, until), start in zip(outs, RUNS, (0, 4)):
        for rank in (0, 1):
            with open(out / case / f"rank_{rank}.json") as f:
                assert json.load(f) == {"start": start, "iterations": until}, (option, rank)
    directory = ckpt_dir / case
    assert sorted(p for p in os.listdir(directory) if p.endswith(".index")) == \
        [f"ckpt-{n}.index" for n in (2, 4, 6, 8)]
    for steps in (2, 4, 6, 8):
        want, got = _eager_state(case, steps, tmp_path / str(steps)), state(str(directory / f"ckpt-{steps}"))
        assert sorted(got) == sorted(want) and len(want) == 17  # 5 variables, 2 slots each, the counters
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, rtol=1e-5, atol=1e-6, err_msg=f"{case} step {steps}: {key}")
