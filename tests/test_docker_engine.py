"""tests/docker_engine.py: an engine whose first start dockerd gives up on is started again."""

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests import docker_engine

from .conftest import descendants


def _stall_first_containerd(stalled: list[int], give_up: threading.Event) -> None:
    """SIGSTOP the first containerd this test's dockerd starts: a disk or CPU that stalls it past
    dockerd's 15 s, as far as dockerd can tell."""
    while not give_up.is_set():
        for pid in descendants(os.getpid()):
            try:
                name = Path(f"/proc/{pid}/comm").read_text().strip()
            except OSError:
                continue
            if name == "containerd":
                os.kill(pid, signal.SIGSTOP)
                stalled.append(pid)
                return
        time.sleep(0.01)


def test_an_engine_whose_containerd_stalls_past_dockerds_deadline_is_started_again():
    reason = docker_engine.why_unavailable()
    if reason:
        pytest.skip(reason)
    stalled: list[int] = []
    give_up = threading.Event()
    watcher = threading.Thread(target=_stall_first_containerd, args=(stalled, give_up), daemon=True)
    watcher.start()
    try:
        with pytest.warns(UserWarning, match=r"(?s)exited with 1 while starting \(attempt 1\).*timeout waiting for containerd to start"):
            # A root of its own under /tmp: containerd's sockets below a longer path pass 108 bytes.
            engine = docker_engine.start()
    finally:
        give_up.set()
        watcher.join()
    try:
        assert stalled, "no containerd was started"
        assert engine.docker("info", "--format", "{{.ID}}").stdout.strip()
        # The stalled one was ended, not adopted by the second dockerd.
        running = [p for p in descendants(engine.pid) if Path(f"/proc/{p}/comm").read_text().strip() == "containerd"]
        assert running and stalled[0] not in running
    finally:
        engine.stop()
