"""What replaced the training script's own settings, said at WARNING once per job.

Two things may change what a script asked for, and the process the user started
(not every process of the job) says so at WARNING, naming each setting, the
script's value and the one in force:

* a layout ``parallax tune`` stored for this graph and resources
  (:mod:`parallax.tuning.cache`): one line for all it replaced
  (:func:`tuned_warning`)::

    WARNING:...:PARALLAX:Parallax: using the layout parallax tune found for this graph and resources
    (~/.cache/parallax/tuned.json, 3f2a9c01d4e5; PARALLAX_USE_TUNED=0 ignores it): it replaces 2 of the
    script's settings: Config.run_option 'PS' -> 'MPI', MPIConfig.backend 'auto' -> 'mpi'

* an environment variable (:func:`environment_overrides`), one line each:

  ============================  ====================================  =====================================
  variable                      replaces                              set by
  ============================  ====================================  =====================================
  ``PARALLAX_RESOURCE_INFO``    ``parallel_run``'s ``resource_info``  ``parallax-run --resource_info``
  ``PARALLAX_RUN_OPTION``       ``Config.run_option``                 ``parallax manifest --run_option``
  ``PARALLAX_MPIRUN_OPTIONS``   ``MPIConfig.mpirun_options`` (added)  ``parallax-run --mpirun_options``
  ``PARALLAX_NUM_PARTITIONS``   ``get_partitioner``'s count           a partition search (or by hand)
  ============================  ====================================  =====================================

A value set to what the script already has replaces nothing and is not
listed; a script that names no resource file (``resource_info=None``) leaves
it to the environment, so ``parallax-run``'s replaces nothing either. The other
``PARALLAX_*`` variables tune what no script setting covers (timeouts, logging,
the cache) or are Parallax's own messages to the processes it starts.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Any

from parallax.config import Config
from parallax.invocation import MPIRUN_OPTIONS_ENV, PARTITIONS_ENV, RESOURCE_ENV, RUN_OPTION_ENV, Invocation
from parallax.launch.launcher import resource_override, run_option_override

__all__ = ["Replaced", "EnvironmentOverride", "environment_overrides", "partition_overrides", "environment_warning",
           "tuned_warning", "PARTITION_COUNT"]

#: How messages name the partition count a script's ``get_partitioner`` asks for.
PARTITION_COUNT = "get_partitioner's partition count"


@dataclass(frozen=True)
class Replaced:
    """A setting of the script's that something else replaced.

    Attributes:
        setting: how the user sets it, e.g. ``"Config.run_option"``, ``"MPIConfig.backend"``.
        script: the script's value (or the one an environment variable put in its place: ``source``).
        value: the value in force instead.
        source: where ``script`` came from when not from the script, e.g. ``"PARALLAX_RUN_OPTION"``.
    """

    setting: str
    script: Any
    value: Any
    source: str = ""

    def describe(self) -> str:
        """``Config.run_option 'PS' -> 'MPI'`` (``'PS' (from PARALLAX_RUN_OPTION) -> 'MPI'``)."""
        source = f" (from {self.source})" if self.source else ""
        return f"{self.setting} {self.script!r}{source} -> {self.value!r}"


@dataclass(frozen=True)
class EnvironmentOverride:
    """An environment variable that replaced a setting of the script's.

    Attributes:
        variable: its name, e.g. ``PARALLAX_RUN_OPTION``.
        replaced: the setting, the script's value and the variable's.
        set_by: what usually sets it (for the message), e.g. ``"parallax-run --resource_info"``.
    """

    variable: str
    replaced: Replaced
    set_by: str


def environment_overrides(config: Config, resource_info: str | os.PathLike | None, min_partitions: int | None,
                          invocation: Invocation) -> tuple[EnvironmentOverride, ...]:
    """Each ``PARALLAX_*`` variable of ``invocation`` that replaces one of the script's settings.

    Args:
        config: the script's config, as it passed it.
        resource_info: the script's ``resource_info``.
        min_partitions: the smallest ``min_num_partitions`` of the graph's ``get_partitioner``
            variables (:func:`parallax.tuning.search.min_partitions`), ``None`` without any.
        invocation: what the environment asked (:func:`parallax.invocation.current`, read by ``parallel_run``).

    Returns:
        In the order of the table of the module docstring; empty when nothing is replaced.
    """
    found: list[EnvironmentOverride] = []
    given = resource_override(resource_info, invocation)
    if resource_info is not None and given is not resource_info:
        found.append(EnvironmentOverride(RESOURCE_ENV, Replaced("resource_info", os.fspath(resource_info), given),
                                         "parallax-run --resource_info"))
    run_option = replace(config, run_option=run_option_override(config.run_option, invocation)).run_option
    if run_option != config.run_option:
        found.append(EnvironmentOverride(RUN_OPTION_ENV, Replaced("Config.run_option", config.run_option, run_option),
                                         "parallax manifest --run_option"))
    extra = (invocation.mpirun_options or "").strip()
    if extra:
        mine = config.communication_config.mpi_config.mpirun_options
        found.append(EnvironmentOverride(MPIRUN_OPTIONS_ENV, Replaced(
            "MPIConfig.mpirun_options", mine, " ".join(p for p in (mine, extra) if p.strip())),
            "parallax-run --mpirun_options"))
    return (*found, *partition_overrides(min_partitions, invocation))


def partition_overrides(min_partitions: int | None, invocation: Invocation) -> tuple[EnvironmentOverride, ...]:
    """``PARALLAX_NUM_PARTITIONS`` when it replaces the count the graph's ``get_partitioner`` asks for
    (``min_partitions``, ``None`` without any): :func:`parallax.partitioner.get_partitioner` applies it while
    the script builds its graph, so only the graph tells."""
    count = invocation.search.partitions
    if min_partitions is not None and count is not None and count > min_partitions:
        return (EnvironmentOverride(PARTITIONS_ENV, Replaced(PARTITION_COUNT, min_partitions, count),
                                    "a partition search, or by hand"),)
    return ()


def environment_warning(override: EnvironmentOverride) -> str:
    """The WARNING line of one environment override.

    >>> environment_warning(EnvironmentOverride("PARALLAX_RUN_OPTION", Replaced("Config.run_option", "PS", "MPI"),
    ...                                         "parallax manifest --run_option"))
    "Parallax: PARALLAX_RUN_OPTION (set by parallax manifest --run_option) replaces the script's setting: \
Config.run_option 'PS' -> 'MPI'; unset PARALLAX_RUN_OPTION to use the script's"
    """
    return (f"Parallax: {override.variable} (set by {override.set_by}) replaces the script's setting: "
            f"{override.replaced.describe()}; unset {override.variable} to use the script's")


def tuned_warning(replaced: tuple[Replaced, ...] | list[Replaced], layout: str, source: str, off_switch: str) -> str:
    """The WARNING line of a stored tuned layout: each setting it replaced, or that it replaced none.

    Args:
        replaced: the settings whose value the layout changes.
        layout: the layout as ``describe_choice`` writes it (``run_option=MPI fusion_bytes=4MiB``).
        source: where it is stored (the file and the key).
        off_switch: the variable that turns stored layouts off (``PARALLAX_USE_TUNED``).
    """
    head = (f"Parallax: using the layout parallax tune found for this graph and resources ({source}; "
            f"{off_switch}=0 ignores it): ")
    if not replaced:
        return head + f"it replaces none of the script's settings ({layout}: the script's own values)"
    count = f"{len(replaced)} of the script's settings" if len(replaced) > 1 else "1 of the script's settings"
    return head + f"it replaces {count}: " + ", ".join(r.describe() for r in replaced)
