"""Parallax: data-parallel training of a single-device TensorFlow graph.

The public surface follows the seed system's API: :func:`parallel_run` and
the config objects. See ``docs/`` for the guide.
"""

from parallax import shard
from parallax.api import parallel_run
from parallax.config import (
    CheckPointConfig,
    CommunicationConfig,
    Config,
    MPIConfig,
    ParallaxConfig,
    ProfileConfig,
    PSConfig,
)
from parallax.errors import (
    AnalysisError,
    LaunchError,
    ParallaxError,
    PlanError,
    ResourceFileError,
    RewriteError,
    TaskFailedError,
)
from parallax.partitioner import get_partitioner
from parallax.plan import Plan

__version__ = "0.1.0"

__all__ = [
    "parallel_run",
    "Config",
    "ParallaxConfig",
    "CommunicationConfig",
    "PSConfig",
    "MPIConfig",
    "CheckPointConfig",
    "ProfileConfig",
    "get_partitioner",
    "shard",
    "Plan",
    "ParallaxError",
    "ResourceFileError",
    "AnalysisError",
    "PlanError",
    "RewriteError",
    "LaunchError",
    "TaskFailedError",
]
