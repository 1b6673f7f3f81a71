"""A rank's keeper (edgetrain.rank.keeper), with real processes: what it records of a rank a
signal ended, what it leaves alone, and that its rank does not outlive it."""

from __future__ import annotations

import json
import os
import resource
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgetrain.shared import failures

# A rank under a keeper: it says both pids, then does as told.
RANK = """
import os, signal, sys, time
from pathlib import Path
from edgetrain.rank import keeper
run_dir, how = Path(sys.argv[1]), sys.argv[2]
kept_by = keeper.keep(run_dir, 1, run_dir / "rank.1.log")
(run_dir / "pids").write_text(f"{os.getpid()} {kept_by}")
if how == "exit 3":
    os._exit(3)
if how == "segfault":
    os.kill(os.getpid(), signal.SIGSEGV)
time.sleep(60)
"""


def no_core() -> None:
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # the segfault is meant


def start(tmp_path: Path, how: str) -> tuple[subprocess.Popen, int]:
    """The keeper's process, and its rank's pid once the rank runs."""
    proc = subprocess.Popen([sys.executable, "-c", RANK, str(tmp_path), how], start_new_session=True, preexec_fn=no_core)
    deadline = time.monotonic() + 30
    while not (tmp_path / "pids").is_file() or len((tmp_path / "pids").read_text().split()) < 2:
        assert time.monotonic() < deadline and proc.poll() is None, "the rank never started"
        time.sleep(0.05)
    rank, kept_by = map(int, (tmp_path / "pids").read_text().split())
    assert kept_by == proc.pid and rank != proc.pid
    return proc, rank


def gone(pid: int, within: float = 10) -> bool:
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def record(tmp_path: Path) -> dict | None:
    p = failures.path(tmp_path, 1)
    return json.loads(p.read_text()) if p.is_file() else None


@pytest.mark.parametrize("how, sig", [("segfault", signal.SIGSEGV), ("wait", signal.SIGKILL)], ids=["segfault", "kill -9"])
def test_a_rank_a_signal_ends_is_recorded_by_its_keeper_which_ends_the_same_way(tmp_path, how, sig):
    proc, rank = start(tmp_path, how)
    if sig is signal.SIGKILL:
        os.kill(rank, sig)  # as the out-of-memory killer would
    assert proc.wait(30) == -sig  # Hydra sees what it would have seen of the rank itself
    found = record(tmp_path)
    assert found is not None and found["rank"] == 1 and found["kind"] == failures.Kind.SIGNAL.value
    assert found["error"] == f"killed by {sig.name} (signal {sig.value})" and found["fix"]
    assert (tmp_path / "rank.1.log").read_text().splitlines()[-1] == f"edgetrain: rank 1 on {found['host']} failed: {found['error']}"


def test_a_signal_sent_to_the_ranks_group_ends_the_rank_and_is_not_a_failure(tmp_path):
    """Hydra passes mpirun's Ctrl-C and SIGTERM to each rank's process group: rank and keeper
    both get it; the keeper outlives it, and reports the rank's end as its own."""
    proc, rank = start(tmp_path, "wait")
    os.killpg(proc.pid, signal.SIGTERM)
    assert proc.wait(30) == -signal.SIGTERM and gone(rank)
    assert record(tmp_path) is None


def test_a_rank_that_exits_leaves_its_status_to_its_keeper_and_no_record(tmp_path):
    proc, _ = start(tmp_path, "exit 3")
    assert proc.wait(30) == 3
    assert record(tmp_path) is None


def test_a_rank_does_not_outlive_its_keeper(tmp_path):
    """Hydra may end the keeper alone (its pid, not its group): the rank goes with it."""
    proc, rank = start(tmp_path, "wait")
    os.kill(proc.pid, signal.SIGKILL)
    assert proc.wait(30) == -signal.SIGKILL
    assert gone(rank), "the rank outlived its keeper"
    assert record(tmp_path) is None
