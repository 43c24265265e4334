"""benchmarks/tf2.py (``make bench-tf2``): its summary of the rounds and its table (no run)."""

from __future__ import annotations

import pytest

from benchmarks import tf2


def row(run, round_, epoch_rate, within_rate):
    return {"run": run, "label": tf2.LABELS[run], "model": "A", "input": "numpy", "round": round_,
            "steps_per_sec": epoch_rate, "within_steps_per_sec": within_rate}


def test_each_rounds_ratios_to_model_fit_by_epochs_and_within_epochs():
    rows = [row("fit", 0, 100.0, 120.0), row("parallax-mpi", 0, 80.0, 96.0),
            row("fit", 1, 50.0, 100.0), row("parallax-mpi", 1, 60.0, 110.0)]
    mine = next(e for e in tf2.summarize(rows, 2) if e["run"] == "parallax-mpi")
    assert mine["ratios"] == pytest.approx([0.8, 1.2]) and mine["ratio"] == pytest.approx(1.0)
    assert mine["within_ratios"] == pytest.approx([0.8, 1.1]) and mine["within_ratio"] == pytest.approx(0.95)
    table = tf2.table({"models": ["A"], "inputs": ["numpy"], "summary": tf2.summarize(rows, 2)})
    assert "| parallax.fit MPI x2 | 70.0 | 1.00x (0.80, 1.20) | 0.95x (0.80, 1.10) |" in table


def test_a_run_without_the_steps_within_epochs_has_no_such_ratio():
    rows = [row("fit", 0, 100.0, 120.0), row("horovod", 0, 50.0, None)]
    del rows[1]["within_steps_per_sec"]  # its epochs had no steps within (one step each)
    mine = next(e for e in tf2.summarize(rows, 1) if e["run"] == "horovod")
    assert mine["ratio"] == pytest.approx(0.5) and mine["within_ratio"] is None
