"""Preflight reads every node's clock and reports one far from the controller's. The node is this
machine, reached as a local host; a node whose clock stepped is a `date` on its PATH that answers
for it, the rest of the reading (the command, the round trip, the report) is the real one."""

from __future__ import annotations

import time

import pytest

from edgetrain.controller import preflight
from edgetrain.controller.inventory import Host
from edgetrain.controller.remote import Nodes

LOCAL = Host(name="pi1", address="localhost", arch="aarch64", slots=1, runtime="docker", connection="local")


def node_clock(tmp_path, monkeypatch, offset: int) -> None:
    """The node's date answers ``offset`` seconds from this machine's clock."""
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "date").write_text(f'#!/bin/sh\necho "$(( $(/bin/date +%s) + {offset} )).$(/bin/date +%N)"\n')
    (bin_ / "date").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:/usr/bin:/bin")


def report(skew: preflight.Skew) -> preflight.NodeReport:
    return preflight.NodeReport(LOCAL, [preflight.Check("clock", True, skew.describe())], skew=skew)


@pytest.mark.parametrize(("offset", "said"), [(-3 * 3600, "3 h behind"), (400 * 86400, "400 days ahead of")])
def test_a_node_whose_clock_stepped_is_reported(tmp_path, monkeypatch, offset, said):
    node_clock(tmp_path, monkeypatch, offset)
    with Nodes() as nodes:
        skew = preflight.read_skew(nodes, LOCAL)
    assert abs(skew.seconds - offset) < 2 and skew.reported
    assert preflight.skewed([report(skew)]) == [
        f"preflight: the clock of pi1 is {said} this machine's (sync it with NTP: timedatectl set-ntp true)"]


def test_a_node_in_step_with_this_machine_is_not_reported():
    start = time.time()
    with Nodes() as nodes:
        skew = preflight.read_skew(nodes, LOCAL)
    assert abs(skew.seconds) <= time.time() - start + 0.01 and not skew.reported
    assert skew.describe() == "within 2 s of this machine's" and preflight.skewed([report(skew)]) == []


def test_a_clock_that_reads_no_number_is_a_failed_check(tmp_path, monkeypatch):
    bin_ = tmp_path / "bin"
    bin_.mkdir()
    (bin_ / "date").write_text("#!/bin/sh\necho 'Thu Jan  1 00:00:00 UTC 1970'\n")
    (bin_ / "date").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_}:/usr/bin:/bin")
    with Nodes() as nodes:
        checks = preflight._NodeChecks(nodes, LOCAL, preflight.NodeReport(LOCAL), None, "")
        assert not checks.step("clock", checks.clock)
    assert checks.rep.failure.detail == "the clock of pi1 reads 'Thu Jan  1 00:00:00 UTC 1970', not seconds"
