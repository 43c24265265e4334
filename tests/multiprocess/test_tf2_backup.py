"""Keras 3's ``BackupAndRestore`` in ``parallax.fit`` (parallax/tf2/backup.py): a training interrupted on one device
after a backup within an epoch, then resumed with ``parallax.fit`` on 2 processes (MPI with ``zero_stage=1``, whose
optimizer slots each worker holds in part; PS, whose variables the chief initialises on the servers), against the
same program resumed with ``model.fit``: the History of the epochs it trains, every weight and optimizer variable
(Adam's step count and moments), and the backups each writes (worker 0's) are equal within 1e-5."""

from __future__ import annotations

import os
import shutil

import numpy as np
import pytest

from tests.multiprocess.harness import LAYOUTS, ROOT, run_script
from tests.tf2.backup_programs import EPOCHS, backup, build, callback, fit_arguments, interrupted, state

pytestmark = [pytest.mark.multiprocess, pytest.mark.slow]

SCRIPT = os.path.join(ROOT, "tests", "tf2", "backup_script.py")


@pytest.fixture(scope="module")
def single_device(tmp_path_factory):
    """The interrupted training's backup, and ``model.fit`` resumed from a copy of it: its end and its backup."""
    base = tmp_path_factory.mktemp("backup")
    interrupted(str(base / "interrupted"))
    shutil.copytree(base / "interrupted", base / "resumed")
    model = build()
    history = model.fit(**fit_arguments(), callbacks=[callback(str(base / "resumed"))])
    return base / "interrupted", state(model, history), backup(str(base / "resumed"))


@pytest.mark.parametrize("layout, zero_stage", [("MPI-2", 1), ("PS-2", 0)], ids=["MPI-2-zero", "PS-2"])
def test_a_training_goes_on_from_its_last_backup_as_model_fit_does(single_device, tmp_path, layout, zero_stage):
    interrupted_dir, expected, expected_backup = single_device
    directory = tmp_path / "backup"
    shutil.copytree(interrupted_dir, directory)
    resources, run_option, _, _ = LAYOUTS[layout]
    run = run_script(tmp_path, resources, "--run_option", run_option, "--zero_stage", str(zero_stage), str(directory),
                     script=SCRIPT, timeout=240)
    assert run.returncode == 0, run.output[-4000:]
    assert list(expected["epochs"]) == list(range(1, EPOCHS))  # the backup of epoch 1's batch 3: from epoch 1 on
    for rank in (0, 1):
        got = run.rank_values(rank)
        assert sorted(got) == sorted(expected)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-7, err_msg=f"rank {rank}: {name}")
    written = backup(str(directory))  # worker 0's, after the last epoch's batch 5 (every 5 batches: 3 + 6 + 6 - 10)
    assert list(written["metadata"]) == list(expected_backup["metadata"])
    for name, value in expected_backup.items():
        np.testing.assert_allclose(written[name], value, rtol=1e-5, atol=1e-7, err_msg=f"backup: {name}")
