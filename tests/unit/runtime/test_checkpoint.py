"""A checkpoint that does not fit the graph is refused before anything starts (parallax/runtime/checkpoint.py)."""

from __future__ import annotations

import os

import pytest
import tensorflow as tf

import parallax
from parallax.errors import CheckpointError
from parallax.runtime.checkpoint import check_checkpoint
from tests.models import build_embedding, build_mlp


def save(graph: tf.Graph, directory) -> str:
    with graph.as_default(), tf.compat.v1.Session() as sess:
        sess.run(tf.compat.v1.global_variables_initializer())
        return tf.compat.v1.train.Saver().save(sess, os.path.join(directory, "model"), global_step=3)


def mlp_with_hidden(width: int, dtype=tf.float32) -> tf.Graph:
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.get_variable("dense/kernel", [4, width], dtype)
        tf.compat.v1.get_variable("dense/bias", [width], dtype)
    return graph


def config(directory) -> parallax.CheckPointConfig:
    return parallax.CheckPointConfig(ckpt_dir=str(directory))


def test_nothing_to_check_without_a_directory_or_a_checkpoint_in_it(tmp_path):
    graph = build_mlp("adam").graph
    assert check_checkpoint(parallax.CheckPointConfig(), graph) is None
    assert check_checkpoint(config(tmp_path / "not-yet"), graph) is None
    assert check_checkpoint(config(tmp_path), graph) is None


def test_a_checkpoint_of_this_graph_is_the_one_restored(tmp_path):
    graph = build_mlp("adam").graph
    path = save(graph, tmp_path)
    assert check_checkpoint(config(tmp_path), build_mlp("adam").graph) == path


def test_another_models_checkpoint_of_the_same_names_is_refused_naming_the_file_the_variables_and_both_shapes(
        tmp_path):
    path = save(mlp_with_hidden(16), tmp_path)
    with pytest.raises(CheckpointError, match=(
            rf"^CheckPointConfig\.ckpt_dir='{tmp_path}': its latest checkpoint {path} does not fit this graph: "
            r'"dense/bias" has shape \[16\] there but \[8\] in the graph; "dense/kernel" has shape \[4, 16\] there '
            r"but \[4, 8\] in the graph\. Nothing was restored or overwritten\. Point ckpt_dir at this model's "
            r"checkpoints, or at an empty directory to start afresh$")):
        check_checkpoint(config(tmp_path), mlp_with_hidden(8))


def test_variables_missing_from_it_are_refused_after_those_that_differ(tmp_path):
    save(mlp_with_hidden(16), tmp_path)
    with pytest.raises(CheckpointError, match=(
            r'does not fit this graph: "dense/bias" has shape \[16\] there but \[8\] in the graph; "dense/kernel" '
            r'has shape \[4, 16\] there but \[4, 8\] in the graph; "beta1_power" \(shape \[\]\) is not in it; .*; '
            r"and 4 more\. Nothing was restored")):
        check_checkpoint(config(tmp_path), build_mlp("adam").graph)


def test_a_variable_of_another_dtype_is_refused(tmp_path):
    save(mlp_with_hidden(8, tf.float64), tmp_path)
    with pytest.raises(CheckpointError, match=r'"dense/bias" is float64 there but float32 in the graph'):
        check_checkpoint(config(tmp_path), mlp_with_hidden(8))


def test_a_partitioned_variable_is_checked_as_the_whole_it_is_saved_as(tmp_path):
    from tests.models import build_sequence

    save(build_sequence("adam", partitions=2).graph, tmp_path)  # saved whole: "embedding" [20, 4]
    assert check_checkpoint(config(tmp_path), build_sequence("adam", partitions=None).graph)
    assert check_checkpoint(config(tmp_path), build_sequence("adam", partitions=2).graph)


def test_parallel_run_refuses_it_before_anything_starts_and_leaves_the_files_alone(tmp_path, resource_file):
    ckpt = tmp_path / "ckpt"
    save(build_embedding("adam").graph, ckpt)
    before = {f: os.path.getmtime(ckpt / f) for f in os.listdir(ckpt)}
    cfg = parallax.Config(run_option="MPI", ckpt_config=config(ckpt))
    with pytest.raises(CheckpointError, match=r"does not fit this graph"):
        parallax.parallel_run(build_mlp("adam").graph, resource_file("localhost: cpu:0,cpu:1\n"),
                              parallax_config=cfg)
    assert {f: os.path.getmtime(ckpt / f) for f in os.listdir(ckpt)} == before
