"""``parallax tune``: short trials of the layouts the cost model ranks best; the fastest is kept.

1. The script runs up to its ``parallel_run`` once, which plans every layout of
   the space and orders them by predicted cost (:mod:`parallax.tuning.candidates`).
2. Trials of the candidates, in that order, within a budget of trials or
   seconds, on the trial runner (local processes or Dask,
   :mod:`parallax.trials.runner`): each is the whole job started with the
   candidate's choice, timing a few steps (:mod:`parallax.trials.mode`). A
   live line shows the trial running and the best so far.
3. A table and a plot (PNG) of steps/s per trial, JSON and CSV of every result,
   and where the fastest stood in the cost model's order; the fastest choice is
   stored (:mod:`parallax.tuning.cache`) for the next ``parallel_run`` of the same
   graph and resources.
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any

from parallax.errors import ParallaxError
from parallax.invocation import Invocation, PlanRequest
from parallax.trials.execute import TrialResult, TrialSpec, run_trial, tail_of
from parallax.trials.report import Progress, bar_plot, write_rows
from parallax.trials.runner import make_runner
from parallax.trials.script import TrialLauncher
from parallax.tuning.cache import store_tuned
from parallax.tuning.candidates import Candidate
from parallax.tuning.search import cache_path, store_entry

__all__ = ["tune", "TuneReport", "TuneTrial", "TuneError", "HISTORY_FILE"]

HISTORY_FILE = "tune_history.json"


class TuneError(ParallaxError):
    """The tune cannot run: the script did not plan, or no trial measured a step."""


@dataclass
class TuneTrial:
    """A tried candidate and what became of its trial."""

    candidate: Candidate
    result: TrialResult

    @property
    def ok(self) -> bool:
        return self.result.ok

    @property
    def step_seconds(self) -> float | None:
        return float(self.result.value["step_seconds"]) if self.ok else None

    @property
    def steps_per_second(self) -> float | None:
        return 1.0 / self.step_seconds if self.ok else None

    def row(self) -> dict[str, Any]:
        c = self.candidate
        return {"trial": self.result.name, "model_order": c.order, "choice": c.label, "layout": c.layout,
                "processes": c.processes, "status": self.result.status,
                "step_ms": None if not self.ok else round(self.step_seconds * 1e3, 3),
                "steps_per_second": None if not self.ok else round(self.steps_per_second, 3),
                "bytes_per_step": round(c.bytes_per_step), "memory_per_worker": c.memory_per_worker,
                "predicted_comm_ms": round(c.predicted_seconds * 1e3, 4), "error": self.result.error,
                "log": self.result.log}


@dataclass
class TuneReport:
    """What a tune found: every trial in the order run, the fastest, and the candidates not tried."""

    key: str
    trials: list[TuneTrial]
    untried: list[Candidate]
    refused: list[Candidate]
    seconds: float
    directory: str
    stored: str | None = None
    plot: str | None = None
    history: dict[str, int] = field(default_factory=dict)

    @property
    def best(self) -> TuneTrial | None:
        done = [t for t in self.trials if t.ok]
        return min(done, key=lambda t: t.step_seconds) if done else None

    @property
    def model_rank(self) -> int | None:
        """Where the fastest trial stood in the cost model's order (1: its first choice)."""
        return self.best.candidate.order if self.best else None

    def table(self) -> str:
        """The results, one line per trial, fastest marked."""
        best = self.best
        lines = [f"{'':2}{'#':>3} {'model':>5}  {'ms/step':>9} {'steps/s':>8} {'MB/step':>8}  {'procs':>5}  choice",
                 "  (model: the cost model's order; MB/step: the plan's traffic model, all processes)"]
        for t in self.trials:
            mark = "* " if t is best else "  "
            if t.ok:
                timing = f"{t.step_seconds * 1e3:9.2f} {t.steps_per_second:8.2f}"
            else:
                timing = f"{t.result.status:>9} {'':8}"
            lines.append(f"{mark}{t.result.name.rsplit('-', 1)[-1]:>3} {t.candidate.order:>5}  {timing} "
                         f"{t.candidate.bytes_per_step / 1e6:8.2f}  {t.candidate.processes:>5}  {t.candidate.label}")
        for t in self.trials:
            if not t.ok:
                lines.append(f"  {t.result.describe()}")
        if self.untried:
            lines.append(f"  not tried (budget): {len(self.untried)} candidate(s), the next: {self.untried[0].label}")
        for c in self.refused:
            lines.append(f"  refused by the planner: {c.label}: {c.error}")
        return "\n".join(lines)

    def summary(self) -> str:
        best = self.best
        if best is None:
            return "no trial measured a step"
        text = (f"fastest: {best.candidate.label}: {best.step_seconds * 1e3:.2f} ms/step "
                f"({best.steps_per_second:.2f} steps/s), the cost model's #{best.candidate.order} of "
                f"{len(self.trials) + len(self.untried)}, trial {self.trials.index(best) + 1}; "
                f"{len(self.trials)} trial(s) in {self.seconds:.0f} s")
        if self.history.get("tunes"):
            h = self.history
            text += (f"\nthe cost model's first choice was the fastest in {h['first']} of {h['tunes']} tune(s) "
                     f"recorded here, among its first three in {h['top3']}")
        return text


