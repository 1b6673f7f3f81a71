"""A seeded storm of faults over one long run on the testbed's container cluster, as a real
cluster meets them one after another: a worker's container killed, a worker's link cut and
restored, a node's CPU quota cut to a quarter for a minute, the rank-0 node's disk filled then
freed, the controller killed. The run has --max-restarts and --rejoin, so a lost worker (its
container or its link) is left out and taken back by the run itself; where a fault ends the run
(the disk, the controller), the storm does what a user would: runs the command its last line (or
``runs show``) gives. A node's CPU cut to a quarter (of its quota, or of its share of the machine)
ends nothing: it is slowness, to be lived with.

The schedule - which faults, on which node, after how much training since the last one was over -
is drawn from the seed. After the run: it completed; every checkpoint verifies against its
manifest; no epoch trained twice but the one in progress at each fault; no container, lease,
process or namespace of the storm's left; ``runs show`` lists every attempt with what ended it;
with ``compare``, the held-out accuracy within 0.5 points of the same seed's undisturbed run.

    sudo .venv/bin/python -m lab storm ID -i INVENTORY --seed 7 --minutes 30 --faults 10 --compare

ID is a testbed provisioned as a container cluster with its images distributed (tests/cluster's
`cluster` fixture; EDGETRAIN_TESTBED_KEEP=1 keeps one), INVENTORY its docker inventory with one
slot a node and a short lease (as tests/cluster/long_run.py's fault inventory).
"""

from __future__ import annotations

import contextlib
import enum
import json
import os
import pwd
import random
import re
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from edgetrain.controller import containers, preflight, remote
from edgetrain.shared import runs
from edgetrain.shared.layout import RunLayout

from .console import TimedOutput
from .emulation import machine_cores
from .testbed import Node, Testbed, run

ROOT = Path(__file__).resolve().parents[1]
EPOCH_LINE = re.compile(r"^epoch (\d+)/\d+:", re.M)
RESUME = re.compile(r"(?:resume with|continue it with): (edgetrain .*--resume \S+.*)$")
QUARTER_S = 60.0  # how long a node's CPU stays cut to a quarter
NOTICE_S = 180.0  # a fault that ends the run or an attempt must be noticed within this
BACK_S = 420.0  # and training must be back within this after it
TRAINING = 0.6  # of a storm's minutes, what its run trains undisturbed; the faults' recoveries take the rest


class Kind(enum.Enum):
    CONTAINER = "worker container killed"
    LINK = "worker link cut"
    CPU = "CPU cut to a quarter"
    DISK = "rank-0 disk full"
    CONTROLLER = "controller killed"


# ---- the draw, and what is judged from what ran: pure ------------------------------------------

@dataclass(frozen=True)
class Planned:
    kind: Kind
    node: str
    after_s: float  # seconds of training after the previous fault was over (or the run began)
    hold_s: float  # a link cut: how long it stays down after the restart began


def draw(seed: int, faults: int, minutes: float, head: str, workers: list[str]) -> list[Planned]:
    """``faults`` faults, every kind once before any twice (in an order drawn from the seed), each
    after a random stretch of training: the stretches share 35% of the storm's ``minutes``, of
    which the run trains 60% (``TRAINING``), so the last fault comes well before its end, the
    recoveries' training included."""
    rng = random.Random(seed)
    kinds: list[Kind] = []
    while len(kinds) < faults:
        kinds += rng.sample(list(Kind), len(Kind))
    gap = minutes * 60 * 0.35 / (faults + 1)
    planned = []
    for kind in kinds[:faults]:
        node = head if kind is Kind.DISK else rng.choice(workers) if kind in (Kind.CONTAINER, Kind.LINK) else \
            rng.choice([head, *workers]) if kind is Kind.CPU else head
        planned.append(Planned(kind, node, round(rng.uniform(0.5, 1.5) * gap, 1), round(rng.uniform(5, 30), 1)))
    return planned


