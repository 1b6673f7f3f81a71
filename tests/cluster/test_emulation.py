"""The Pi 4 emulation itself: the quotas reach every node and one node trains at the calibrated rate.
Under the optimistic bracket (the default) a rank's communication threads - only those - run on the
node's Pi core of their own, and a node with nothing to train trains a stand-in (paused while the
node trains); under the pessimistic one (EDGETRAIN_TESTBED_BRACKET=pessimistic) neither: every
thread stays in the node's one quota and idle nodes idle."""

from __future__ import annotations

import json
import shlex
import statistics
import sys
import tempfile
import threading
import time

from pathlib import Path

from edgetrain.shared import tempdirs
from lab.comm_core import comm_group
from lab.emulation import ROOT, SEED, SeedMeter, measurement_steps
from lab.standin import SCRATCH
from lab.testbed import _alive


def test_every_node_runs_under_the_calibrated_quota(emulated, pi4):
    for n in emulated.state.nodes:
        assert n.cgroup.quota() == (pi4.quota_us, pi4.period_us)
        # sshd itself, so every process it starts for the node (Hydra's proxies, ranks) is charged to it.
        procs = (n.cgroup.path() / "cgroup.procs").read_text().split()
        assert str(n.sshd_pid) in procs, f"{n.name}'s sshd is not in its group"
        if optimistic(pi4):
            assert comm_group(n.cgroup).quota() == (pi4.comm_quota_us, pi4.period_us)
    assert 0.05 < pi4.cores < 1.0, f"a Pi 4 calibrated to {pi4.cores:.3f} of this machine's cores"
    if not optimistic(pi4):
        assert pi4.neighbours == 0 and emulated.state.emulator_pid is None
        assert all(_stand_in(n) is None for n in emulated.state.nodes)
        return
    # One Pi core copies memory at a fraction of one of this machine's cores, a larger one than its
    # share of the convolutions (the whole Pi's quota over four cores).
    assert pi4.cores / 4 < pi4.comm_cores < 1.0, f"a Pi core's communication at {pi4.comm_cores:.3f} of a core"
    assert emulated.state.emulator_pid and _alive(emulated.state.emulator_pid)
    assert pi4.neighbours == len(emulated.state.nodes) - 1
    time.sleep(2)  # a scan or two of the daemon
    assert all(_stand_in(n) == "running" for n in emulated.state.nodes), {n.name: _stand_in(n) for n in emulated.state.nodes}


def optimistic(pi4) -> bool:
    """The bracket the session's testbed emulates (conftest's ``pi4``): a Pi core for communication and stand-ins."""
    return pi4.comm_quota_us is not None


def _stand_in(node) -> str | None:
    """"running", "stopped" or None (no stand-in): the node's seed stand-in process, as /proc shows it."""
    for procs in node.cgroup.path().rglob("cgroup.procs"):
        for pid in procs.read_text().split():
            try:
                if "--stand-in" in Path(f"/proc/{pid}/cmdline").read_text():
                    return "stopped" if Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "T" else "running"
            except OSError:
                continue
    return None


