"""A command's console as it comes: each line with the monotonic time it came, for the lab's and
the tests' timings of what a run says."""

from __future__ import annotations

import subprocess
import threading
import time


class TimedOutput:
    """A process's output read as it comes: its lines per stream, and every line with the monotonic
    time it came."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.out: list[str] = []
        self.err: list[str] = []
        self.timed: list[tuple[float, str]] = []
        self.readers = [threading.Thread(target=self._read, args=(stream, sink), daemon=True)
                        for stream, sink in ((proc.stdout, self.out), (proc.stderr, self.err)) if stream is not None]
        for reader in self.readers:
            reader.start()

    def _read(self, stream, sink: list[str]) -> None:
        for line in stream:
            sink.append(line)
            self.timed.append((time.monotonic(), line))

    def caught_up(self, timeout: float = 60) -> None:
        """Once the process ended: every line it wrote read (its streams closed)."""
        for reader in self.readers:
            reader.join(timeout=timeout)

    def said(self, text: str, since: float = 0.0) -> float | None:
        """When a line holding ``text`` first came (after ``since``), if it has."""
        return next((t for t, line in list(self.timed) if t >= since and text in line), None)

    def console(self, since: float) -> str:
        """Every line with the seconds it came after ``since``."""
        return "".join(f"{t - since:7.1f} {line}" for t, line in self.timed)