def retrained(metrics: list[dict], attempts: list[dict]) -> list[str]:
    """What was trained twice beyond the epoch in progress at each end of an attempt: an epoch
    recorded twice must be the one after a resume's checkpoint (its checkpoint was not yet
    written when the attempt ended), and at most one such per attempt that ended."""
    seen = Counter(int(m["epoch"]) for m in metrics)
    again = sorted(e for e, n in seen.items() if n > 1)
    resumed_after = Counter(a["resumed_from_epoch"] + 1 for a in attempts if a.get("resumed_from_epoch") is not None)
    problems = [f"epoch {e} trained {seen[e]} times" for e in again if seen[e] - 1 > resumed_after[e]]
    if len(again) > len(attempts) - 1:
        problems.append(f"{len(again)} epochs trained twice over {len(attempts) - 1} ends of an attempt: {again}")
    return problems


def progress_at(epochs: list[tuple[float, int]], at: float, epoch_s: float) -> float:
    """How far training had got at ``at``: the epochs done, and the part of the next one that a
    typical epoch's time since the last one ended stands for."""
    done = [(t, e) for t, e in epochs if t <= at]
    if not done:
        return 0.0
    t, e = done[-1]
    return e + min(1.0, (at - t) / epoch_s)


def time_lost(epochs: list[tuple[float, int]], at: float, back: float, epoch_s: float) -> float:
    """Seconds a fault cost: from it until training was past where it was, less what that
    progress takes undisturbed (``epochs``: each epoch line's time and number)."""
    after = next((e for t, e in epochs if t >= back), None)
    if after is None:
        return back - at
    reached = next(t for t, e in epochs if t >= back)
    return (reached - at) - epoch_s * (after - progress_at(epochs, at, epoch_s))


# ---- the storm on a testbed ---------------------------------------------------------------------

@dataclass
class Injected:
    planned: Planned
    at: float  # monotonic
    noticed: float | None = None  # the run said so, or ended
    settled: float | None = None  # what the fault brought is over: the run resumed, the node taken back, the CPU given back
    back: float | None = None  # training again: its next epoch line after recovery
    how: str = ""  # what the run said, or what the storm did about it
    lost_s: float | None = None


