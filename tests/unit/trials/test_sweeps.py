"""parallax.sweep refuses a train_fn the trials cannot get (they run it in processes of their own) before anything
starts, naming train_fn, why it must be picklable and what to do."""

from __future__ import annotations

import threading

import pytest

import parallax

LOCK = threading.Lock()


def test_a_train_fn_that_cannot_be_pickled_is_refused_naming_it_and_what_to_do(tmp_path):
    lock = threading.Lock()

    def train(params, resource_info):
        with lock:
            return 1.0

    res = tmp_path / "res"
    res.write_text("localhost: cpu:0\n")
    with pytest.raises(TypeError, match=(
            r"^sweep: train_fn '.*train' cannot be pickled \(TypeError: cannot pickle '_thread\.lock' object\)\. "
            r"Each trial runs train_fn in a process of its own \(on this machine or a Dask worker\), which gets it "
            r"pickled with what it refers to; .* Create what cannot be pickled \(locks, threads, sessions, open "
            r"files, connections\) inside train_fn, or define train_fn at module level in a module the trials can "
            r"import \(it is then pickled by name\)$")):
        parallax.sweep(train, {"lr": [0.1]}, str(res), output=str(tmp_path / "out"), progress=False)
    assert not (tmp_path / "out").exists()  # nothing started, nothing written


def test_a_train_fn_that_is_not_a_function_is_refused(tmp_path):
    with pytest.raises(TypeError, match=r"^sweep: train_fn must be a function \(params, resource_info\) -> metric, "
                                        r"got str$"):
        parallax.sweep("train.py", {"lr": [0.1]}, str(tmp_path / "res"))


def test_a_space_value_that_cannot_be_pickled_is_refused_naming_its_key(tmp_path):
    with pytest.raises(TypeError, match=r"^sweep: space\['lock'\] cannot be pickled \(TypeError: .*\); each trial "
                                        r"gets the space pickled"):
        parallax.sweep(len, {"lock": [LOCK]}, str(tmp_path / "res"))
