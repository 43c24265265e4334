"""On a host, the launched job's processes run the program up to their training call one after another
(``Config.staggered_start``, :mod:`parallax.member.entry`): data a program prepares on every run (Keras 3's
``get_file(extract=True)`` extracts its archive again each time) is then written by one process at a time,
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


@pytest.mark.parametrize("ranks", [2, 3])
def test_a_hosts_ranks_run_up_to_the_training_call_one_after_another(tmp_path, ranks):
    """Each rank starts when the one before it on the host has reached its training call: with 3 ranks, ranks 1
    and 2 started together until 2026-12-05 and could rewrite the file while the other read it (CI saw it)."""
    resources = "".join(f"localhost: cpu:{i}\n" for i in range(ranks))
    run = run_script(tmp_path, resources, script=SCRIPT, timeout=240)
    assert run.returncode == 0, run.output[-3000:]
    order = events(run.out_dir)
    assert order[:2] == [("start", "launcher"), ("call", "launcher")]
    assert order[2:] == [(what, str(r)) for r in range(ranks) for what in ("start", "call")], order
    digests = {json.load(open(os.path.join(run.out_dir, f"rank_{w}.json")))["digest"] for w in range(ranks)}
    assert len(digests) == 1


def test_staggered_start_off_starts_every_rank_at_once(tmp_path):
    run = run_script(tmp_path, "localhost: cpu:0\nlocalhost: cpu:1\n", "--together", script=SCRIPT, timeout=240)
    assert run.returncode == 0, run.output[-3000:]
    ranks = events(run.out_dir)[2:]
    assert ranks.index(("start", "1")) < ranks.index(("call", "0")), ranks  # rank 0 imports TensorFlow first
