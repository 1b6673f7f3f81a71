"""`edgetrain run lenet` across the testbed's container nodes in the background, as a user starts it
in a terminal: what the fault tests and the restart benchmark cut, kill and time."""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from lab.console import TimedOutput
from lab.testbed import run
from tests.conftest import ROOT, edgetrain, sigint_default

from .conftest import Cluster

LEASE = 30  # edgetrain_lease_seconds of the fault inventory: containers of a lost controller end within it
NP = ("--np", "3")  # one rank per node: rank 0 on node1, 1 on node2, 2 on node3
STEPS = 10  # steps an epoch: the fault tests' epochs are short


def fault_cluster(cluster: Cluster) -> Cluster:
    """The container cluster with a short lease, so a node cut off is back to clean soon."""
    return Cluster(cluster.bed, cluster.docker_inventory("docker-faults.yml", head_slots=1, edgetrain_lease_seconds=LEASE),
                   cluster.env, cluster.runs)


def completed(cluster: Cluster, *args: str, timeout: float = 3600, meanwhile=None, every: float = 0.5) -> tuple[TimedOutput, float]:
    """``edgetrain run ARGS`` to its end, which must be success: its output, every line timed, and
    the monotonic time it was started (what the benches time from). ``meanwhile(output, undo)``,
    if given, is called every ``every`` seconds while it runs; what it enters on ``undo`` (a link
    cut) is undone once the run has ended."""
    start = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "edgetrain", "run", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, cwd=ROOT, env={**os.environ, **cluster.env}, preexec_fn=sigint_default)
    said = TimedOutput(proc)
    with contextlib.ExitStack() as undo:
        try:
            while proc.poll() is None and time.monotonic() - start < timeout:
                if meanwhile:
                    meanwhile(said, undo)
                time.sleep(every)
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGINT)
            proc.wait(timeout=120)
    said.caught_up()
    assert proc.returncode == 0, "".join(said.out)[-3000:] + "".join(said.err)[-3000:]
    return said, start


@contextlib.contextmanager
def cut_link(c: Cluster, node: str):
    """``node``'s link down (a dark link: nothing answers, nothing is closed), up again at the end."""
    n = next(n for n in c.bed.state.nodes if n.name == node)
    run("ip", "link", "set", n.veth, "down")
    try:
        yield
    finally:
        run("ip", "link", "set", n.veth, "up")
        c.bed.wait_ssh(n)


# The line rank 0 prints once training ends (edgetrain.callbacks and the DDP example alike).
TEST_ACCURACY = re.compile(r"test accuracy ([\d.]+)")


def in_turns(race: int, launchers: list[tuple[str, Callable[[], Any]]]) -> dict[str, Any]:
    """Each launcher's result, run in the order given on even races and reversed on odd ones, so that
    the machine's drift does not always fall on the same one."""
    return {name: run() for name, run in (launchers[::-1] if race % 2 else launchers)}


def epoch_lines(said: TimedOutput) -> list[tuple[float, dict]]:
    """A script's ``{"event": "epoch", ...}`` lines with the time each came (after any prefix a launcher adds)."""
    epochs = [(t, json.loads(line[line.find('{"event": "epoch"'):])) for t, line in list(said.timed) if '{"event": "epoch"' in line]
    assert epochs, "".join(said.out)[-3000:] + "".join(said.err)[-3000:]
    return epochs


class LongRun(TimedOutput):
    """The run, its console lines kept as they arrive, each with the monotonic time it came."""

    def __init__(self, c: Cluster, *extra: str, epochs: int = 40, max_steps: int | None = STEPS,
                 command: tuple[str, ...] = ("run", "lenet", *NP)) -> None:
        self.c = c
        self.runs_before = c.run_ids()
        steps = ("--max-steps", str(max_steps)) if max_steps else ()
        cmd = [sys.executable, "-m", "edgetrain", *command, "-i", c.inventory, "--epochs", str(epochs), *steps, *extra]
        self.started = time.monotonic()
        self.ended: float | None = None  # once wait() saw it end
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                     env={**os.environ, **c.env}, preexec_fn=sigint_default)
        super().__init__(self.proc)

    def __enter__(self) -> LongRun:
        return self

    def __exit__(self, *exc) -> None:
        """Whatever the test did, the run ends (Ctrl-C, as a user would) and leaves nothing."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=120)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        gone_within(self.c, LEASE + 30)

    def until(self, what: str, ready, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while not ready():
            assert self.proc.poll() is None, f"the run ended before {what}:\n{''.join(self.out)}{''.join(self.err)}"
            assert time.monotonic() < deadline, f"no {what} within {timeout:.0f} s"
            time.sleep(0.5)

    def run_id(self) -> str:
        self.until("run id", lambda: self.c.run_ids() - self.runs_before, 600)
        return self.c.new_run(self.runs_before)

    def checkpoint(self, epoch: int = 1, rid: str | None = None) -> str:
        rid = rid or self.run_id()
        self.until(f"checkpoint {epoch}", lambda: f"epoch-{epoch:04d}" in self.c.node_ls("node1", f"{self.c.home}/runs/{rid}/checkpoints"), 600)
        return rid

    def wait(self, timeout: float = 180) -> tuple[int, float, str]:
        start = time.monotonic()
        try:
            code = self.proc.wait(timeout=timeout)
            self.ended = time.monotonic()
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
        time.sleep(0.5)  # the readers catch up
        return code, time.monotonic() - start, "".join(self.err)


def saved(c: Cluster, rid: str) -> int:
    return max(int(n.split("-")[1]) for n in c.node_ls("node1", f"{c.home}/runs/{rid}/checkpoints") if n.startswith("epoch-"))


def resume_completes(c: Cluster, rid: str) -> int:
    """Resume one epoch past the newest checkpoint; returns the epoch it resumed from."""
    done = saved(c, rid)
    r = edgetrain("run", "lenet", *NP, "-i", c.inventory, "--epochs", str(done + 1), "--max-steps", str(STEPS), "--resume", rid,
                  env=c.env, timeout=900)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    info = c.run_json(rid)
    assert info["status"] == "completed" and info["attempts"][-1]["resumed_from_epoch"] == done
    return done


def gone_within(c: Cluster, seconds: float) -> float:
    """Seconds until no edgetrain container is left on any node."""
    start = time.monotonic()
    while c.leftovers():
        assert time.monotonic() - start < seconds, f"containers left: {c.leftovers()}"
        time.sleep(1)
    return time.monotonic() - start
