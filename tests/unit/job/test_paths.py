"""The directories a job writes into (CheckPointConfig.ckpt_dir, Config.export_graph_path) are checked before
anything starts, and a bad one is refused naming the setting, the path and the problem."""

from __future__ import annotations

import os
import re

import pytest
import tensorflow as tf

import parallax
from parallax.errors import LaunchError
from parallax.job.paths import check_directory, check_paths


def small_graph() -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [None], name="x")
        w = tf.compat.v1.get_variable("w", [], initializer=tf.compat.v1.ones_initializer())
        loss = tf.reduce_mean(tf.square(w * x), name="loss")
        step = tf.compat.v1.train.get_or_create_global_step()
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(loss, global_step=step, name="train")
    return graph


@pytest.fixture
def a_file(tmp_path):
    path = tmp_path / "taken"
    path.write_text("not a directory\n")
    return str(path)


def saving_to(path: str, steps: int | None = 1) -> parallax.CheckPointConfig:
    return parallax.CheckPointConfig(ckpt_dir=path, save_ckpt_steps=steps)


def test_a_ckpt_dir_that_is_a_file_is_refused_naming_the_setting_and_the_path(a_file):
    with pytest.raises(LaunchError, match=rf"^CheckPointConfig\.ckpt_dir '{re.escape(a_file)}' is a file; expected a "
                                          r"directory to save checkpoints in and restore the latest from\. Name a "
                                          r"directory \(it is created when missing\), or move the file away$"):
        check_paths(saving_to(a_file), None, saves=True, exports=False)


def test_a_ckpt_dir_to_restore_from_only_may_be_missing_but_not_a_file(a_file, tmp_path):
    check_paths(saving_to(str(tmp_path / "missing"), None), None, saves=True, exports=False)
    with pytest.raises(LaunchError, match=r"^CheckPointConfig\.ckpt_dir '.*' is a file; expected a directory to "
                                          r"restore the latest checkpoint from\. Name a directory, or move the file"):
        check_paths(saving_to(a_file, None), None, saves=True, exports=False)


def test_a_ckpt_dir_under_a_file_cannot_be_created(a_file):
    with pytest.raises(LaunchError, match=rf"^CheckPointConfig\.ckpt_dir '{re.escape(a_file)}/ckpt' cannot be "
                                          rf"created: '{re.escape(a_file)}' is a file; expected a directory"):
        check_paths(saving_to(os.path.join(a_file, "ckpt")), None, saves=True, exports=False)


def test_a_read_only_ckpt_dir_is_refused_naming_the_user(tmp_path, monkeypatch):
    monkeypatch.setattr(os, "access", lambda path, mode: not mode & os.W_OK)  # root writes anywhere: pretend
    with pytest.raises(LaunchError, match=r"^CheckPointConfig\.ckpt_dir '.*' is a directory this process cannot "
                                          r"write to \(user \S+; its permissions, or a read-only file system\); "
                                          r"expected a directory to save checkpoints in"):
        check_paths(saving_to(str(tmp_path)), None, saves=True, exports=False)
    with pytest.raises(LaunchError, match=r"^CheckPointConfig\.ckpt_dir '.*/new' cannot be created: this process "
                                          r"cannot write to '.*'"):
        check_paths(saving_to(str(tmp_path / "new")), None, saves=True, exports=False)


def test_only_the_processes_that_use_a_directory_check_it(a_file):
    check_paths(saving_to(a_file), a_file, saves=False, exports=False)  # the chief and the workers run elsewhere


def test_a_path_of_a_tensorflow_file_system_is_left_to_tensorflow():
    check_directory("CheckPointConfig.ckpt_dir", "gs://bucket/ckpt", "to save checkpoints in")


def test_an_export_graph_path_that_is_an_existing_file_is_refused(a_file):
    with pytest.raises(LaunchError, match=rf"^Config\.export_graph_path '{re.escape(a_file)}' is a file; expected a "
                                          r"directory where each worker writes its rewritten graph\. Name a directory "
                                          r"\(it is created when missing\), or move the file away$"):
        check_paths(parallax.CheckPointConfig(), a_file, saves=False, exports=True)


@pytest.mark.parametrize("field", ["ckpt_dir", "export_graph_path"])
def test_parallel_run_refuses_a_bad_directory_before_anything_starts(resource_file, a_file, field):
    config = parallax.Config(run_option="PS")
    if field == "ckpt_dir":
        config.ckpt_config = saving_to(a_file)
    else:
        config.export_graph_path = a_file
    with pytest.raises(LaunchError, match=rf"^(CheckPointConfig|Config)\.{field} '.*' is a file"):
        parallax.parallel_run(small_graph(), resource_file("localhost: cpu:0\n"), parallax_config=config)
    assert open(a_file).read() == "not a directory\n"


def test_the_chief_checks_the_ckpt_dir_again_on_its_own_host(resource_file, a_file, monkeypatch):
    """A launched chief may run on another machine than the launcher: it checks before its session starts."""
    monkeypatch.setattr("parallax.api.check_paths", lambda *args, **kwargs: None)  # as if the chief ran elsewhere
    config = parallax.Config(run_option="PS", ckpt_config=saving_to(a_file))
    with pytest.raises(LaunchError, match=r"^CheckPointConfig\.ckpt_dir '.*' is a file"):
        parallax.parallel_run(small_graph(), resource_file("localhost: cpu:0\n"), parallax_config=config)
