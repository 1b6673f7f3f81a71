"""One Hydra job per host under edgetrain.rank.hostjobs (a tf-ps run, whose workers it can lose),
with MPICH's real mpirun: ranks numbered across the jobs, a lost job of expendable ranks reported
while rank 0's job goes on, any other job ending first ends the run, and Ctrl-C reaching every job."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from edgetrain.rank import hostjobs
from edgetrain.shared import mpi, progress

# Each rank writes its pid to DIR/rank.R, then lives for its own number of seconds.
RANK = ("import os, sys, time; from edgetrain.shared import mpi; r, s = mpi.rank_and_size(); "
        "open(os.path.join(sys.argv[1], f'rank.{r}'), 'w').write(f'{os.getpid()} {s}'); "
        "time.sleep(float(sys.argv[2 + r]))")


def jobs(tmp_path, lives: list[float], expendable: list[bool]) -> list[mpi.HostJob]:
    """A job of one rank each on this machine, rank r living lives[r] seconds."""
    hydra = mpi.Hydra("mpirun", "", None, False, {})
    command = [sys.executable, "-c", RANK, str(tmp_path), *map(str, lives)]
    env = {mpi.WORLD_SIZE: str(len(lives))}
    return [mpi.HostJob(f"host{r}", (r,), expendable[r], (*hydra.argv(1, ["localhost:1"], {**env, mpi.RANK_BASE: str(r)}), *command))
            for r in range(len(lives))]


def pid_of(tmp_path, rank: int, timeout: float = 30) -> int:
    deadline = time.monotonic() + timeout
    while not (tmp_path / f"rank.{rank}").is_file() or not (tmp_path / f"rank.{rank}").read_text():
        assert time.monotonic() < deadline, f"rank {rank} never started"
        time.sleep(0.1)
    return int((tmp_path / f"rank.{rank}").read_text().split()[0])


def events(text: str) -> list[dict]:
    return [p for line in text.splitlines() for p in progress.parse(line, "tok") if isinstance(p, dict)]


def supervise(tmp_path, lives, expendable, during=None) -> tuple[int, float, list[dict]]:
    stream = io.StringIO()
    running = hostjobs.Jobs(jobs(tmp_path, lives, expendable), progress.Events(stream, enabled=True, token="tok"))
    started = time.monotonic()
    running.start()
    try:
        if during is not None:
            during()
        code = running.supervise()
    finally:
        running.wind_up(0, grace=0)
    return code, time.monotonic() - started, events(stream.getvalue())


def test_ranks_are_numbered_across_the_jobs_and_the_run_ends_with_rank0s_job(tmp_path):
    code, took, seen = supervise(tmp_path, [1, 1, 1], [False, True, True])
    assert code == 0 and seen == [] and took < 30
    assert {r: (tmp_path / f"rank.{r}").read_text().split()[1] for r in range(3)} == {0: "3", 1: "3", 2: "3"}


def test_a_lost_job_of_expendable_ranks_is_reported_and_rank0s_job_goes_on(tmp_path, monkeypatch):
    monkeypatch.setattr(hostjobs, "OTHERS_GRACE", 1.0)
    # Rank 2's job loses its rank at once (SIGKILL, as a killed container does); rank 1 outlives rank 0.
    code, took, seen = supervise(tmp_path, [8, 600, 600], [False, True, True],
                                 during=lambda: os.kill(pid_of(tmp_path, 2), signal.SIGKILL))
    assert code == 0, seen
    assert [(e["event"], e["host"], e["ranks"]) for e in seen] == [("lost", "host2", [2])]
    assert "ended with status 9" in seen[0]["why"]
    # Rank 0's job ran its 8 s, then rank 1's was ended after the grace, not waited for.
    assert 8 <= took < 30, took
    with pytest.raises(ProcessLookupError):
        os.kill(pid_of(tmp_path, 1), 0)


def test_a_job_the_run_cannot_lose_ending_first_ends_the_run_with_its_status(tmp_path):
    # Rank 1 (a parameter server's job, say) dies at once; rank 0 would have lived 600 s.
    code, took, seen = supervise(tmp_path, [600, 600], [False, False],
                                 during=lambda: os.kill(pid_of(tmp_path, 1), signal.SIGKILL))
    assert code == 9 and seen == [] and took < 30, (code, took)
    with pytest.raises(ProcessLookupError):
        os.kill(pid_of(tmp_path, 0), 0)


def test_ctrl_c_reaches_every_job(tmp_path):
    spec = mpi.encode_jobs(jobs(tmp_path, [600, 600], [False, True]))
    proc = subprocess.Popen([sys.executable, "-m", "edgetrain.rank.hostjobs", spec], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    pids = [pid_of(tmp_path, r) for r in (0, 1)]
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    out = proc.communicate(timeout=60)[0]
    # Each rank got the SIGINT (as a KeyboardInterrupt), through its own job's mpiexec.
    assert out.count("KeyboardInterrupt") == 2 and time.monotonic() - started < 30, out
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)


def test_the_jobs_travel_whole():
    found = jobs(__import__("pathlib").Path("/x"), [1, 2], [False, True])
    assert mpi.decode_jobs(mpi.encode_jobs(found)) == found
    assert json.loads(mpi.encode_jobs(found))[1]["expendable"] is True
