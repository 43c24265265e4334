"""Trials: training jobs started to measure a choice, run by a light master on local processes or Dask.

* :mod:`parallax.trials.execute`: one trial, a command in its own process group, to its end or time limit;
* :mod:`parallax.trials.runner`: the back ends (:class:`LocalRunner`, :class:`DaskRunner`);
* :mod:`parallax.trials.mode`: a job started as a trial (times its steps, writes its result, ends);
* :mod:`parallax.job.choice`: a layout choice as Config fields;
* :mod:`parallax.trials.script`: the training script started as a trial of a choice (tune, partition search);
* :mod:`parallax.trials.child`: a sweep's trial; :mod:`parallax.trials.report`: rows, plots, progress.
"""

from parallax.trials.execute import TrialResult, TrialSpec, run_trial
from parallax.trials.runner import DaskRunner, LocalRunner, TrialRunner, make_runner

__all__ = ["TrialSpec", "TrialResult", "run_trial", "TrialRunner", "LocalRunner", "DaskRunner", "make_runner"]