@dataclass
class Storm:
    """One run through a seeded schedule of faults, driven as a user would drive it."""

    bed: Testbed
    inventory: str
    env: dict[str, str]  # the controller's: EDGETRAIN_RUNS at least
    node_runs: str  # the runs directory on the nodes (the inventory's edgetrain_runs_dir, absolute)
    args: tuple[str, ...]  # edgetrain run's arguments but the inventory
    log: Callable[[str], None] = print
    consoles: list[TimedOutput] = field(default_factory=list)
    procs: list[subprocess.Popen] = field(default_factory=list)
    injected: list[Injected] = field(default_factory=list)
    rid: str = ""
    head_bytes: int = 0  # the head's runs directory for the storm: preflight's minimum and every checkpoint, with room to spare

    # -- the run's processes

    def start(self, argv: list[str]) -> None:
        proc = subprocess.Popen([sys.executable, "-m", "edgetrain", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                cwd=ROOT, env={**os.environ, **self.env}, start_new_session=True)
        self.procs.append(proc)
        self.consoles.append(TimedOutput(proc))

    @property
    def proc(self) -> subprocess.Popen:
        return self.procs[-1]

    @property
    def said(self) -> TimedOutput:
        return self.consoles[-1]

    def epochs(self) -> list[tuple[float, int]]:
        """Every epoch line of every process of the run, timed."""
        return sorted((t, int(m.group(1))) for c in self.consoles for t, line in list(c.timed) if (m := EPOCH_LINE.match(line)))

    def epoch_after(self, since: float, timeout: float = BACK_S) -> float:
        """When the run next finished an epoch after ``since`` (it must not end first)."""
        deadline = time.monotonic() + timeout
        while (t := next((t for t, _ in self.epochs() if t > since), None)) is None:
            if self.proc.poll() is not None:
                raise StormError(f"the run ended ({self.proc.returncode}) before training again: {self.tail()}")
            if time.monotonic() > deadline:
                raise StormError(f"no epoch within {timeout:.0f} s of {since - self.epochs_origin():.0f} s: {self.tail()}")
            time.sleep(0.5)
        return t

    def epochs_origin(self) -> float:
        return self.consoles[0].timed[0][0] if self.consoles and self.consoles[0].timed else 0.0

    def tail(self) -> str:
        return "".join(self.said.out[-5:] + self.said.err[-10:])[-2000:]

    def ended(self, timeout: float = NOTICE_S) -> tuple[int, str]:
        """The run's exit code and last line, once it ends of itself."""
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            raise StormError(f"the run did not end within {timeout:.0f} s of the fault: {self.tail()}") from None
        self.said.caught_up()
        lines = "".join(self.said.err).strip().splitlines()
        return code, lines[-1] if lines else ""

    def resume_as_user(self, line: str) -> str:
        """Run the command a line of edgetrain's gives to go on (``... resume with: edgetrain run ...``)."""
        m = RESUME.search(line)
        if m is None:
            raise StormError(f"no resume command in: {line}")
        argv = shlex.split(m.group(1))[1:]
        self.start(argv)
        return shlex.join(argv)

    # -- the faults

    def node(self, name: str) -> Node:
        return next(n for n in self.bed.state.nodes if n.name == name)

    def inject(self, planned: Planned) -> Injected:
        done = Injected(planned, time.monotonic())
        self.injected.append(done)
        {Kind.CONTAINER: self._container, Kind.LINK: self._link, Kind.CPU: self._cpu, Kind.DISK: self._disk,
         Kind.CONTROLLER: self._controller}[planned.kind](done)
        done.back = self.epoch_after(done.settled or done.at)
        return done

    def _container(self, done: Injected) -> None:
        run(*self.node(done.planned.node).docker_cli, "kill", f"edgetrain-{self.rid}")
        self._left_out_then_back(done, "the kill")

    def _link(self, done: Injected) -> None:
        n = self.node(done.planned.node)
        run("ip", "link", "set", n.veth, "down")
        try:
            self._left_out(done, "the cut")
            time.sleep(done.planned.hold_s)
        finally:
            run("ip", "link", "set", n.veth, "up")
            self.bed.wait_ssh(n, timeout=60)
        done.how += f"; link down {done.planned.hold_s:.0f} s more"
        self._taken_back(done, "the cut")

    def _left_out_then_back(self, done: Injected, cause: str) -> None:
        self._left_out(done, cause)
        self._taken_back(done, cause)

    def _left_out(self, done: Injected, cause: str) -> None:
        """Under --max-restarts a lost worker (its container gone, its link dark) is left out: the
        run restarts on the nodes left."""
        name = done.planned.node
        restart = f"restarting on {', '.join(x.name for x in self.bed.state.nodes if x.name != name)}"
        deadline = time.monotonic() + NOTICE_S
        while (said := self.said.said(restart, since=done.at)) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise StormError(f"no restart without {name} within {NOTICE_S:.0f} s of {cause}: {self.tail()}")
            time.sleep(0.5)
        done.noticed = min(said, self.said.said(f"edgetrain: {name}:", since=done.at) or said)
        done.how = f"restarted without {name} {said - done.at:.0f} s after {cause}"

    def _taken_back(self, done: Injected, cause: str) -> None:
        """With --rejoin the node is taken back once it answers and its old container has ended."""
        name = done.planned.node
        deadline = time.monotonic() + BACK_S
        while (back := self.said.said(f"{name} answers again", since=done.at)) is None:
            if self.proc.poll() is not None or time.monotonic() > deadline:
                raise StormError(f"{name} was not taken back within {BACK_S:.0f} s: {self.tail()}")
            time.sleep(0.5)
        done.how += f"; taken back {back - done.at:.0f} s after {cause}"
        done.settled = back

    def _cpu(self, done: Injected) -> None:
        group = self.node(done.planned.node).cgroup
        quota, period = group.quota()
        # A node without a quota of its own has its share of the machine: a quarter of that.
        quarter = (quota if quota > 0 else int(machine_cores() * period / len(self.bed.state.nodes))) // 4
        group.limit(quarter, period)
        try:
            deadline = done.at + QUARTER_S
            while time.monotonic() < deadline:
                if self.proc.poll() is not None:
                    raise StormError(f"the run ended while {done.planned.node}'s CPU was cut: {self.tail()}")
                time.sleep(0.5)
        finally:
            group.limit(quota, period) if quota > 0 else group.unlimit()
        done.how = f"{quarter / period:.2f} cores for {QUARTER_S:.0f} s, then {'its quota' if quota > 0 else 'unlimited'} again"
        done.settled = time.monotonic()

    def _disk(self, done: Injected) -> None:
        mount = self.mount_ns()
        free = int(run(*mount, "df", "-B1", "--output=avail", self.node_runs).stdout.split()[-1])
        filler = f"{self.node_runs}/filler"
        # 10 MB short of full: the next checkpoint (about 19 MB) cannot be written.
        run(*mount, "sh", "-c", f"head -c {max(0, free - 10 * 1024**2)} /dev/zero > {filler}", check=False)
        try:
            code, last = self.ended()
        finally:
            run(*mount, "rm", "-f", filler)
        done.noticed = self.said.said("edgetrain: error:") or time.monotonic()
        expect = f"the disk of its run directory on {done.planned.node} is full"
        if code != 1 or expect not in last:
            raise StormError(f"rank-0 disk full: exit {code}, expected {expect!r} in: {last}")
        done.how = f"the run ended naming it; the filler removed; resumed: {self.resume_as_user(last)}"
        done.settled = time.monotonic()

    def _controller(self, done: Injected) -> None:
        self.proc.kill()  # SIGKILL: the laptop is gone, nothing of edgetrain's runs
        self.proc.wait()
        done.noticed = time.monotonic()
        shown = subprocess.run([sys.executable, "-m", "edgetrain", "runs", "show", self.rid], capture_output=True, text=True,
                               cwd=ROOT, env={**os.environ, **self.env}, timeout=120, check=False)
        line = next((x for x in shown.stdout.splitlines() if "continue it with:" in x), "")
        if "status abandoned" not in shown.stdout or not line:
            raise StormError(f"runs show after the controller was killed: {shown.stdout[-1000:]}{shown.stderr[-500:]}")
        done.how = f"runs show said abandoned; resumed: {self.resume_as_user(line)}"
        done.settled = time.monotonic()

    def mount_ns(self) -> list[str]:
        return ["nsenter", "-t", str(self.bed.state.head.sshd_pid), "--mount"]

    @contextlib.contextmanager
    def head_disk(self) -> Iterator[None]:
        """The head's runs directory a file system of its own for the storm (so that filling it
        fills no real disk): room for preflight's minimum beside every checkpoint of the run, so that
        each resume passes preflight."""
        mount, user = self.mount_ns(), pwd.getpwnam(self.bed.state.login_user)
        run(*mount, "runuser", "-u", user.pw_name, "--", "mkdir", "-p", self.node_runs)
        run(*mount, "mount", "-t", "tmpfs", "-o", f"size={self.head_bytes},mode=0700,uid={user.pw_uid},gid={user.pw_gid}", "tmpfs", self.node_runs)
        try:
            yield
        finally:
            run(*mount, "umount", self.node_runs, check=False)

    # -- after

    def verified_checkpoints(self) -> tuple[int, list[str]]:
        """Every checkpoint of the run on the head, checked against its manifest there."""
        code = ("import sys; from pathlib import Path; from edgetrain.shared import checkpoints as c\n"
                "found = c.all_in(Path(sys.argv[1]), print)\n"
                "for k in found:\n    c.verify(k)\n"
                "print(len(found))")
        r = run(*self.mount_ns(), sys.executable, "-c", code, str(runs.Run(Path(self.node_runs) / self.rid).checkpoints), check=False,
                cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": os.environ.get("PATH", "")})
        lines = r.stdout.strip().splitlines()
        if r.returncode != 0 or not lines or not lines[-1].isdigit():
            return 0, [f"checkpoints: {(r.stdout + r.stderr).strip()[-600:]}"]
        return int(lines[-1]), [f"checkpoint: {x}" for x in lines[:-1]]


    def leftovers(self) -> list[str]:
        """Containers of the run and its leases on any node."""
        found = []
        for n in self.bed.state.nodes:
            names = run(*n.docker_cli, "ps", "--all", "--filter", f"label={containers.LABEL}", "--format", "{{.Names}}").stdout.split()
            found += [f"{n.name}: container {name}" for name in names]
            lease = str(RunLayout.posix(f"{self.node_runs}/{self.rid}").lease)
            if self.bed.ssh(n, f"test -e {lease}", check=False).returncode == 0:
                found.append(f"{n.name}: lease {lease}")
        return found

    def epoch_seconds(self) -> float:
        """A typical epoch's time: the median between consecutive epoch lines no fault fell between."""
        spans = [(a[0], b[0]) for a, b in zip(self.epochs(), self.epochs()[1:], strict=False) if b[1] == a[1] + 1]
        calm = [b - a for a, b in spans if not any(a <= f.at <= b or (f.back and a <= f.back <= b) for f in self.injected)]
        return statistics.median(calm or [b - a for a, b in spans] or [1.0])


class StormError(Exception):
    """The storm could not go on: what the run did instead of what a fault should bring."""


@dataclass
class Outcome:
    rid: str
    injected: list[Injected]
    problems: list[str]
    lines: list[str]
    figures: dict = field(default_factory=dict)  # what the report's lines say, as numbers: the kept JSON


def figures(storm: Storm, plan: list[Planned], seed: int, minutes: float, epochs: int, took_s: float,
            found: dict, compared: dict | None) -> dict:
    """The storm's record for docs/benches/storm/: its schedule, each fault's figures, the checks."""
    origin = storm.epochs_origin()
    return {"seed": seed, "minutes": minutes, "epochs": epochs, "epoch_seconds": round(storm.epoch_seconds(), 2),
            "args": list(storm.args), "run": storm.rid, "planned": len(plan), "took_seconds": round(took_s, 1),
            "faults": [{"kind": f.planned.kind.name.lower(), "what": f.planned.kind.value, "node": f.planned.node,
                        "at_seconds": round(f.at - origin, 1),
                        "noticed_seconds": None if f.noticed is None or f.planned.kind is Kind.CPU else round(f.noticed - f.at, 1),
                        "back_seconds": None if f.back is None else round(f.back - f.at, 1),
                        "over_seconds": None if f.settled is None else round(f.settled - f.at, 1),
                        "lost_seconds": None if f.lost_s is None else round(f.lost_s, 1), "how": f.how} for f in storm.injected],
            "survived": sum(f.back is not None for f in storm.injected),
            "lost_seconds": round(sum(f.lost_s or 0 for f in storm.injected), 1), **found, "compared": compared}


def ride(storm: Storm, plan: list[Planned]) -> None:
    """Start the run, inject each fault once its stretch of training has passed, and see the run
    through to its end, which must be success."""
    storm.start(["run", "lenet", "-i", storm.inventory, *storm.args])
    first = storm.epoch_after(0.0, timeout=600)
    storm.rid = next(m.group(1) for line in storm.consoles[0].out if (m := re.match(r"run (\S+): logs", line)))
    over = first
    for k, planned in enumerate(plan, 1):
        while time.monotonic() < over + planned.after_s:
            if storm.proc.poll() is not None:
                raise StormError(f"the run ended before fault {k} of {len(plan)}: give it more --epochs")
            time.sleep(0.5)
        done = storm.inject(planned)
        over = done.back or time.monotonic()
        storm.log(f"fault {k}/{len(plan)}: {planned.kind.value} on {planned.node} at {done.at - first:.0f} s: {done.how}; "
                  f"training again {over - done.at:.0f} s after")
    code = storm.proc.wait(timeout=3600)
    storm.said.caught_up()
    if code != 0:
        raise StormError(f"the run ended with {code} after the last fault: {storm.tail()}")


def judged(storm: Storm, runs_dir: Path) -> tuple[list[str], list[str], dict]:
    """The checks after the storm: (problems, what was found, and as figures)."""
    r = runs.Run(runs_dir / storm.rid)
    record = json.loads(r.info_file.read_text())
    problems, found = [], []
    if record["status"] != "completed":
        problems.append(f"run {storm.rid} is {record['status']}")
    verified, bad = storm.verified_checkpoints()
    problems += bad
    problems += retrained(r.metrics(), record["attempts"])
    again = sorted(e for e, n in Counter(int(m["epoch"]) for m in r.metrics()).items() if n > 1)
    found.append(f"{verified} checkpoints verified against their manifests; epochs trained twice: "
                 f"{', '.join(map(str, again)) or 'none'} (each the one in progress when its attempt ended)")
    problems += ended_as_faulted(storm, record["attempts"])
    return problems, found, {"status": record["status"], "attempts": len(record["attempts"]), "checkpoints_verified": verified,
                             "epochs_trained_twice": again}


def ended_as_faulted(storm: Storm, attempts: list[dict]) -> list[str]:
    """`runs show` lists every attempt, each with what ended it: the faults', in order, then success."""
    expect: list[str] = []
    for f in storm.injected:
        node = f.planned.node
        expect += {Kind.CONTAINER: [f"{node} lost", f"take back {node}"], Kind.LINK: [f"{node} lost", f"take back {node}"], Kind.CPU: [],
                   Kind.DISK: ["disk is full"], Kind.CONTROLLER: ["abandoned"]}[f.planned.kind]
    expect.append("completed")
    shown = subprocess.run([sys.executable, "-m", "edgetrain", "runs", "show", storm.rid], capture_output=True, text=True, cwd=ROOT,
                           env={**os.environ, **storm.env, "COLUMNS": "400"}, timeout=120, check=False).stdout
    lines = [line for line in shown.splitlines() if re.match(r"attempt \d+ \(", line)]
    problems = []
    if len(lines) != len(attempts) or len(attempts) != len(expect):
        problems.append(f"{len(attempts)} attempts recorded, {len(lines)} listed by runs show, {len(expect)} expected from the faults")
    for k, (line, want) in enumerate(zip(lines, expect, strict=False), 1):
        if "ended: " not in line or want not in line.split("ended: ", 1)[1]:
            problems.append(f"attempt {k}: expected its end to say {want!r}: {line}")
    return problems


def lost_and_left(storm: Storm, before: dict[str, set[int]], namespaces: str) -> list[str]:
    """Containers and leases of the run (their leases given time to run out), the storm's
    processes, processes new on the nodes, namespaces: none may be left."""
    deadline = time.monotonic() + LEASE_WAIT
    while (left := storm.leftovers()) and time.monotonic() < deadline:
        time.sleep(2)
    problems = [f"left: {x}" for x in left]
    problems += [f"left: edgetrain pid {p.pid} still running" for p in storm.procs if p.poll() is None]
    # A killed controller's ssh connections end remote.CONTROL_PERSIST seconds after their last use.
    deadline = time.monotonic() + remote.CONTROL_PERSIST + 30
    while (new := _new_processes(storm, before)) and time.monotonic() < deadline:
        time.sleep(2)
    problems += [f"left: {node}: process {pid} {_comm(pid)}" for node, pid in new]
    if run("ip", "netns", "list").stdout != namespaces:
        problems.append("left: network namespaces differ from before the storm")
    return problems


LEASE_WAIT = 90.0  # a lost controller's containers end within the inventory's lease (30 s in the faults' inventory)


def _new_processes(storm: Storm, before: dict[str, set[int]]) -> list[tuple[str, int]]:
    return [(n.name, pid) for n in storm.bed.state.nodes for pid in sorted(n.cgroup.pids() - before[n.name])]


def _comm(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")[:200]
    except OSError:
        return "(ended)"


def table(storm: Storm) -> list[str]:
    """A line a fault: when, what, where, when noticed, when training was back, the time it cost."""
    origin, epoch_s = storm.epochs_origin(), storm.epoch_seconds()
    lines = [f"{'at s':>6}  {'fault':<26} {'node':<6} {'noticed s':>9} {'back s':>7} {'lost s':>7}  what happened"]
    for f in storm.injected:
        f.lost_s = time_lost(storm.epochs(), f.at, f.back or f.at, epoch_s)
        noticed = f"{f.noticed - f.at:9.0f}" if f.noticed and f.planned.kind is not Kind.CPU else f"{'-':>9}"
        lines.append(f"{f.at - origin:6.0f}  {f.planned.kind.value:<26} {f.planned.node:<6} {noticed} "
                     f"{(f.back or f.at) - f.at:7.0f} {f.lost_s:7.0f}  {f.how}")
    return lines


def paced(bed: Testbed, inventory: str, env: dict[str, str], node_runs: str, recipe: tuple[str, ...]) -> tuple[float, int]:
    """What an epoch of ``recipe`` takes on the cluster: its seconds (a short run's last two
    epochs) and its checkpoint's bytes on the head."""
    probe = Storm(bed, inventory, env, node_runs, ())
    probe.start(["run", "lenet", "-i", inventory, *recipe, "--epochs", "3"])
    if probe.proc.wait(timeout=900) != 0:
        raise StormError(f"the pace run failed: {probe.tail()}")
    probe.said.caught_up()
    times = [t for t, _ in probe.epochs()]
    rid = next(m.group(1) for line in probe.said.out if (m := re.match(r"run (\S+): logs", line)))
    held = run(*probe.mount_ns(), "du", "-sb", str(runs.Run(Path(node_runs) / rid).checkpoints)).stdout.split()[0]
    return (times[-1] - times[0]) / (len(times) - 1), int(held) // len(times)


def storm(bed: Testbed, inventory: str, env: dict[str, str], runs_dir: Path, node_runs: str, seed: int, minutes: float,
          faults: int, max_steps: int | None, compare: bool = False, log: Callable[[str], None] = print) -> Outcome:
    """The seed's storm of about ``minutes`` over one run: its checks, and the lines that report it."""
    nodes = [n.name for n in bed.state.nodes]
    plan = draw(seed, faults, minutes, nodes[0], nodes[1:])
    restarts = sum(p.kind in (Kind.LINK, Kind.CONTAINER) for p in plan)
    recipe: tuple[str, ...] = ("--np", str(len(nodes)), *(("--max-steps", str(max_steps)) if max_steps else ()), "--seed", str(seed),
                               "--holdout", "6000")
    epoch_s, checkpoint = paced(bed, inventory, env, node_runs, recipe)
    epochs = max(4, round(TRAINING * minutes * 60 / epoch_s))
    recipe += ("--epochs", str(epochs))
    log(f"an epoch takes {epoch_s:.1f} s and {checkpoint / 1e6:.0f} MB of checkpoint: {epochs} epochs, about {TRAINING * minutes:g} min of training undisturbed")
    st = Storm(bed, inventory, env, node_runs, (*recipe, "--max-restarts", str(restarts + 1), "--rejoin"), log=log,
               head_bytes=preflight.MIN_FREE_DISK + epochs * checkpoint * 5 // 4 + 64 * 1024**2)
    log(f"storm seed {seed}: " + "; ".join(f"{p.kind.value} on {p.node} after {p.after_s:.0f} s" for p in plan))
    before = {n.name: n.cgroup.pids() for n in bed.state.nodes}
    namespaces = run("ip", "netns", "list").stdout
    problems: list[str] = []
    found: list[str] = []
    checked: dict = {}
    started = time.monotonic()
    with st.head_disk():
        try:
            ride(st, plan)
        except StormError as exc:
            problems.append(str(exc))
        finally:
            for p in st.procs:
                if p.poll() is None:
                    p.send_signal(signal.SIGINT)
                    p.wait(timeout=120)
        if st.rid and not problems:
            more, found, checked = judged(st, runs_dir)
            problems += more
        problems += lost_and_left(st, before, namespaces)  # the head's lease is on the storm's file system
    took = time.monotonic() - started
    lines = [*table(st), f"{len(st.injected)} of {len(plan)} faults injected over {took / 60:.1f} min, "
             f"{sum(f.back is not None for f in st.injected)} survived (training went on), "
             f"{sum(f.lost_s or 0 for f in st.injected):.0f} s lost in all; run {st.rid} "
             + ("completed" if not problems else "with problems"), *found]
    accuracy = None
    if compare and st.rid and not problems:
        line, accuracy = compared(st, runs_dir, recipe)
        lines.append(line)
        if "differs" in line:
            problems.append(line)
    lines.append("lost: nothing" if not problems else f"problems: {len(problems)}")
    for line in lines:
        log(line)
    return Outcome(st.rid, st.injected, problems, lines,
                   {**figures(st, plan, seed, minutes, epochs, took, checked, accuracy), "problems": problems})


def compared(st: Storm, runs_dir: Path, recipe: tuple[str, ...]) -> tuple[str, dict | None]:
    """The same seed's run, undisturbed: its held-out test accuracy against the storm's (a line,
    and its figures)."""
    calm = subprocess.run([sys.executable, "-m", "edgetrain", "run", "lenet", "-i", st.inventory, *recipe], capture_output=True,
                          text=True, cwd=ROOT, env={**os.environ, **st.env}, timeout=7200, check=False)
    m = re.search(r"run (\S+) completed", calm.stdout)
    if calm.returncode != 0 or m is None:
        return f"the undisturbed run differs: it failed: {(calm.stdout + calm.stderr)[-500:]}", None
    stormy, quiet = (runs.Run(runs_dir / rid).test_score() for rid in (st.rid, m.group(1)))
    if stormy is None or quiet is None:
        return "the undisturbed run differs: no test accuracy recorded", None
    diff = 100 * (stormy["test_accuracy"] - quiet["test_accuracy"])
    verdict = "within" if abs(diff) <= 0.5 else "differs: beyond"
    return (f"held-out test accuracy {stormy['test_accuracy']:.4f} after the storm, {quiet['test_accuracy']:.4f} undisturbed "
            f"(run {m.group(1)}): {diff:+.2f} points, {verdict} 0.5"), \
        {"storm_accuracy": stormy["test_accuracy"], "undisturbed_accuracy": quiet["test_accuracy"], "undisturbed_run": m.group(1),
         "difference_points": round(diff, 3)}


# docs/cli.md's table is the storm of this JSON, as docs_table writes it (lab/headline.py checks).
KEPT = ROOT / "docs" / "benches" / "storm"
REPORTED = KEPT / "seed7-10faults.json"
_TAKEN_BACK = "restarted without {node}, taken back {over:.0f} s after"
MET = {Kind.CONTAINER: _TAKEN_BACK, Kind.LINK: _TAKEN_BACK, Kind.CPU: "slower, nothing ended", Kind.DISK: "ended naming {node}; filler removed; resumed",
       Kind.CONTROLLER: "`runs show`: abandoned; its command resumed"}  # what the checks hold each kind to when the storm passed


def docs_table(record: dict) -> str:
    """A kept storm's table and what its checks found, for the docs."""
    if record["problems"]:
        raise ValueError(f"seed {record['seed']}'s storm had problems: it is no figure to report")
    rows = ["| fault (node) | noticed | training again | lost | what happened |", "|---|---|---|---|---|"]
    for f in record["faults"]:
        noticed = "-" if f["noticed_seconds"] is None else f"{f['noticed_seconds']:.0f} s"
        met = MET[Kind[f["kind"].upper()]].format(node=f["node"], over=f["over_seconds"])
        rows.append(f"| {f['what']} ({f['node']}) | {noticed} | {f['back_seconds']:.0f} s | {f['lost_seconds']:.0f} s | {met} |")
    twice = ", ".join(map(str, record["epochs_trained_twice"])) or "none"
    c = record["compared"]
    accuracy = (f" Held-out test accuracy {c['storm_accuracy']:.4f} after the storm, {c['undisturbed_accuracy']:.4f} undisturbed "
                f"({c['difference_points']:+.2f} points)." if c else "")
    return "\n".join(rows) + (
        f"\n\nSeed {record['seed']}, {len(record['faults'])} faults, {record['epochs']} epochs in {record['took_seconds'] / 60:.1f} "
        f"minutes, {record['lost_seconds']:.0f} s lost in all: the run completed over {record['attempts']} attempts; "
        f"{record['checkpoints_verified']} checkpoints verified against their manifests; epochs trained twice: {twice} (each the "
        f"one in progress when its attempt ended).{accuracy}")


def run_on(tid: str, inventory: str, seed: int, minutes: float, faults: int, max_steps: int | None, compare: bool,
           out: Path | None = None) -> int:
    """The storm on a recorded testbed; with ``out``, its figures kept there as JSON."""
    import yaml

    bed = Testbed.load(tid)
    runs_dir = Path(bed.state.dir) / "storm-runs"
    runs_dir.mkdir(exist_ok=True)
    relative = yaml.safe_load(Path(inventory).read_text())["all"]["vars"].get("edgetrain_runs_dir", "edgetrain/runs")
    node_runs = relative if relative.startswith("/") else f"{bed.state.login_home}/{relative}"
    outcome = storm(bed, inventory, {"EDGETRAIN_RUNS": str(runs_dir), "COLUMNS": "250"}, runs_dir, node_runs, seed, minutes, faults,
                    max_steps, compare)
    if out is not None:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps(outcome.figures, indent=1) + "\n")
        print(f"kept: {out}")
    for problem in outcome.problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if outcome.problems else 0
