"""On a host, the launched job's first process runs the program up to its training call before the others
start (``Config.staggered_start``, :mod:`parallax.member.entry`): data a program prepares on every run (Keras
3's ``get_file(extract=True)`` extracts its archive again each time) is then written by one process at a time,
and every process reads whole files."""

from __future__ import annotations

import json
import os

import pytest

from tests.multiprocess.harness import ROOT, run_script

pytestmark = [pytest.mark.multiprocess, pytest.mark.core]

SCRIPT = os.path.join(ROOT, "tests", "multiprocess", "start_script.py")


def events(out: str) -> list[tuple[str, str]]:
    """``(what, who)`` in the order they happened."""
    with open(os.path.join(out, "events")) as f:
        rows = sorted(line.split() for line in f if line.strip())
    return [(what, who) for _, what, who in rows]


def test_the_hosts_other_ranks_start_when_its_first_reached_the_training_call(tmp_path):
    # 2 ranks: with 3 or more on a host, those after the first start together (docs/launching.md), and two of them
    # rewriting the file at once read different data (CI saw it); the first and the others never do
    run = run_script(tmp_path, "localhost: cpu:0\nlocalhost: cpu:1\n", script=SCRIPT, timeout=240)
    assert run.returncode == 0, run.output[-3000:]
    order = events(run.out_dir)
    assert order[:2] == [("start", "launcher"), ("call", "launcher")]
    ranks = order[2:]
    assert ranks == [("start", "0"), ("call", "0"), ("start", "1"), ("call", "1")], order  # rank 0 alone up to its call
    digests = {json.load(open(os.path.join(run.out_dir, f"rank_{w}.json")))["digest"] for w in range(2)}
    assert len(digests) == 1


def test_staggered_start_off_starts_every_rank_at_once(tmp_path):
    run = run_script(tmp_path, "localhost: cpu:0\nlocalhost: cpu:1\n", "--together", script=SCRIPT, timeout=240)
    assert run.returncode == 0, run.output[-3000:]
    ranks = events(run.out_dir)[2:]
    assert ranks.index(("start", "1")) < ranks.index(("call", "0")), ranks  # rank 0 imports TensorFlow first