def test_one_emulated_node_trains_at_the_calibrated_rate(emulated, pi4, report):
    """The seed LeNet on node1 over ssh (a process of the node): epochs 2-3 at the calibrated rate
    (each of 60 steps: 15 s at 250 img/s, 150 quota periods), each validated on 1,000 test images,
    not the recipe's 10,000: the rate judged leaves validation out, and the whole set took most of
    the test's time.

    This machine's speed per CPU-second drifts by up to a tenth within minutes (neighbours on the
    host), so the node is judged side by side with a calibration process at the same quota, run at
    the same time: the node's group must give what the calibration's group gives, and that
    reference must still be near the target (within 20%: the calibration is not stale). Even side by
    side the two differed by 1%, 2.5% and 11.5% in three runs (how well TensorFlow's two threads
    run in parallel depends on what else holds the other core), so that bound is 15%, not 10%.

    Meanwhile, under the optimistic bracket, the node's comm group must receive the seed's Horovod
    thread (one rank at size 1: its background loop) and nothing else of it: a TensorFlow thread
    moved there would train on CPU the node does not have. Under the pessimistic one no node has a
    comm group or a stand-in, then or after.
    """
    n = emulated.state.nodes[0]
    comm = comm_group(n.cgroup)
    reference: list[float] = []
    moved: dict[int, int] = {}  # tid -> its process, as seen in the node's comm group (the stand-in's left out)
    with SeedMeter("edgetrain-reference", measurement_steps(pi4.images_per_sec), comm_cores=pi4.comm_cores) as meter:
        meter.limit(pi4.quota_us, pi4.period_us)
        done = threading.Event()

        def keep_measuring() -> None:
            while not done.is_set():
                reference.append(meter.measure())

        stand_ins: list[dict[str, str | None]] = []

        def watch_comm() -> None:
            while not done.wait(1.0):
                stand_ins.append({m.name: _stand_in(m) for m in emulated.state.nodes})
                if not optimistic(pi4):
                    continue
                for tid in (comm.path() / "tasks").read_text().split():
                    try:
                        pid = int(Path(f"/proc/{tid}/status").read_text().split("\nTgid:")[1].split()[0])
                        if "--stand-in" not in Path(f"/proc/{pid}/cmdline").read_text():
                            moved[int(tid)] = pid
                    except (OSError, IndexError):
                        pass

        thread = threading.Thread(target=keep_measuring, daemon=True)
        thread.start()
        watcher = threading.Thread(target=watch_comm, daemon=True)
        watcher.start()
        try:
            before, start = emulated.cpu_stat()[n.name], time.monotonic()
            cmd = f"cd {shlex.quote(str(ROOT))} && {shlex.quote(sys.executable)} {SEED} --epochs 3 --steps-per-epoch 60 --validation-images 1000"
            out = emulated.ssh(n, cmd, timeout=900).stdout
            elapsed = time.monotonic() - start
            after = emulated.cpu_stat()[n.name]
        finally:
            done.set()
            thread.join(timeout=120)
            watcher.join(timeout=10)
        # TensorFlow's autograph files go in the calibration's own temp directory, not /tmp ...
        scratch = list(Path(tempfile.gettempdir()).glob(tempdirs.prefix(SCRATCH, meter.proc.pid) + "*"))
        assert len(scratch) == 1 and any(scratch[0].glob("__autograph_generated_file*")), scratch
    assert not scratch[0].exists(), "... which goes when the process is killed"
    epochs = [json.loads(line) for line in out.splitlines() if line.startswith('{"event": "epoch"')]
    assert len(epochs) == 3, out[-2000:]
    assert len(reference) >= 3, reference
    rate = statistics.median(e["images_per_sec"] for e in epochs[1:])
    ref = statistics.median(reference)
    used = (after["usage_ns"] - before["usage_ns"]) / 1e9 / elapsed
    comm_used = (after["comm_usage_ns"] - before["comm_usage_ns"]) / 1e9 / elapsed if optimistic(pi4) else 0.0
    said = (f"target {pi4.images_per_sec:g} img/s, measured {rate:.0f} img/s (seed LeNet, epochs 2-3) "
            f"beside {ref:.0f} img/s in a calibration group at the same time; "
            f"quota {pi4.cores:.3f} core, used {used:.3f} core, throttled {after['nr_throttled'] - before['nr_throttled']}"
            f" of {after['nr_periods'] - before['nr_periods']} periods; "
            + (f"communication threads {sorted(moved)} on {pi4.comm_cores:.3f} core, used {comm_used:.4f}"
               if optimistic(pi4) else "communication in the same quota (pessimistic bracket)"))
    # Report takes figures, it gives none back: the assertions below say the same line.
    report["emulated pi4 node"] = said
    if optimistic(pi4):
        # While node1 trained, its stand-in stood still and the others trained; afterwards it trains again.
        others = [m.name for m in emulated.state.nodes[1:]]
        assert any(seen[n.name] == "stopped" and all(seen[o] == "running" for o in others) for seen in stand_ins), stand_ins
        time.sleep(2)
        assert _stand_in(n) == "running"
        (tid, pid), = moved.items()
        assert tid != pid, "a process's main thread (Keras' loop) was taken for a communication thread"
        assert comm_used < 0.3 * used, said
    else:
        assert stand_ins and all(v is None for seen in stand_ins for v in seen.values()), stand_ins
        assert not comm.path().is_dir()
    assert abs(rate - ref) <= 0.15 * ref, said
    assert abs(ref - pi4.images_per_sec) <= 0.20 * pi4.images_per_sec, said
    # The quota binds: the node never used more CPU than it was given (5% for accounting granularity).
    assert after["nr_throttled"] > before["nr_throttled"]
    assert used <= pi4.cores * 1.05, said
