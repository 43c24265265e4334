"""Parallax: data-parallel training of a single-device TensorFlow graph.

The public surface follows the seed system's API: :func:`parallel_run` and
the config objects. See ``docs/`` for the guide.

Names are imported on first use, so ``parallax-run`` and the launcher start
without loading TensorFlow.
"""

from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

_EXPORTS = {
    "parallel_run": "parallax.api",
    "preview_plan": "parallax.api",
    "Config": "parallax.config",
    "ParallaxConfig": "parallax.config",
    "CommunicationConfig": "parallax.config",
    "PSConfig": "parallax.config",
    "MPIConfig": "parallax.config",
    "CheckPointConfig": "parallax.config",
    "ProfileConfig": "parallax.config",
    "ElasticConfig": "parallax.config",
    "Compression": "parallax.config",
    "get_partitioner": "parallax.partitioner",
    "Plan": "parallax.plan.model",
    "ParallaxError": "parallax.errors",
    "ResourceFileError": "parallax.errors",
    "AnalysisError": "parallax.errors",
    "PlanError": "parallax.errors",
    "RewriteError": "parallax.errors",
    "LaunchError": "parallax.errors",
    "TaskFailedError": "parallax.errors",
    "CheckpointError": "parallax.errors",
    "log": "parallax.logs",
    "tune": "parallax.tuning.tuner",
    "fit": "parallax.keras_fit",
    "evaluate": "parallax.tf2.evaluate",
    "predict": "parallax.tf2.evaluate",
    "sweep": "parallax.trials.sweeps",
    "Uniform": "parallax.trials.sweeps",
}

__all__ = [*_EXPORTS, "shard"]


def __getattr__(name: str) -> Any:
    if name == "shard":
        return importlib.import_module("parallax.shard")
    if name in _EXPORTS:
        value = getattr(importlib.import_module(_EXPORTS[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'parallax' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
