"""The launching terminal's view of redirected output (``redirect_path``).

Each launched process writes its stdout and stderr to its own files
(``<role>_<rank>.stdout`` / ``.stderr``); while the job runs, the launcher
follows every such file and prints each new line prefixed with its process,
``[worker 0] step 10 ...``, so the terminal still shows the job's progress.
"""

from __future__ import annotations

import os
import re
import sys
import threading

__all__ = ["Follower"]

_NAME = re.compile(r"^(worker|ps)_(\d+)\.(stdout|stderr)$")


class Follower:
    """Prints the new lines of the redirected files of ``directory`` until stopped."""

    def __init__(self, directory: str, sink=None, interval: float = 0.2) -> None:
        self.directory = directory
        self.sink = sink or sys.stdout
        self.interval = interval
        self._offsets: dict[str, int] = {}
        self._partial: dict[str, str] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._existing = set(os.listdir(directory)) if os.path.isdir(directory) else set()

    def start(self) -> Follower:
        self._thread.start()
        return self

    def stop(self) -> None:
        """Print what is left and stop."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.poll(final=True)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.poll()

    def poll(self, final: bool = False) -> None:
        if not os.path.isdir(self.directory):
            return
        for name in sorted(os.listdir(self.directory)):
            m = _NAME.match(name)
            if not m:
                continue
            path = os.path.join(self.directory, name)
            start = self._offsets.get(name)
            if start is None:  # a file of an earlier job in the same directory: only what is new
                start = os.path.getsize(path) if name in self._existing else 0
            try:
                with open(path, "rb") as f:
                    f.seek(start)
                    data = f.read()
            except OSError:
                continue
            self._offsets[name] = start + len(data)
            text = self._partial.pop(name, "") + data.decode("utf-8", errors="replace")
            lines = text.split("\n")
            if not final:
                self._partial[name] = lines.pop()
            prefix = f"[{m.group(1)} {m.group(2)}] "
            for line in lines:
                if line:
                    self.sink.write(prefix + line + "\n")
            self.sink.flush()
