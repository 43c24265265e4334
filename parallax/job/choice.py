"""A trial's choice of layout, as names a user knows, and how it becomes a Config.

A choice is a flat dict: ``run_option``, ``partitions`` (the count
``parallax.get_partitioner`` splits into: ``PARALLAX_NUM_PARTITIONS``),
``fusion_bytes`` and ``backend`` (MPIConfig), ``local_aggregation`` and
``replicate_variables`` (PSConfig), ``compression`` (CommunicationConfig),
``zero_stage``, ``pipeline_stages``, ``micro_batches`` and ``pipeline_schedule`` (Config).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from parallax.config import Config
from parallax.invocation import PARTITIONS_ENV
from parallax.job.overrides import Replaced

__all__ = ["CHOICE_FIELDS", "with_choice", "choice_env", "describe_choice", "check_choice", "replaced_by_choice",
           "setting_name"]

#: Each choice name and where it lives in a Config (``None``: the environment, read as the graph is built).
CHOICE_FIELDS: dict[str, tuple[str, ...] | None] = {
    "run_option": ("run_option",),
    "partitions": None,
    "fusion_bytes": ("communication_config", "mpi_config", "fusion_bytes"),
    "backend": ("communication_config", "mpi_config", "backend"),
    "local_aggregation": ("communication_config", "ps_config", "local_aggregation"),
    "replicate_variables": ("communication_config", "ps_config", "replicate_variables"),
    "compression": ("communication_config", "compression"),
    "zero_stage": ("zero_stage",),
    "pipeline_stages": ("pipeline_stages",),
    "micro_batches": ("micro_batches",),
    "pipeline_schedule": ("pipeline_schedule",),
}


def check_choice(choice: dict[str, Any], where: str = "choice") -> None:
    """Raises ValueError naming a key that is not a choice."""
    unknown = sorted(set(choice) - set(CHOICE_FIELDS))
    if unknown:
        raise ValueError(f"{where}: unknown choice(s) {', '.join(unknown)}; expected some of "
                         f"{', '.join(CHOICE_FIELDS)}")


def _set(obj: Any, path: tuple[str, ...], value: Any) -> Any:
    if len(path) == 1:
        return replace(obj, **{path[0]: value})
    return replace(obj, **{path[0]: _set(getattr(obj, path[0]), path[1:], value)})


def with_choice(config: Config, choice: dict[str, Any]) -> Config:
    """``config`` with the choice's fields set (``partitions`` is not a field: :func:`choice_env`).

    Raises:
        ValueError: an unknown choice, or a value the field refuses.
    """
    check_choice(choice)
    for name, value in choice.items():
        path = CHOICE_FIELDS[name]
        if path is not None and value is not None:
            config = _set(config, path, value)
    return config


def setting_name(name: str, config: Config) -> str:
    """How a user sets choice ``name`` in ``config``: ``Config.run_option``, ``MPIConfig.backend``, ...

    Raises:
        ValueError: an unknown choice, or ``partitions`` (not a Config field).
    """
    check_choice({name: None})
    path = CHOICE_FIELDS[name]
    if path is None:
        raise ValueError(f"choice {name!r} is not a Config field")
    owner: Any = config
    for attr in path[:-1]:
        owner = getattr(owner, attr)
    return f"{type(owner).__name__}.{path[-1]}"


def replaced_by_choice(config: Config, choice: dict[str, Any]) -> tuple[Replaced, ...]:
    """The Config fields whose value :func:`with_choice` changes, in :data:`CHOICE_FIELDS` order
    (``partitions`` is not a field: the caller compares it with the graph's count).

    Raises:
        ValueError: an unknown choice, or a value the field refuses.
    """
    chosen = with_choice(config, choice)
    out = []
    for name, path in CHOICE_FIELDS.items():
        if path is None or choice.get(name) is None:
            continue
        before, after = config, chosen
        for attr in path:
            before, after = getattr(before, attr), getattr(after, attr)
        if before != after:
            out.append(Replaced(setting_name(name, config), before, after))
    return tuple(out)


def choice_env(choice: dict[str, Any]) -> dict[str, str]:
    """The environment a script needs for ``choice`` before it builds its graph."""
    return {PARTITIONS_ENV: str(choice["partitions"])} if choice.get("partitions") else {}


def describe_choice(choice: dict[str, Any]) -> str:
    """``run_option=MPI fusion_bytes=4MiB ...`` in :data:`CHOICE_FIELDS` order."""
    parts = []
    for name in CHOICE_FIELDS:
        if name in choice and choice[name] is not None:
            value = choice[name]
            if name == "fusion_bytes":
                value = f"{value / 2**20:g}MiB" if value else "off"
            parts.append(f"{name}={value}")
    return " ".join(parts) or "defaults"
