"""Keras 3's ``BackupAndRestore`` before the job is made (parallax/tf2/backup.py): the restore as ``model.fit``
makes it, and the workers' check that they restored the same backup."""

from __future__ import annotations

import numpy as np
import pytest

from parallax.tf2.backup import check_restored_alike, restore_backups, restored_state


def _model():
    import keras

    keras.utils.set_random_seed(0)
    model = keras.Sequential([keras.Input((3,)), keras.layers.Dense(2)])
    model.compile(keras.optimizers.Adam(0.1), "mse")
    return model


def _backed_up(directory) -> list:
    """Two epochs of model.fit backed up into ``directory``; the weights and optimizer variables at the end."""
    import keras

    model = _model()
    model.fit(np.ones((8, 3)), np.zeros((8, 2)), batch_size=4, epochs=2, verbose=0,
              callbacks=[keras.callbacks.BackupAndRestore(str(directory), delete_checkpoint=False)])
    return [v.numpy() for v in model.weights + model.optimizer.variables]


class _Workers:
    """A job's workers as :class:`parallax.comm.group.WorkerGroup` gathers from them: this one and ``others``."""

    def __init__(self, others: list) -> None:
        self.others = others

    def gather(self, value):
        return [value, *self.others]


def test_the_last_backup_is_restored_as_model_fit_restores_it(tmp_path):
    import keras

    trained = _backed_up(tmp_path)
    model = _model()
    callback = keras.callbacks.BackupAndRestore(str(tmp_path))
    assert restore_backups(model, [callback, keras.callbacks.History()], legacy=False) == [callback]
    for got, expected in zip(model.weights + model.optimizer.variables, trained):
        np.testing.assert_array_equal(got.numpy(), expected)
    assert model._initial_epoch == 2  # model.fit goes on from epoch 2
    found, epoch, digest = restored_state(model, [callback])
    assert (found, epoch) == (True, 2) and digest != 0


def test_workers_that_restored_other_backups_are_refused_naming_them(tmp_path):
    import keras

    _backed_up(tmp_path)
    model = _model()
    found = restore_backups(model, [keras.callbacks.BackupAndRestore(str(tmp_path))], legacy=False)
    mine = restored_state(model, found)
    check_restored_alike(_Workers([mine, mine]), model, found)  # all alike: nothing said
    with pytest.raises(ValueError, match=rf"^parallax.fit: BackupAndRestore restored another backup from "
                                         rf"'{tmp_path}' on worker 2 than on worker 0 \(a backup of epoch 2 there, "
                                         r"none on worker 2\): the backup directory must be one that every worker "
                                         r"reads \(a shared file system\), as worker 0 writes it"):
        check_restored_alike(_Workers([mine, (False, None, 0)]), model, found)


def test_workers_that_found_no_backup_start_from_worker_0s_values(tmp_path):
    import keras

    model = _model()
    found = restore_backups(model, [keras.callbacks.BackupAndRestore(str(tmp_path / "none yet"))], legacy=False)
    assert restored_state(model, found) == (False, None, 0)  # their own initial values are not compared
    check_restored_alike(_Workers([(False, None, 0)]), model, found)
    check_restored_alike(_Workers([]), model, [])