def _candidates(script: str, script_args: list[str], resource_info: str, space: dict | None, timeout: float,
                env: dict[str, str], directory: str) -> dict:
    """Run the script up to its ``parallel_run``, which plans and orders the layouts (its output goes to
    ``plan.log`` in ``directory``, shown when it fails)."""
    output = os.path.join(directory, "candidates.json")
    log = os.path.join(directory, "plan.log")
    if os.path.exists(output):
        os.remove(output)
    request = Invocation(plan=PlanRequest(resource_info, tune={"space": space or {}}, output=output))
    spec = TrialSpec("plan", (sys.executable, script, *script_args), directory, {**env, **request.to_env()}, timeout)
    outcome = run_trial(spec)
    if outcome.status == "timeout" or outcome.returncode != 0 or not os.path.exists(output):
        why = (outcome.error if outcome.returncode != 0 or outcome.status == "timeout" else
               "it ended without calling parallax.parallel_run")
        raise TuneError(f"parallax tune: {script} did not plan its layouts: {why}; its output ({log}):\n"
                        f"{tail_of(spec.log_path)}")
    os.replace(spec.log_path, log)
    with open(output, encoding="utf-8") as f:
        return json.load(f)


def _devices(resource_info: str) -> tuple[str, ...]:
    from parallax.resources.files import parse_resource_file

    cluster = parse_resource_file(resource_info)
    return cluster.device_keys()


def tune(script: str, resource_info: str, script_args: list[str] | tuple[str, ...] = (), *, trials: int = 8,
         time_budget: float | None = None, backend: str = "local", scheduler: str | None = None,
         space: dict[str, list] | None = None, warmup: int = 3, steps: int = 20, time_limit: float = 300.0,
         output: str | None = None, store: bool = True, progress: bool = True,
         plan_timeout: float = 600.0, cache_root: str | None = None) -> TuneReport:
    """Find the fastest layout of a training script on a resource file (see the module docstring).

    Args:
        script: the training script (it calls ``parallax.parallel_run``).
        resource_info: the resource file (replaces the script's).
        script_args: the script's arguments.
        trials: at most this many trials.
        time_budget: stop starting trials after this many seconds.
        backend: ``"local"`` (processes) or ``"dask"``.
        scheduler: a Dask scheduler's address (``None``: an embedded LocalCluster).
        space: values a choice may take, e.g. ``{"run_option": ["MPI", "PS"]}``
            (:data:`~parallax.tuning.candidates.SPACE_KEYS`).
        warmup, steps: steps each trial discards, and times (the script must run at least both).
        time_limit: seconds one trial may run.
        output: where the table, plot, JSON, CSV and trial logs go (default ``./parallax_tune``).
        store: keep the fastest choice for the next ``parallel_run`` (:mod:`parallax.tuning.cache`).
        progress: show a live progress line.
        plan_timeout: seconds the script may take to plan its layouts.
        cache_root: the cache the choice and the tunes' history are kept in (``PARALLAX_CACHE_DIR``;
            ``None``: the default, ``~/.cache/parallax``).

    Raises:
        TuneError: the script did not plan, or no trial measured a step.
        FileNotFoundError: the script or resource file is missing.
        ValueError: a bad budget, space or back end.
    """
    for path, what in ((script, "script"), (resource_info, "resource file")):
        if not os.path.exists(path):
            raise FileNotFoundError(f"parallax tune: {what} {path!r} not found")
    if isinstance(trials, bool) or not isinstance(trials, int) or trials < 1:
        raise ValueError(f"parallax tune: trials must be an int >= 1, got {trials!r}")
    for name, value in (("time_budget", time_budget), ("time_limit", time_limit), ("plan_timeout", plan_timeout)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0):
            raise ValueError(f"parallax tune: {name} must be a number of seconds > 0"
                             f"{' (or None: no budget)' if name == 'time_budget' else ''}, got {value!r}")
    if min(warmup, steps) < 0 or steps < 1:
        raise ValueError(f"parallax tune: steps must be >= 1 and warmup >= 0, got {warmup},{steps}")
    began = time.monotonic()
    script, resource_info = os.path.abspath(script), os.path.abspath(resource_info)
    directory = os.path.abspath(output or "parallax_tune")
    os.makedirs(directory, exist_ok=True)
    # every run of the script: this resource file, and no layout an earlier tune stored
    env = Invocation(resource_info=resource_info, use_tuned=False).to_env()
    root = cache_root or Invocation().cache_root()
    planned = _candidates(script, list(script_args), resource_info, space, plan_timeout, env, directory)
    candidates = [Candidate.from_dict(c) for c in planned["candidates"]]
    runnable = [c for c in candidates if c.runnable]
    refused = [c for c in candidates if not c.runnable]
    if not runnable:
        raise TuneError("parallax tune: the planner refused every layout: " +
                        "; ".join(f"{c.label}: {c.error}" for c in refused[:5]))
    devices = _devices(resource_info)
    done: list[TuneTrial] = []
    bar = Progress("parallax tune", min(trials, len(runnable)), progress)
    with make_runner(backend, scheduler, devices=len(devices), max_parallel=1) as runner:
        launcher = TrialLauncher(runner, [script, *script_args], os.path.join(directory, "trials"), devices,
                                 warmup, steps, time_limit, env)
        pending = list(runnable)
        while pending and len(done) < trials:
            if time_budget is not None and time.monotonic() - began > time_budget:
                break
            candidate = pending.pop(0)
            bar.start(candidate.label)
            trial = TuneTrial(candidate, launcher.run_one(candidate.choice))
            done.append(trial)
            best = min((t for t in done if t.ok), key=lambda t: t.step_seconds, default=None)
            outcome = f"{trial.step_seconds * 1e3:.2f} ms/step" if trial.ok else trial.result.status
            bar.done(candidate.label, outcome,
                     f"{best.step_seconds * 1e3:.2f} ms/step ({best.candidate.label})" if best else "none")
            pending = measured_order(pending, done)
    bar.close()
    report = TuneReport(planned["key"], done, pending, refused, time.monotonic() - began, directory)
    _write(report)
    if report.best is None:
        raise TuneError("parallax tune: no trial measured a step:\n" + report.table())
    report.plot = _plot(report)
    if store:
        b = report.best
        report.stored = store_tuned(report.key, b.candidate.choice, {
            "step_seconds": b.step_seconds, "steps_per_second": b.steps_per_second, "model_rank": b.candidate.order,
            "trials": len(done), "report": os.path.join(directory, "results.json")}, root)
    report.history = _record(report, root)
    return report


