"""The training script started again as a trial of a layout choice (tune, the partition search)."""

from __future__ import annotations

import os
import sys

from parallax.job.choice import choice_env
from parallax.trials.execute import TrialResult, TrialSpec
from parallax.trials.mode import trial_env

__all__ = ["TrialLauncher"]


class TrialLauncher:
    """Starts the training script (this process's program) as a trial job of a choice, on a runner.

    Args:
        runner: the :class:`~parallax.trials.runner.TrialRunner`.
        program: the script and its arguments (``current_program()``).
        directory: where each trial's directory goes.
        devices: the devices every trial uses (``host/device``): trials of one job do not overlap.
        warmup, steps: the steps a trial discards and times.
        time_limit: seconds a trial may run.
        env: more environment for every trial.
    """

    def __init__(self, runner, program: list[str], directory: str, devices: tuple[str, ...], warmup: int,
                 steps: int, time_limit: float | None, env: dict[str, str] | None = None) -> None:
        self.runner, self.program, self.directory = runner, program, directory
        self.devices, self.warmup, self.steps, self.time_limit = devices, warmup, steps, time_limit
        self.env = env or {}
        self.count = 0

    def spec(self, choice: dict, name: str | None = None) -> TrialSpec:
        """The next trial of ``choice`` (named ``trial-NNN`` unless ``name``)."""
        self.count += 1
        name = name or f"trial-{self.count:03d}"
        return TrialSpec(name, (sys.executable, *self.program), os.path.join(self.directory, name),
                         {**self.env, **choice_env(choice), **trial_env(choice, self.warmup, self.steps)},
                         self.time_limit, self.devices, dict(choice))

    def run_one(self, choice: dict) -> TrialResult:
        """Run one trial of ``choice`` and wait for it."""
        spec = self.spec(choice)
        return next(iter(self.runner.run([spec])))
