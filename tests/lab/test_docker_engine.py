"""lab/docker_engine.py: an engine whose first start dockerd gives up on is started again."""

import os
import shutil
import signal
import tempfile
import threading
import time
from pathlib import Path

import pytest

from lab import docker_engine
from tests.conftest import descendants


def _containerd_of(pid: int, root: Path) -> bool:
    """Whether the process is a containerd of the engine under ``root`` (the session's other engines
    and the testbed's are this test process's descendants too)."""
    try:
        return (Path(f"/proc/{pid}/comm").read_text().strip() == "containerd"
                and str(root).encode() in Path(f"/proc/{pid}/cmdline").read_bytes())
    except OSError:
        return False


def _stall_first_containerd(root: Path, stalled: list[int], give_up: threading.Event) -> None:
    """SIGSTOP the first containerd the engine under ``root`` starts: a disk or CPU that stalls it
    past dockerd's 15 s, as far as dockerd can tell."""
    while not give_up.is_set():
        for pid in descendants(os.getpid()):
            if _containerd_of(pid, root):
                os.kill(pid, signal.SIGSTOP)
                stalled.append(pid)
                return
        time.sleep(0.01)


def test_an_engine_whose_containerd_stalls_past_dockerds_deadline_is_started_again():
    reason = docker_engine.why_unavailable()
    if reason:
        pytest.skip(reason)
    # A short root under /tmp: containerd's sockets below pytest's tmp_path would pass 108 bytes.
    root = Path(tempfile.mkdtemp(prefix="et-engine-"))
    stalled: list[int] = []
    give_up = threading.Event()
    watcher = threading.Thread(target=_stall_first_containerd, args=(root, stalled, give_up), daemon=True)
    watcher.start()
    engine = None
    try:
        with pytest.warns(UserWarning, match=r"(?s)exited with 1 while starting \(attempt 1\).*timeout waiting for containerd to start"):
            engine = docker_engine.start(root)
        give_up.set()
        assert stalled, "no containerd was started"
        assert engine.docker("info", "--format", "{{.ID}}").stdout.strip()
        # The stalled one was ended, not adopted by the second dockerd.
        running = [p for p in descendants(engine.pid) if _containerd_of(p, root)]
        assert running and stalled[0] not in running
    finally:
        give_up.set()
        watcher.join()
        if engine is not None:
            engine.stop()
        shutil.rmtree(root, ignore_errors=True)  # a failed start stops its engine but keeps a given root