def measured_order(pending: list[Candidate], done: list[TuneTrial]) -> list[Candidate]:
    """The candidates not yet tried, in the order to try them now: kinds of layout not yet measured first
    (in the cost model's order); then by the fastest measured step of their kind, corrected by the model's
    difference between them (what the model knows, communication, on top of what was measured)."""
    base: dict[tuple, tuple[float, float]] = {}
    for t in done:
        if t.ok:
            kind = t.candidate.kind
            if kind not in base or t.step_seconds < base[kind][0]:
                base[kind] = (t.step_seconds, t.candidate.predicted_seconds)

    def key(c: Candidate) -> tuple:
        known = base.get(c.kind)
        if known is None:
            return (0, 0.0, c.order)
        return (1, known[0] + c.predicted_seconds - known[1], c.order)

    return sorted(pending, key=key)


def _write(report: TuneReport) -> None:
    rows = [t.row() for t in report.trials]
    write_rows(report.directory, rows, {
        "key": report.key, "seconds": report.seconds, "untried": [c.to_dict() for c in report.untried],
        "refused": [c.to_dict() for c in report.refused],
        "best": rows[report.trials.index(report.best)] if report.best else None})


def _plot(report: TuneReport) -> str | None:
    """A bar per trial (steps/s), labelled with its choice and its place in the cost model's order."""
    measured = [t for t in report.trials if t.ok]
    return bar_plot(os.path.join(report.directory, "tune.png"),
                    [f"#{t.candidate.order} {t.candidate.label}" for t in measured],
                    [t.steps_per_second for t in measured], measured.index(report.best),
                    "steps per second (higher is better)",
                    "parallax tune: measured speed per layout (#: the cost model's order)")


def _record(report: TuneReport, root: str) -> dict[str, int]:
    """Add this tune to the history (in the cache ``root``) of where the fastest stood in the cost model's
    order; the tallies."""
    rank = report.model_rank
    if rank is None:
        return {}
    store_entry(HISTORY_FILE, f"{report.key[:16]}-{time.time():.0f}", {"model_rank": rank,
                                                                        "trials": len(report.trials)}, root)
    try:
        with open(cache_path(HISTORY_FILE, root), encoding="utf-8") as f:
            ranks = [int(e["model_rank"]) for e in json.load(f).values()]
    except (OSError, ValueError, KeyError):
        ranks = [rank]
    return {"tunes": len(ranks), "first": sum(r == 1 for r in ranks), "top3": sum(r <= 3 for r in ranks)}
