"""What is in force for one ``parallel_run`` call, resolved in one place.

The script passes a :class:`~parallax.config.Config` and a ``resource_info``; how the process was started may
replace parts of them. :func:`in_force` applies every such replacement, in this order, and returns the config
and resources in force with what the environment replaced of the script's:

1. an elastic job's launcher: its ``ElasticConfig`` (``PARALLAX_ELASTIC``), ``parallax-run --stall-shutdown``,
   ``PARALLAX_STAGGERED_START``;
2. ``parallax-run --resource_info``, ``PARALLAX_RUN_OPTION`` and ``PARALLAX_MPIRUN_OPTIONS`` (this one added to
   the config by the launcher: :func:`parallax.job.settings.derive`), reported at WARNING once per job from
   :attr:`InForce.environment` (:mod:`parallax.job.overrides`);
3. a ``parallax plan`` / ``manifest`` / ``tune`` request: its resource file, run option, plan overrides and fields;
   or else a trial's choice (:func:`parallax.job.choice.with_choice`);
4. the checkpoints an elastic launcher chose for its ranks;
5. for a TensorFlow 2 step (``step=True``: ``parallax.fit``'s, or a ``tf.function``), TensorFlow 2's conventions
   where the script leaves a setting to its default: sparse gradients averaged over the replicas
   (``average_sparse=None`` becomes ``True``), as ``model.fit`` and TensorFlow's distribution strategies average
   every gradient; and the layout the cost model finds cheapest (``run_option=None`` becomes ``AUTO``) in a
   synchronous job Parallax launches. A ``tf.compat.v1`` graph keeps the seed's sum and its default, ``HYBRID``.
   Keras 3's optimizers update an embedding's every row at every step (its moments), so a table on a parameter
   server costs its server a dense update and every step the servers' round trips, which all-reducing or
   all-gathering its rows does not: on one host, ``HYBRID`` trained the benchmark's Keras model at 0.43x
   ``model.fit`` where ``AUTO`` (as MPI) trained it at 1.03x (docs/benchmarks.md). A job a cluster manager
   starts keeps its own default (``PS`` with ps tasks, else ``MPI``: :func:`parallax.job.settings.derive`).

The layout ``parallax tune`` stored (:mod:`parallax.tuning.cache`) is looked up where the cluster is known, and
applied by :func:`with_tuned`, which adds what it replaced: the graph the tune key is made from exists only once
the step is traced with the config in force (its checkpoint restored, elastic mode checked), and a launched
rank's cluster is the allocation its launcher sent.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from parallax.config import Config
from parallax.invocation import RUN_OPTION_ENV, Invocation, Kind
from parallax.job.choice import replaced_by_choice, with_choice
from parallax.job.overrides import PARTITION_COUNT, EnvironmentOverride, Replaced, environment_overrides
from parallax.launch.elastic import checkpoint_from_text, elastic_from_text
from parallax.launch.launcher import resource_override, run_option_override

__all__ = ["InForce", "in_force", "with_tuned", "STEP_RUN_OPTION"]

#: The run option of a TensorFlow 2 step whose script leaves it to its default (item 5 above).
STEP_RUN_OPTION = "AUTO"


@dataclass(frozen=True)
class InForce:
    """The config and resources one ``parallel_run`` call runs with, and what replaced the script's.

    Attributes:
        config: the config in force.
        resource_info: the resource file in force.
        environment: each environment variable that replaced one of the script's settings, as the process the
            user started says at WARNING (:func:`parallax.job.overrides.environment_warning`).
        tuned: what a stored tuned layout replaced (:func:`with_tuned`).
    """

    config: Config
    resource_info: str | os.PathLike | None
    environment: tuple[EnvironmentOverride, ...] = ()
    tuned: tuple[Replaced, ...] = ()


def in_force(config: Config, resource_info: str | os.PathLike | None, invocation: Invocation,
             step: bool = False, sync: bool = True) -> InForce:
    """``config`` and ``resource_info`` with every replacement ``invocation`` asks for, and TensorFlow 2's
    conventions for a ``step`` (the module's list).

    Args:
        config: the script's config.
        resource_info: the script's ``resource_info``.
        invocation: how this process was started (:func:`parallax.invocation.current`, read by the door).
        step: the program is a TensorFlow 2 step (a ``tf.function``), not a ``tf.compat.v1`` graph.
        sync: the job trains synchronously.

    Raises:
        ValueError: ``PARALLAX_RUN_OPTION`` is no run option.
    """
    # PARALLAX_NUM_PARTITIONS replaces no config field: get_partitioner reads it while the script builds its graph,
    # and the door reports it from the graph (parallax.job.overrides.partition_overrides)
    replaced = environment_overrides(config, resource_info, None, invocation)
    config = replace(config, elastic_config=elastic_from_text(config.elastic_config, invocation.elastic))
    if invocation.stall_shutdown is not None:  # parallax-run --stall-shutdown
        shutdown = invocation.stall_shutdown
        config = replace(config, stall_shutdown=None if shutdown == "none" else float(shutdown))
    if invocation.staggered_start is not None:  # PARALLAX_STAGGERED_START
        config = replace(config, staggered_start=invocation.staggered_start)
    resource_info = resource_override(resource_info, invocation)
    config = replace(config, run_option=run_option_override(config.run_option, invocation))
    request = invocation.plan
    if request is not None:  # parallax plan: its resource file, run option and overrides replace the script's
        resource_info = request.resource_info or resource_info
        config = replace(config, run_option=request.run_option or config.run_option,
                         plan_overrides={**config.plan_overrides, **request.overrides}, **request.fields)
    elif invocation.trial is not None:  # a trial of parallax tune or the partition search: its choice
        config = with_choice(config, invocation.trial.choice)
    if invocation.elastic_ckpt:  # a rank of an elastic job: the checkpoints its launcher chose
        config = replace(config, ckpt_config=checkpoint_from_text(invocation.elastic_ckpt))
    if step and config.average_sparse is None:  # TensorFlow 2's convention: every gradient averaged
        config = replace(config, average_sparse=True)
    managed = invocation.kind is Kind.MANAGED or (request is not None and request.manager is not None)
    if step and config.run_option is None and sync and not managed:  # the cheapest layout by the cost model
        config = replace(config, run_option=STEP_RUN_OPTION)
    return InForce(config, resource_info, replaced)


def with_tuned(force: InForce, choice: dict[str, Any], min_partitions: int | None,
               invocation: Invocation) -> tuple[InForce, int | None]:
    """``force`` with a stored tuned ``choice`` applied, and the partition count the script must be run again with
    (``None`` when its graph already has the tuned count: a count the graph does not have yet; a
    ``PARALLAX_NUM_PARTITIONS`` the user set stays).

    When the script must run again the config is left as it is: the run with the tuned count applies the rest.
    ``InForce.tuned`` lists each setting the choice replaced, the script's value and the tuned one.
    """
    fields = {k: v for k, v in choice.items() if k != "partitions"}
    parts = choice.get("partitions")
    rebuild = bool(parts) and min_partitions is not None and int(parts) > min_partitions \
        and invocation.search.partitions is None
    given = (invocation.run_option or "").strip()  # then in the config in place of the script's
    replaced = [replace(r, source=RUN_OPTION_ENV) if given and r.setting == "Config.run_option" else r
                for r in replaced_by_choice(force.config, fields)]
    if rebuild:
        replaced.append(Replaced(PARTITION_COUNT, min_partitions, int(parts)))
        return replace(force, tuned=tuple(replaced)), int(parts)
    return replace(force, config=with_choice(force.config, fields), tuned=tuple(replaced)), None
