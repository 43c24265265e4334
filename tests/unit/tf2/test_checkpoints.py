"""A ``tf.function`` step's checkpoints in the program's own form (parallax/tf2/checkpoints.py): what is
refused before anything starts, a checkpoint that does not fit the program's objects, and the initial values
a traced step reads from the program's variables, which run on a worker in every layout (a parameter
server's process does not hold the program's variables)."""

from __future__ import annotations

import numpy as np
import pytest
import tensorflow as tf

import parallax
from parallax.errors import CheckpointError
from parallax.graph.names import INITIAL_VALUE_PREFIX
from parallax.plan import TaskSpec
from parallax.rewrite.pipeline import rewrite_for_task
from parallax.tf2.trace import trace_step
from tests.tf2.checkpoint_programs import build
from tests.tf2.programs import batches
from tests.unit.rewrite.helpers import export
from tests.unit.rewrite.test_ps_sync import ps_plan


def _config(ckpt_dir=None, **fields) -> parallax.Config:
    return parallax.Config(ckpt_config=parallax.CheckPointConfig(ckpt_dir=ckpt_dir, **fields))


def test_a_checkpoint_that_is_no_tf_train_checkpoint_is_refused():
    with pytest.raises(TypeError, match=r"CheckPointConfig.checkpoint must be a tf.train.Checkpoint"):
        parallax.CheckPointConfig(ckpt_dir="d", checkpoint={"model": 1})


def test_a_checkpoint_without_a_directory_is_refused():
    with pytest.raises(ValueError, match="checkpoint needs ckpt_dir"):
        parallax.CheckPointConfig(checkpoint=tf.train.Checkpoint())


def test_a_steps_ckpt_dir_without_the_programs_checkpoint_is_refused_saying_what_to_pass(tmp_path):
    step, _, _, _ = build("keras3-adam")
    with pytest.raises(ValueError, match=r"pass checkpoint=tf.train.Checkpoint\(model=model, optimizer=optimizer\)"):
        parallax.parallel_run(step, "unused", parallax_config=_config(str(tmp_path)))


def test_a_tf1_graphs_checkpoint_object_is_refused():
    graph = tf.Graph()
    with graph.as_default():
        tf.compat.v1.train.GradientDescentOptimizer(0.1).minimize(tf.reduce_sum(tf.compat.v1.get_variable("w", [2])))
    with pytest.raises(ValueError, match="is for a tf.function step"):
        parallax.parallel_run(graph, "unused", parallax_config=_config("d", checkpoint=tf.train.Checkpoint()))


def test_zero_with_the_programs_checkpoint_is_refused(tmp_path):
    step, _, _, checkpoint = build("keras3-adam")
    config = _config(str(tmp_path), checkpoint=checkpoint)
    config = parallax.Config(ckpt_config=config.ckpt_config, zero_stage=1)
    with pytest.raises(ValueError, match="zero_stage"):
        parallax.parallel_run(step, "unused", parallax_config=config)


def test_another_models_checkpoint_is_refused_naming_the_file(tmp_path):
    import keras

    other = keras.Sequential([keras.layers.Embedding(10, 7), keras.layers.Flatten(), keras.layers.Dense(1)])
    other.build((None, 3))
    saved = tf.train.Checkpoint(model=other).save(str(tmp_path / "ckpt"))
    step, _, _, checkpoint = build("keras3-adam")
    with pytest.raises(CheckpointError, match=rf"{saved}.*does not restore into the step's objects"):
        parallax.parallel_run(step, "unused", parallax_config=_config(str(tmp_path), checkpoint=checkpoint))


def test_a_checkpoint_without_the_optimizer_is_refused_once_the_step_is_traced(tmp_path):
    _, model, _, _ = build("keras3-adam")
    saved = tf.train.Checkpoint(model=model).save(str(tmp_path / "ckpt"))
    step, _, _, checkpoint = build("keras3-adam")
    with pytest.raises(CheckpointError, match=rf"{saved} does not fit the step's objects"):
        parallax.parallel_run(step, "unused", parallax_config=_config(str(tmp_path), checkpoint=checkpoint))


def test_initial_values_read_from_the_program_run_on_the_worker_not_on_a_server():
    step, _, _, _ = build("keras3-adam")
    for ids, y in batches(1):
        step(ids, y)  # the slots are no longer a constant fill: they are read from the program at start
    traced = trace_step(step)
    initial = [op for op in traced.graph.get_operations() if op.name.startswith(INITIAL_VALUE_PREFIX + "/")]
    assert {op.type for op in initial} >= {"EagerPyFunc"}
    assert not [op.name for op in initial if op.colocation_groups() != [f"loc:@{op.name}".encode()]]
    plan, task = ps_plan(traced, num_workers=2), TaskSpec(1)
    rewritten = rewrite_for_task(export(traced.graph), plan, task)
    devices = {n.device for n in rewritten.graph_def.node if n.name.startswith(INITIAL_VALUE_PREFIX + "/")}
    assert devices == {plan.workers[1].shared_device}
    assert np.all([not n.attr["_class"].list.s for n in rewritten.graph_def.node
                   if n.name.startswith(INITIAL_VALUE_PREFIX + "/")])
