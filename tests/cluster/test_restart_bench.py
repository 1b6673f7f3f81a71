"""What losing a node costs a run started with --max-restarts, against the same run uninterrupted,
on the testbed's three container nodes (one rank each, LeNet for 4 full epochs, lease 30 s):

- uninterrupted, before and after the others (this machine drifts: the two bracket it);
- node3's link cut half-way through epoch 2, ``--max-restarts 1``: the run leaves node3 out and
  completes on node1 and node2 by itself;
- the same with ``--rejoin`` and node3's link restored once the restart began: node3 is taken back
  and the last epoch trains on all three.

For each: the wall time from the command to its exit, the final val_accuracy, and for a restart
where its time went (detection, ending the attempt, the next attempt's preflight, containers and
MPI probe, then restore and first step). While the runs train, every check the watcher made of a
node with no fault is a chance of a false alarm: the runs count them (a node wrongly called lost)
and the near misses (its shared connection failed, a new one answered).

The nodes train at this machine's speed, not emulated Pis': an epoch here takes about a minute, a
Pi's many, so the restart's fixed costs weigh far more here than they would there.

A measurement, reported rather than asserted (-m bench): ``pytest -m bench tests/cluster/test_restart_bench.py -s``.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import pytest

from lab.testbed import run

from .conftest import Cluster
from .long_run import LEASE, LongRun, fault_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow, pytest.mark.bench]

EPOCHS = 4
NOTICED = "; ending this attempt"
NEAR_MISS = "but a new one answered"


@dataclass
class Finished:
    wall: float
    accuracy: float
    ranks: list[int]  # per epoch
    record: dict
    job: LongRun


def lenet(c: Cluster, *extra: str) -> LongRun:
    return LongRun(c, *extra, epochs=EPOCHS, max_steps=None)


def finish(c: Cluster, job: LongRun, rid: str) -> Finished:
    code, _, err = job.wait(1800)
    wall = job.ended - job.started
    assert code == 0, err[-3000:]
    assert c.leftovers() == {}
    # The console as it came, each line at its second from the command: where a run's time went.
    (c.runs / rid / "console.txt").write_text(job.console(job.started))
    metrics = c.metrics(rid)
    assert [m["epoch"] for m in metrics][-1] == EPOCHS, metrics
    return Finished(wall, metrics[-1]["val_accuracy"], [m["ranks"] for m in metrics], c.run_json(rid), job)


def uninterrupted(c: Cluster) -> Finished:
    with lenet(c) as job:
        return finish(c, job, job.run_id())


def cut_in_epoch_2(c: Cluster, rejoin: bool) -> tuple[Finished, float]:
    """node3's link cut about half-way through epoch 2 (the time of epoch 1 from the first step's
    launch line to its checkpoint); returns the finished run and the cut's monotonic time."""
    node3 = next(n for n in c.bed.state.nodes if n.name == "node3")
    with lenet(c, "--max-restarts", "1", *(("--rejoin",) if rejoin else ())) as job:
        rid = job.checkpoint(1)
        began = job.said("preflight ok") or job.started
        time.sleep((time.monotonic() - began) / 2)
        cut = time.monotonic()
        run("ip", "link", "set", node3.veth, "down")
        try:
            job.until("restart", lambda: job.said("restarting on node1, node2"), 300)
            if rejoin:
                run("ip", "link", "set", node3.veth, "up")
                c.bed.wait_ssh(node3)
            done = finish(c, job, rid)
        finally:
            run("ip", "link", "set", node3.veth, "up")
            c.bed.wait_ssh(node3)
    return done, cut


def restart_costs(done: Finished, cut: float) -> dict[str, float]:
    """Where the time from the cut to the next attempt's first step went, from when the console said what."""
    job = done.job
    noticed, restarting = job.said(NOTICED), job.said("restarting on node1, node2")
    prepared = next(t for t, line in job.timed if "preflight ok" in line and t > restarting)
    first_step = done.record["attempts"][1]["first_step_s"]
    return {"detection": noticed - cut, "ending the attempt": restarting - noticed,
            "preflight, containers, MPI probe": prepared - restarting,
            "restore and first step": first_step - (prepared - restarting)}


def watched(done: Finished, faulty: set[str]) -> tuple[float, int, int]:
    """About how many node-minutes the watcher checked nodes with no fault (the nodes never cut,
    for the whole run), and the false alarms and near misses among them."""
    sound = [h for h in ("node1", "node2", "node3") if h not in faulty]
    about = [line for _, line in done.job.timed if any(line.startswith(f"edgetrain: {h}: ") or f"warning: {h}: " in line for h in sound)]
    return len(sound) * done.wall / 60, sum(NOTICED in line for line in about), sum(NEAR_MISS in line for line in about)


def test_what_a_lost_node_costs_against_an_uninterrupted_run(cluster, report):
    c = fault_cluster(cluster)
    before = uninterrupted(c)
    shrunk, cut = cut_in_epoch_2(c, rejoin=False)
    back, cut_back = cut_in_epoch_2(c, rejoin=True)
    after = uninterrupted(c)

    assert [a["np"] for a in shrunk.record["attempts"]] == [3, 2] and shrunk.ranks[-1] == 2
    assert [a["np"] for a in back.record["attempts"]] == [3, 2, 3] and back.ranks[-1] == 3
    base_wall = (before.wall + after.wall) / 2
    base_acc = (before.accuracy + after.accuracy) / 2
    report["restart bench: uninterrupted"] = (f"{before.wall:.0f} s and {after.wall:.0f} s, val_accuracy {before.accuracy:.4f} "
                                              f"and {after.accuracy:.4f} (before and after the others)")
    for name, done, at in (("--max-restarts 1", shrunk, cut), ("--max-restarts 1 --rejoin", back, cut_back)):
        costs = restart_costs(done, at)
        lost = done.record["attempts"][1]["resumed_from_epoch"]
        report[f"restart bench: node3 cut in epoch 2, {name}"] = (
            f"{done.wall:.0f} s ({done.wall / base_wall:.2f}x the uninterrupted mean; target <= 1.5x), "
            f"val_accuracy {done.accuracy:.4f} ({100 * (done.accuracy - base_acc):+.2f} points; target within 0.3), "
            f"ranks per epoch {done.ranks}, resumed from epoch {lost}; "
            + ", ".join(f"{k} {v:.1f} s" for k, v in costs.items()) + f" (detection target <= 30 s; lease {LEASE} s)")
    minutes = false = near = 0
    for done, faulty in ((before, set()), (after, set()), (shrunk, {"node3"}), (back, {"node3"})):
        m, f, n = watched(done, faulty)
        minutes, false, near = minutes + m, false + f, near + n
    report["restart bench: false alarms"] = (f"{false} node(s) wrongly called lost and {near} near miss(es) in about "
                                             f"{minutes:.0f} node-minutes watched with no fault, every ~2 s, on this 2-core machine "
                                             f"training 2-3 ranks")
    assert false == 0
