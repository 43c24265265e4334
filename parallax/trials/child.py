"""A sweep's trial: ``python -m parallax.trials.child PAYLOAD`` calls the user's function with its parameters.

The payload (written by :func:`parallax.sweep`, with cloudpickle, so a function
defined in the user's script travels too) holds the function, the resource
file of the trial's devices, and either the parameters or what the worker
needs to suggest them itself (Bayesian optimisation: the space, the results so
far, a seed). The function builds its graph and calls ``parallel_run`` with the
resource file; when that launches a job, the job's processes run this module
again with the same payload and take the parameters from :data:`PARAMS_ENV`.
Worker 0's return value is the trial's result.
"""

from __future__ import annotations

import json
import sys
from typing import Any

from parallax.invocation import Invocation, current, export

__all__ = ["main", "suggest"]


def suggest(space: dict[str, Any], history: list[dict[str, Any]], seed: int, minimize: bool) -> dict[str, Any]:
    """The next parameters Optuna's TPE sampler suggests from the ``history`` of ``{"params", "value"}``."""
    import optuna

    from parallax.trials.sweeps import optuna_distribution

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    distributions = {name: optuna_distribution(name, values) for name, values in space.items()}
    study = optuna.create_study(direction="minimize" if minimize else "maximize",
                                sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=4))
    for past in history:
        study.add_trial(optuna.trial.create_trial(params=past["params"], distributions=distributions,
                                                  value=past["value"]))
    trial = study.ask(distributions)
    return dict(trial.params)


def _is_result_writer(invocation: Invocation) -> bool:
    """Worker 0 of the job, or a process that trains alone."""
    from parallax.member.rank import launched_process
    from parallax.resources.cluster import Role

    launched = launched_process(invocation)
    if launched is None:
        return True
    return launched.spec.role == Role.WORKER and launched.workers_comm().Get_rank() == 0


def main(argv: list[str] | None = None) -> int:
    import cloudpickle

    from parallax.trials.execute import write_result

    argv = sys.argv[1:] if argv is None else argv
    with open(argv[0], "rb") as f:
        payload = cloudpickle.load(f)
    invocation = current()  # the door of a sweep trial's process: its environment is read here
    given = invocation.sweep_params
    if given:
        params = dict(given)
    elif payload.get("params") is not None:
        params = payload["params"]
    else:
        s = payload["suggest"]
        params = suggest(s["space"], s["history"], s["seed"], s["minimize"])
    export(sweep_params=json.dumps(params))  # the job's processes take the same ones
    value = payload["fn"](params, payload["resource_info"])
    if _is_result_writer(invocation):
        write_result({"params": params, "value": value if isinstance(value, dict) else {"value": value}},
                      invocation.trial_result)
    return 0


if __name__ == "__main__":
    sys.exit(main())
