"""The exceptions Parallax raises.

Every error the library raises on purpose derives from :class:`ParallaxError`,
so callers can catch one type. Plain ``ValueError``/``TypeError`` are kept for
bad arguments to public functions and config objects, as Python code expects.
"""

from __future__ import annotations

__all__ = [
    "ParallaxError",
    "ResourceFileError",
    "AnalysisError",
    "PlanError",
    "RewriteError",
    "LaunchError",
    "TaskFailedError",
    "ManifestError",
    "CheckpointError",
    "Preempted",
]


class ParallaxError(Exception):
    """Base class of every error Parallax raises on purpose."""


class ResourceFileError(ParallaxError):
    """The resource file cannot be read or does not follow a known format.

    The message names the file, the line number and what was expected.
    """


class AnalysisError(ParallaxError):
    """The single-device graph lacks something Parallax needs (e.g. a training op)."""


class PlanError(ParallaxError):
    """A plan does not fit the graph or the cluster it is applied to."""


class RewriteError(ParallaxError):
    """A graph rewrite pass found a precondition broken; the message names the node."""


class LaunchError(ParallaxError):
    """The job could not be started as the resource file and config describe."""


class ManifestError(ParallaxError):
    """A manager's job file cannot describe the job (``parallax manifest``); the message says why."""


class CheckpointError(ParallaxError):
    """A checkpoint cannot be restored into the graph; the message names the file and the variables."""


class TaskFailedError(ParallaxError):
    """A process of the job failed.

    Attributes:
        rank: global rank of the first process that failed.
        host: the host it ran on.
        exit_code: its exit code (negative for a signal).
        log_path: where its output went, if it was redirected.
    """

    def __init__(self, message: str, *, rank: int | None = None, host: str | None = None,
                 exit_code: int | None = None, log_path: str | None = None) -> None:
        super().__init__(message)
        self.rank = rank
        self.host = host
        self.exit_code = exit_code
        self.log_path = log_path


class PeerLost(ParallaxError):
    """A peer this worker trains with ended or started again, and the workers hold the variables themselves
    (all-reduce, HYBRID): a collective's executor, once aborted, fails every later op, and a session started
    again would train from the variables' first values; the process cannot go on. A task a cluster manager
    started ends with 143 on it, so the manager's restart resumes the job from its last checkpoint."""


class Preempted(ParallaxError):
    """The job was asked to end with a checkpoint (SIGTERM), and worker 0 has saved what it could.

    Raised by the chief's preemption hook or ``tf.function`` step after its save; the call of the program's it
    comes through (``ParallaxSession.run``, the step's call) ends the process with the preempted exit code
    instead of passing it on (:mod:`parallax.member.preemption`).

    Attributes:
        said: what the chief did (``"saved global step 6 to /run/ckpt/model.ckpt-6"``).
    """

    def __init__(self, said: str) -> None:
        super().__init__(f"preempted: the chief {said}")
        self.said = said
