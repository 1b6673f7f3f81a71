"""The container's lease, as the container's command runs it: the command lives while the
controller renews the lease, and ends when it stops - on the node's monotonic clock, whatever its
wall clock does, and whenever the watcher cannot go on (no file, a removed file, a SIGTERM)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from edgetrain.controller import containers
from edgetrain.controller.inventory import Host
from edgetrain.controller.remote import Nodes
from tests.conftest import ROOT, sigint_default

LIMIT = 1.5


def lease(tmp_path: Path, limit: float = LIMIT) -> tuple[subprocess.Popen, Path, Path]:
    """The lease over a command that records it started, then waits; (process, lease file, marker)."""
    marker = tmp_path / "started"
    proc = subprocess.Popen([sys.executable, "-m", "edgetrain.rank.lease", str(tmp_path / "lease"), str(limit), str(tmp_path / "state"), "--",
                             "sh", "-c", f"touch {marker} && exec sleep 600"],
                            cwd=ROOT, stderr=subprocess.PIPE, text=True, preexec_fn=sigint_default)
    return proc, tmp_path / "lease", marker


def started(marker: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not marker.exists():
        assert time.monotonic() < deadline, "the command never started"
        time.sleep(0.05)


def ended_within(proc: subprocess.Popen, seconds: float) -> tuple[int, str]:
    try:
        code = proc.wait(timeout=seconds)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return code, proc.stderr.read()


def test_the_command_lives_while_renewed_and_ends_once_not(tmp_path):
    (tmp_path / "lease").touch()
    proc, path, marker = lease(tmp_path)
    started(marker)
    for _ in range(12):  # 3.6 s of renewals, more than twice the lease
        os.utime(path)
        time.sleep(0.3)
        assert proc.poll() is None
    begun = time.monotonic()
    code, err = ended_within(proc, 30)
    assert code == 1 and "not renewed for 2 s: the controller is gone" in err, err
    assert time.monotonic() - begun < LIMIT + 2


def test_a_wall_clock_step_neither_ends_a_renewed_lease_nor_keeps_a_dead_one(tmp_path):
    """A Pi without a real-time clock steps its clock at NTP sync: renewals stamped an hour in
    the past keep the lease, and a stamp an hour in the future does not make it last an hour."""
    path = tmp_path / "lease"
    path.touch()
    os.utime(path, (time.time() - 3600, time.time() - 3600))
    proc, _, marker = lease(tmp_path)
    started(marker)
    for i in range(10):
        os.utime(path, (time.time() - 3600 + i, time.time() - 3600 + i))
        time.sleep(0.3)
        assert proc.poll() is None
    os.utime(path, (time.time() + 3600, time.time() + 3600))  # the last renewal, then none
    code, err = ended_within(proc, LIMIT + 10)
    assert code == 1 and "not renewed" in err, err


def test_a_lease_that_does_not_exist_starts_nothing(tmp_path):
    """The controller died between starting the container and making its lease."""
    proc, _, marker = lease(tmp_path)
    code, err = ended_within(proc, 30)
    assert code == 1 and "does not exist" in err and not marker.exists(), err


def test_a_lease_removed_ends_the_command_at_once(tmp_path):
    (tmp_path / "lease").touch()
    proc, path, marker = lease(tmp_path, limit=600)
    started(marker)
    path.unlink()
    code, err = ended_within(proc, 10)
    assert code == 1 and "is gone" in err, err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_the_lease_stopped_or_failing_ends_the_command(tmp_path, sig):
    """SIGTERM is Docker stopping the container; SIGINT a KeyboardInterrupt in the watcher, as
    any error of its own would be: the command ends either way."""
    (tmp_path / "lease").touch()
    proc, _, marker = lease(tmp_path, limit=600)
    started(marker)
    sleeper = int(subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()[0])
    proc.send_signal(sig)
    code, err = ended_within(proc, 20)
    assert code != 0 and "stopping this container" in err, err
    assert not Path(f"/proc/{sleeper}").exists() or Path(f"/proc/{sleeper}/stat").read_text().split()[2] == "Z"


@pytest.mark.parametrize(("stamped", "lease_seconds", "silent", "removed", "said"), [
    (-3600, 30, 0.0, False, "another controller renewed its lease"),
    (+3600, 2, 3.0, True, "its lease ran out"),
], ids=["renewed-stamped-an-hour-back", "silent-stamped-an-hour-ahead"])
def test_clean_judges_a_lease_by_the_watchers_clock_not_the_files_age(tmp_path, monkeypatch, stamped, lease_seconds,
                                                                        silent, removed, said):
    """A Pi steps its wall clock at NTP sync, so a lease file's age by that clock is off by the
    step: ``clean`` took a lease the watcher had just seen renewed for an hour old (and removed
    another controller's live container), and one silent for longer than its lease for renewed in
    the future (and kept it). The watcher is the real one; ``docker`` is a stand-in that lists its
    container, runs ``docker exec`` here with the container's paths mapped to the test's, and
    records a removal."""
    path = tmp_path / "lease"
    path.touch()
    os.utime(path, (time.time() + stamped, time.time() + stamped))
    proc, _, marker = lease(tmp_path, limit=600)  # it never ends by itself here: clean's verdict alone is tested
    try:
        started(marker)
        time.sleep(silent)
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        docker = bin_dir / "docker"
        paths = {containers.PYTHON: sys.executable, containers.LEASE_STATE: str(tmp_path / "state")}
        docker.write_text(f"""#!{sys.executable}
import os, sys
args = sys.argv[1:]
if args[0] == "ps":
    print("\\t".join(["edgetrain-r", "running", "r", {str(path)!r}, {str(lease_seconds)!r}]))
elif args[0] == "exec":
    argv = [{paths!r}.get(a, a) for a in args[2:]]
    os.execv(argv[0], argv)
elif args[0] == "rm":
    with open({str(tmp_path / "removed")!r}, "a") as f:
        f.write(args[-1] + "\\n")
""")
        docker.chmod(0o755)
        monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
        here = Host(name="localhost", address="localhost", arch="x86_64", slots=1, runtime="docker", connection="local")
        with Nodes() as nodes:
            [cleaned] = containers.clean(nodes, [here], lambda run: containers.Here.UNKNOWN)
    finally:
        proc.kill()
        proc.wait()
    assert cleaned.removed is removed and said in cleaned.detail, cleaned
    assert (tmp_path / "removed").exists() is removed
