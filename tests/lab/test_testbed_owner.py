"""A testbed is in use while the process that made it runs (lab/testbed.py), so a bare
`python -m lab down` leaves a running test session's testbed alone: the process must be
that one, not a later one given the same pid."""

from __future__ import annotations

import os
import subprocess
import sys

from lab.testbed import State, _started


def state(**owner) -> State:
    return State(id="et-0000", dir="/nonexistent", subnet=1, bridge="et-0000-br", mpi_user="et0000",
                 link_mbit=None, docker=False, **owner)


def test_a_testbed_is_in_use_while_its_maker_runs_and_not_after():
    assert state(owner_pid=os.getpid(), owner_started=_started(os.getpid())).in_use
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True, check=True)
    assert not state(owner_pid=int(ended.stdout), owner_started=0).in_use


def test_a_pid_reused_by_another_process_does_not_keep_a_testbed():
    assert not state(owner_pid=os.getpid(), owner_started=_started(os.getpid()) - 1).in_use


def test_a_testbed_recorded_before_owners_were_is_not_in_use():
    assert not state().in_use
