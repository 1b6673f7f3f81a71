"""The Pi 4 emulation itself: the quota reaches every node, and one node trains at the calibrated rate."""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import time

from .emulation import SEED


def test_every_node_runs_under_the_calibrated_quota(emulated, pi4):
    for n in emulated.state.nodes:
        assert n.cgroup.quota() == (pi4.quota_us, pi4.period_us)
        # sshd itself, so every process it starts for the node (Hydra's proxies, ranks) is charged to it.
        procs = (n.cgroup.path() / "cgroup.procs").read_text().split()
        assert str(n.sshd_pid) in procs, f"{n.name}'s sshd is not in its group"
    assert 0.05 < pi4.cores < 1.0, f"a Pi 4 calibrated to {pi4.cores:.3f} of this machine's cores"


def test_one_emulated_node_trains_at_the_calibrated_rate(emulated, pi4, report):
    """The seed LeNet on node1 over ssh (a process of the node): epochs 2-3 within 10% of the target."""
    n = emulated.state.nodes[0]
    before, start = n.cgroup.stat(), time.monotonic()
    cmd = f"cd {shlex.quote(str(SEED.parents[2]))} && {shlex.quote(sys.executable)} {SEED} --epochs 3 --steps-per-epoch 100"
    out = emulated.ssh(n, cmd, timeout=900).stdout
    elapsed = time.monotonic() - start
    after = n.cgroup.stat()
    epochs = [json.loads(line) for line in out.splitlines() if line.startswith('{"event": "epoch"')]
    assert len(epochs) == 3, out[-2000:]
    rate = statistics.median(e["images_per_sec"] for e in epochs[1:])
    used = (after["usage_ns"] - before["usage_ns"]) / 1e9 / elapsed
    report["emulated pi4 node"] = (f"target {pi4.images_per_sec:g} img/s, measured {rate:.0f} img/s (seed LeNet, epochs 2-3), "
                                   f"quota {pi4.cores:.3f} core, used {used:.3f} core, throttled {after['nr_throttled'] - before['nr_throttled']}"
                                   f" of {after['nr_periods'] - before['nr_periods']} periods")
    assert abs(rate - pi4.images_per_sec) <= 0.10 * pi4.images_per_sec, report["emulated pi4 node"]
    # The quota binds: the node never used more CPU than it was given (5% for accounting granularity).
    assert after["nr_throttled"] > before["nr_throttled"]
    assert used <= pi4.cores * 1.05, report["emulated pi4 node"]
