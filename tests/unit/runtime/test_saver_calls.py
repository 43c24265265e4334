"""A program's own tf.compat.v1.train.Saver through the session (parallax/runtime/saver_calls.py): a save writes on
the chief only, under the single-device graph's names; a restore runs on every worker; a sharded saver too."""

from __future__ import annotations

import os

import numpy as np
import pytest
import tensorflow as tf

from parallax.runtime.hooks import SessionTranslation
from parallax.runtime.saver_calls import RESTORE, SAVE, SaverCalls
from parallax.runtime.session import ParallaxSession
from parallax.runtime.translate import Translator


def program(sharded: bool = False):
    graph = tf.Graph()
    with graph.as_default():
        v = tf.compat.v1.Variable([1.0, 2.0], name="v")
        step = tf.compat.v1.train.get_or_create_global_step()
        bump = tf.compat.v1.assign_add(v, [1.0, 1.0], name="bump")
        saver = tf.compat.v1.train.Saver(sharded=sharded)
    return graph, v, step, bump, saver


def session(graph, chief=True, held=None):
    """The session parallel_run would give over an unchanged copy of ``graph`` (one replica)."""
    rewritten = tf.Graph()
    with rewritten.as_default():
        tf.compat.v1.train.import_meta_graph(tf.compat.v1.train.export_meta_graph(graph=graph))
        init = tf.compat.v1.global_variables_initializer()
    raw = tf.compat.v1.Session(graph=rewritten)
    raw.run(init)
    translator = Translator(rewritten, graph, frozenset(), 1, held)
    return ParallaxSession(raw, SessionTranslation(translator, chief=chief), hooks=False)


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "sharded"])
def test_the_savers_calls_are_told_apart_from_the_programs_runs(sharded):
    graph, v, _, bump, saver = program(sharded)
    calls = SaverCalls(graph)
    filename = saver.saver_def.filename_tensor_name
    assert filename in calls.filenames
    assert calls.kind([saver.saver_def.save_tensor_name], [filename]) == SAVE
    assert calls.kind([saver.saver_def.restore_op_name], [filename]) == RESTORE
    assert calls.kind([bump.name], []) is None and calls.kind([bump.name], ["v:0"]) is None


@pytest.mark.parametrize("sharded", [False, True], ids=["plain", "sharded"])
def test_the_chief_saves_under_the_single_device_names_and_a_plain_graph_restores_them(tmp_path, sharded):
    graph, v, step, bump, saver = program(sharded)
    with graph.as_default():
        sess = session(graph)
        sess.run(bump)
        assert int(sess.run(step)) == 0  # one value per replica; int() takes it when they agree
        path = saver.save(sess, str(tmp_path / "model"), global_step=step)
    assert path == str(tmp_path / "model-0")
    reader = tf.train.load_checkpoint(path)
    np.testing.assert_allclose(reader.get_tensor("v"), [2.0, 3.0])
    assert os.path.exists(path + ".meta")  # the single-device graph, as sess.graph is


def test_another_worker_writes_nothing_and_gets_the_path_back(tmp_path):
    graph, _, _, _, saver = program()
    with graph.as_default():
        path = saver.save(session(graph, chief=False), str(tmp_path / "model"), write_meta_graph=False)
    assert path == str(tmp_path / "model")
    assert not [f for f in os.listdir(tmp_path) if f.startswith("model.")]  # no index, no data


def test_a_restore_through_the_session_sets_the_variables(tmp_path):
    graph, v, _, bump, saver = program()
    with graph.as_default():
        first = session(graph)
        first.run(bump)
        path = saver.save(first, str(tmp_path / "model"))
        again = session(graph, chief=False)  # every worker restores
        saver.restore(again, path)
        np.testing.assert_allclose(again.run(v)[0], [2.0, 3.0])


def test_optimizer_slots_kept_in_parts_are_refused_with_what_to_use(tmp_path):
    graph, _, _, _, saver = program()
    with graph.as_default():
        sess = session(graph, held={"v": "kept in parts"})
        with pytest.raises(ValueError, match=r"^this program's tf\.compat\.v1\.train\.Saver cannot save or restore the "
                                             r"optimizer slots that zero_stage keeps in parts.*CheckPointConfig"):
            saver.save(sess, str(tmp_path / "model"))
