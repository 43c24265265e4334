"""What every script of these tests takes, as a user's training script would: ``--resource_info R
--run_option M --out D`` (where each rank writes what it trained)."""

from __future__ import annotations

import argparse


def parser(description: str | None) -> argparse.ArgumentParser:
    """An argument parser with the options every script takes; the script adds its own."""
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--resource_info", required=True)
    p.add_argument("--run_option", required=True)
    p.add_argument("--out", required=True)
    return p
