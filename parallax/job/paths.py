"""The directories a job writes into, checked before anything starts.

``CheckPointConfig.ckpt_dir`` (the chief saves and restores there) and
``Config.export_graph_path`` (every worker writes its rewritten graph there)
are checked by the process the user started, before it launches anything, when
the process that uses them runs on this machine, and again by that process
itself (on its own host) before its session starts. A path that is a file, a
directory this process may not write to (its permissions, a read-only file
system), or one that cannot be created is refused with a
:class:`~parallax.errors.LaunchError` naming the setting, the path and the
problem, instead of failing deep in TensorFlow when the session starts.

A path of one of TensorFlow's file systems (``gs://``, ``hdfs://``, ...) is not
checked here: TensorFlow reports on it when it is used.
"""

from __future__ import annotations

import getpass
import os

from parallax.errors import LaunchError

__all__ = ["check_directory", "check_paths", "CKPT_DIR", "CHECKPOINT_BASENAME", "EXPORT_GRAPH_PATH"]

CKPT_DIR = "CheckPointConfig.ckpt_dir"
#: The file name the chief's checkpoints in it start with (``model.ckpt-<global step>``), as TensorFlow's
#: ``CheckpointSaverHook`` names them.
CHECKPOINT_BASENAME = "model.ckpt"
EXPORT_GRAPH_PATH = "Config.export_graph_path"


def check_directory(setting: str, path: str, purpose: str, writes: bool = True) -> None:
    """Refuse ``path`` unless it is (or can be created as) a directory this process can use.

    Args:
        setting: how messages name it, e.g. ``CheckPointConfig.ckpt_dir``.
        path: the directory.
        purpose: what it is for, e.g. ``"to save checkpoints in"``.
        writes: whether the process writes there (else it only reads, and a missing
            directory is fine: there is nothing to read).

    Raises:
        LaunchError: ``path`` is a file, may not be written (or read), or cannot be created.
    """
    if "://" in path:
        return
    expected = f"expected a directory {purpose}"
    if os.path.exists(path):
        if not os.path.isdir(path):
            created = " (it is created when missing)" if writes else ""
            raise LaunchError(f"{setting} {path!r} is a file; {expected}. Name a directory{created}, or move the "
                              "file away")
        need, verb = (os.R_OK | os.W_OK | os.X_OK, "write to") if writes else (os.R_OK | os.X_OK, "read")
        if not os.access(path, need):
            raise LaunchError(f"{setting} {path!r} is a directory this process cannot {verb} (user {_user()}; "
                              f"its permissions, or a read-only file system); {expected}. Make it writable or "
                              "name another")
        return
    if not writes:
        return
    parent = os.path.dirname(os.path.abspath(path))
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise LaunchError(f"{setting} {path!r} cannot be created: {parent!r} is a file; {expected}. Name a path "
                          "under a directory")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise LaunchError(f"{setting} {path!r} cannot be created: this process cannot write to {parent!r} (user "
                          f"{_user()}; its permissions, or a read-only file system); {expected}. Create it "
                          "first, or name a path under a directory you can write to")


def check_paths(ckpt_config, export_graph_path: str | None, *, saves: bool, exports: bool) -> None:
    """Check the job's directories that a process on this machine uses.

    Args:
        ckpt_config: the ``CheckPointConfig`` in force.
        export_graph_path: ``Config.export_graph_path``.
        saves: a process on this machine is the chief (it restores from ``ckpt_dir``
            and, with ``save_ckpt_steps``/``save_ckpt_secs``, saves there).
        exports: a worker on this machine writes its graph to ``export_graph_path``.

    Raises:
        LaunchError: naming the setting, the path and the problem.
    """
    if saves and ckpt_config.ckpt_dir:
        writes = bool(ckpt_config.save_ckpt_steps or ckpt_config.save_ckpt_secs)
        check_directory(CKPT_DIR, ckpt_config.ckpt_dir, "to save checkpoints in and restore the latest from"
                        if writes else "to restore the latest checkpoint from", writes=writes)
    if exports and export_graph_path:
        check_directory(EXPORT_GRAPH_PATH, export_graph_path, "where each worker writes its rewritten graph")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid()) if hasattr(os, "getuid") else "?"
