"""What tune and sweep write: their rows as JSON and CSV, a bar plot (PNG), and a live progress line."""

from __future__ import annotations

import csv
import json
import os
import sys
from collections.abc import Sequence
from typing import Any

__all__ = ["write_rows", "bar_plot", "Progress"]


def write_rows(directory: str, rows: list[dict[str, Any]], extra: dict[str, Any] | None = None) -> str:
    """``results.json`` (the rows and ``extra``) and ``results.csv`` in ``directory``; the JSON's path."""
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, "results.json")
    with open(path, "w", encoding="utf-8") as f:
        json.dump({**(extra or {}), "trials": rows}, f, indent=1, default=str)
    with open(os.path.join(directory, "results.csv"), "w", encoding="utf-8", newline="") as f:
        if rows:
            fields = list(dict.fromkeys(k for row in rows for k in row))
            writer = csv.DictWriter(f, fieldnames=fields)
            writer.writeheader()
            writer.writerows(rows)
    return path


def bar_plot(path: str, labels: Sequence[str], values: Sequence[float], best: int | None, xlabel: str,
             title: str) -> str | None:
    """A horizontal bar per value, the best one green; ``None`` when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    fig, ax = plt.subplots(figsize=(9, 0.45 * len(values) + 1.6))
    ax.barh(range(len(values)), values, color=["tab:green" if i == best else "tab:blue" for i in range(len(values))])
    positive = [v for v in values if v > 0]
    if len(positive) == len(values) and max(positive) > 1e3 * min(positive):
        ax.set_xscale("log")  # a diverged trial would flatten the others
    ax.set_yticks(range(len(values)), labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel(xlabel)
    ax.set_title(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


class Progress:
    """The live line: a tqdm bar on a terminal; a line per finished trial otherwise (logs, CI)."""

    def __init__(self, what: str, total: int, enabled: bool, stream: Any = None) -> None:
        self._stream = stream or sys.stderr
        self._what, self._enabled, self._total, self._count = what, enabled, total, 0
        self._bar = None
        if enabled and self._stream.isatty():
            from tqdm import tqdm

            self._bar = tqdm(total=total, unit="trial", file=self._stream, dynamic_ncols=True,
                             bar_format="{desc} |{bar:12}| {n}/{total} [{elapsed}<{remaining}] {postfix}")

    def start(self, label: str) -> None:
        if self._bar is not None:
            self._bar.set_description(f"{self._what}: {label}")

    def done(self, label: str, outcome: str, best: str) -> None:
        self._count += 1
        if self._bar is not None:
            self._bar.set_postfix_str(f"best {best}")
            self._bar.update(1)
        elif self._enabled:
            print(f"{self._what}: trial {self._count}/{self._total} {label}: {outcome}; best {best}",
                  file=self._stream, flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
