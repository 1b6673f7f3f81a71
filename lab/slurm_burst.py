"""Slurm under load: three users submit twelve short LeNet jobs of 1-3 whole nodes at once to a
provisioned testbed's Slurm, one node is set down mid-burst, and the queue drains.

What it checks, from what ran rather than from the configuration: every job completed (or, the
one on the node taken, failed naming it) and `edgetrain collect` gets each run back; no node held
two runs at once, read from each run's run.json (where each attempt ran, from when to when); each
run ran inside its Slurm allocation. What it reports: the queue's drain time (first submission to
last end) against the sum of the jobs' run times, and how the taken node's job fared.

The draw (who submits what, how many nodes, which multi-node job loses a node) comes from the seed:

    sudo .venv/bin/python -m lab slurm-burst ID -i INVENTORY --seed 1

ID is a testbed provisioned as a container cluster with its images distributed (tests/cluster's
`cluster` fixture; EDGETRAIN_TESTBED_KEEP=1 keeps one) and INVENTORY its docker inventory with one
slot a node; tests/cluster/test_slurm.py's opt-in bench does all of it in one command.
"""

from __future__ import annotations

import contextlib
import json
import pwd
import random
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import yaml

from edgetrain.controller.allocation import hostnames
from edgetrain.shared import runs

from .testbed import Testbed

ROOT = Path(__file__).resolve().parents[1]
SUBMITTED = re.compile(r"^run (\S+): Slurm job (\d+)$", re.M)
# Short runs: three epochs, so that the node is taken mid-training (after the first) with two to go.
RECIPE = ("--epochs", "3", "--max-steps", "20", "--max-restarts", "1")
ENDED = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE")


# ---- the draw, and the checks over what ran: pure ---------------------------------------------

@dataclass(frozen=True)
class Planned:
    user: int  # index into the users
    nodes: int


@dataclass(frozen=True)
class Plan:
    jobs: list[Planned]
    victim: int  # index of the multi-node job that loses a node
    pick: int  # which of its nodes (past the batch host), modulo their count


def draw(seed: int, jobs: int = 12, users: int = 3, nodes: int = 3) -> Plan:
    """Each user submits jobs/users jobs of 1..nodes nodes, interleaved at random."""
    rng = random.Random(seed)
    owners = [u for u in range(users) for _ in range(jobs // users)]
    rng.shuffle(owners)
    planned = [Planned(u, rng.randint(1, nodes)) for u in owners]
    multi = [i for i, p in enumerate(planned) if p.nodes > 1]
    if not multi:
        raise ValueError(f"seed {seed} draws no job of more than one node: no node to take mid-job")
    return Plan(planned, rng.choice(multi), rng.randrange(nodes))


@dataclass(frozen=True)
class Held:
    """A node held by one attempt of a run, from its start to the next attempt's (or the run's end)."""

    run: str
    node: str
    start: datetime
    end: datetime


def _utc(stamp: str) -> datetime:
    return datetime.strptime(stamp, "%Y-%m-%dT%H:%M:%SZ")


def held(record: dict) -> list[Held]:
    """Where and when a run's attempts ran, from its run.json. An attempt's nodes are the next
    one's plus those the next left out (at most what it had), the last one's its placement."""
    attempts, run = record["attempts"], record["id"]
    if not attempts or record.get("ended") is None or record.get("placement") is None:
        raise ValueError(f"run {run} has not ended, or never started")
    hosts = {h["host"] for h in record["placement"]["hosts"]}
    ends = [a["started"] for a in attempts[1:]] + [record["ended"]]
    out = []
    for i in range(len(attempts) - 1, -1, -1):
        out += [Held(run, node, _utc(attempts[i]["started"]), _utc(ends[i])) for node in sorted(hosts)]
        hosts = hosts | set(attempts[i].get("excluded") or {})
    return sorted(out, key=lambda h: (h.node, h.start))


def overlaps(spans: list[Held]) -> list[tuple[Held, Held]]:
    """Pairs of different runs holding one node at the same time (touching ends are no overlap:
    a run's end is written before its job ends, the next run's start after its job starts)."""
    found = []
    by_node: dict[str, list[Held]] = {}
    for h in spans:
        by_node.setdefault(h.node, []).append(h)
    for node_spans in by_node.values():
        node_spans.sort(key=lambda h: (h.start, h.end))
        latest: Held | None = None  # the span reaching furthest so far
        for h in node_spans:
            if latest is not None and h.start < latest.end and h.run != latest.run:
                found.append((latest, h))
            if latest is None or h.end > latest.end:
                latest = h
    return found


# ---- the burst on a testbed --------------------------------------------------------------------

@dataclass
class Job:
    planned: Planned
    user: str
    run: str = ""
    id: str = ""
    slurm: dict[str, str] = field(default_factory=dict)  # scontrol's record, as last seen
    nodelist: str = ""  # as first seen running

    def seconds(self, start: str, end: str) -> float:
        return (datetime.fromisoformat(self.slurm[end]) - datetime.fromisoformat(self.slurm[start])).total_seconds()


def slurm_jobs(bed: Testbed, *only: str) -> dict[str, dict[str, str]]:
    """Every job Slurm's controller holds (finished ones too, for MinJobAge: 300 s), or ``only``
    one, by id."""
    r = subprocess.run(["scontrol", "--oneliner", "show", "job", *only], capture_output=True, text=True, timeout=60, check=False,
                       env={"PATH": "/usr/bin:/bin", **bed.state.slurm_env})
    if r.returncode != 0 and "No jobs" not in r.stderr + r.stdout:
        raise RuntimeError(f"scontrol show job: {r.stderr.strip()}")
    jobs = {}
    for line in r.stdout.splitlines():
        fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
        if "JobId" in fields:
            jobs[fields["JobId"]] = fields
    return jobs


def scontrol(bed: Testbed, *args: str) -> None:
    subprocess.run(["scontrol", *args], check=True, capture_output=True, timeout=60, env={"PATH": "/usr/bin:/bin", **bed.state.slurm_env})


def edgetrain_as(bed: Testbed, user: str, runs: Path, *args: str, node=None, timeout: float = 600) -> subprocess.CompletedProcess:
    """`edgetrain ARGS` as ``user`` in a login shell on a node (the head unless told), with
    Slurm's configuration and ``runs`` as the runs directory."""
    command = (f"cd {ROOT} && export {' '.join(f'{k}={shlex.quote(v)}' for k, v in bed.state.slurm_env.items())} "
               f"EDGETRAIN_RUNS={shlex.quote(str(runs))} COLUMNS=250 && "
               f"{shlex.join([sys.executable, '-m', 'edgetrain', *args])}")
    return subprocess.run([*bed.ssh_argv(node or bed.state.head, user=user), command], capture_output=True, text=True, timeout=timeout, check=False)


def runs_dir(bed: Testbed, user: str) -> Path:
    """The user's runs directory, on the file system every node shares, private to the user."""
    path = Path(bed.state.dir) / f"runs-{user}"
    if not path.is_dir():
        path.mkdir(mode=0o700)
        subprocess.run(["chown", f"{user}:{user}", str(path)], check=True)
    return path


def user_inventory(bed: Testbed, inventory: str, user: str) -> str:
    """``inventory`` reaching the nodes with ``user``'s own copy of the key (as the login user)."""
    inv = yaml.safe_load(Path(inventory).read_text())
    inv["all"]["vars"]["ansible_ssh_private_key_file"] = bed.give_key(user)
    path = Path(inventory).with_name(f"burst-{user}.yml")
    path.write_text(yaml.safe_dump(inv, sort_keys=False))
    return str(path)


def queue_is_theirs(bed: Testbed, user: str, runs: Path, mine: set[tuple[str, str]]) -> str:
    """What is wrong with ``user``'s queue as edgetrain reads it (squeue --me, by the job ids
    submit recorded): a job not theirs, a warning; "" when it lists their own jobs only."""
    listed = edgetrain_as(bed, user, runs, "runs", "list", "--json")
    try:
        queue = {(q["user"], q["job_id"], q["run_id"]) for q in json.loads(listed.stdout)["slurm"]}
    except (ValueError, KeyError, TypeError):
        return f"{user}'s runs list is not its JSON: {(listed.stdout + listed.stderr).strip()[-200:]}"
    strange = queue - {(user, job, run) for job, run in mine}
    if listed.returncode != 0 or listed.stderr or strange:
        return f"{user}'s runs list: {sorted(strange)} not theirs; {listed.stderr.strip()[-200:]}"
    return ""


@dataclass
class Outcome:
    jobs: list[Job]
    taken: str  # the node set down
    victim: Job
    victim_outcome: str
    problems: list[str]
    lines: list[str]


def burst(bed: Testbed, inventory: str, users: list[str], seed: int, log: Callable[[str], None] = print,
          timeout: float = 2400) -> Outcome:
    """Submit the seed's jobs as ``users`` (one thread each, at once), take a node from the victim
    once it has trained an epoch, give it back once the victim has restarted or ended, wait for the
    queue to drain, then check and collect every run."""
    plan = draw(seed, users=len(users), nodes=len(bed.state.nodes))
    inventories = {u: user_inventory(bed, inventory, u) for u in users}
    dirs = {u: runs_dir(bed, u) for u in users}
    jobs = [Job(p, users[p.user]) for p in plan.jobs]
    log(f"seed {seed}: " + ", ".join(f"{j.user}:{j.planned.nodes}" for j in jobs) + f"; job {plan.victim + 1} loses a node")
    problems = submit_all(bed, jobs, users, dirs, inventories)
    victim = jobs[plan.victim]
    if problems or not victim.id:
        return Outcome(jobs, "", victim, "not submitted", problems or ["the victim was not submitted"], [])
    # Each user's view of the queue, read while the burst goes on (the watch below must not wait for it).
    listing = ThreadPoolExecutor(1)
    views = [listing.submit(queue_is_theirs, bed, u, dirs[u], {(j.id, j.run) for j in jobs if j.user == u}) for u in users]
    listing.shutdown(wait=False)
    out = dirs[victim.user] / f".slurm-{pwd.getpwnam(victim.user).pw_uid}" / f"slurm-{victim.id}.out"
    record = runs.Run(dirs[victim.user] / victim.run).info_file
    taken, fault, stuck = drain(bed, jobs, victim, out=out, record=record, pick=plan.pick, seed=seed, log=log, timeout=timeout)
    problems += stuck
    if not taken:
        problems.append(f"job {victim.id} ended before its first epoch was seen: no node was taken")
    problems += [view.result() for view in views if view.result()]
    spans, victim_outcome, found = check_runs(bed, jobs, victim, taken, out, dirs, inventories)
    problems += found
    both = overlaps(spans)
    for a, b in both:
        problems.append(f"{a.node} held by {a.run} ({a.start:%H:%M:%S}-{a.end:%H:%M:%S}) and {b.run} "
                        f"({b.start:%H:%M:%S}-{b.end:%H:%M:%S}) at once")
    lines = [*summary(jobs, len(bed.state.nodes), taken, victim, victim_outcome, len(spans), len(both)), fault]
    for line in lines:
        log(line)
    return Outcome(jobs, taken, victim, victim_outcome, problems, lines)


def submit_all(bed: Testbed, jobs: list[Job], users: list[str], dirs: dict[str, Path], inventories: dict[str, str]) -> list[str]:
    """Every user submits their jobs one after the other, the users at once (a thread each): the
    submissions refused. A job submitted gets its run and its Slurm job id."""
    problems: list[str] = []
    lock = threading.Lock()

    def submit(user: str) -> None:
        for job in (j for j in jobs if j.user == user):
            r = edgetrain_as(bed, user, dirs[user], "submit", "lenet", "--np", str(job.planned.nodes), "-i", inventories[user], *RECIPE)
            m = SUBMITTED.search(r.stdout)
            if r.returncode != 0 or m is None:
                with lock:
                    problems.append(f"{user}: submit refused: {(r.stdout + r.stderr).strip()[-300:]}")
                continue
            job.run, job.id = m.groups()

    with ThreadPoolExecutor(len(users)) as pool:
        list(pool.map(submit, users))
    return problems


def drain(bed: Testbed, jobs: list[Job], victim: Job, *, out: Path, record: Path, pick: int, seed: int,
          log: Callable[[str], None], timeout: float) -> tuple[str, str, list[str]]:
    """Watch the queue until every job has ended: set one of the victim's nodes (``pick`` of those
    past its batch host) down once its job's output ``out`` shows its first epoch, resume it once
    the victim has restarted (its ``record`` holds a second attempt) or ended. The node taken ("" if
    none), the line saying what its fault did, and the problem if the queue outlived ``timeout``."""
    taken, down_at, back_at, fault = "", None, None, ""
    problems: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        while True:
            look(bed, jobs)
            state = victim.slurm.get("JobState")
            if not taken and state == "RUNNING" and out.is_file() and "epoch 1/3" in out.read_text(errors="replace"):
                candidates = [n for n in _hostnames(victim.nodelist) if n != victim.slurm.get("BatchHost")]
                taken = candidates[pick % len(candidates)]
                scontrol(bed, "update", f"nodename={taken}", "state=down", f"reason=slurm-burst seed {seed}")
                down_at = time.monotonic()
                log(f"{taken} set down under job {victim.id} ({victim.user}, {victim.nodelist})")
            if taken and down_at is not None and back_at is None and (state in ENDED or _attempts(record) > 1):
                scontrol(bed, "update", f"nodename={taken}", "state=resume")
                back_at = time.monotonic()
                fault = (f"{taken} down for {back_at - down_at:.0f} s: job {victim.id} "
                         f"{'restarted on the nodes left' if state not in ENDED else state} by then; resumed it")
                log(fault)
            if all(j.slurm.get("JobState") in ENDED for j in jobs):
                break
            if time.monotonic() > deadline:
                problems.append(f"the queue did not drain in {timeout:.0f} s: "
                                + ", ".join(f"{j.id} {j.slurm.get('JobState')}" for j in jobs if j.slurm.get("JobState") not in ENDED))
                break
            time.sleep(2)
    finally:
        if taken and back_at is None:
            scontrol(bed, "update", f"nodename={taken}", "state=resume")
    return taken, fault, problems


def look(bed: Testbed, jobs: list[Job]) -> None:
    """Each job's record as Slurm holds it now, and its nodes as first seen running."""
    seen = slurm_jobs(bed)
    for job in jobs:
        if job.id in seen:
            job.slurm = seen[job.id]
            if job.slurm["JobState"] == "RUNNING" and not job.nodelist:
                job.nodelist = job.slurm["NodeList"]


def check_runs(bed: Testbed, jobs: list[Job], victim: Job, taken: str, out: Path, dirs: dict[str, Path],
               inventories: dict[str, str]) -> tuple[list[Held], str, list[str]]:
    """Every run against its job's end: the spans its attempts held nodes, what became of the
    victim (``out`` its job's output) and the problems found."""
    spans: list[Held] = []
    victim_outcome = ""
    problems: list[str] = []
    for job in jobs:
        path = runs.Run(dirs[job.user] / job.run).info_file
        rec = json.loads(path.read_text()) if path.is_file() else {}
        if job is victim:
            victim_outcome, problem = victims_fate(job, rec, taken, out.read_text(errors="replace") if out.is_file() else "")
            problems += [problem] if problem else []
        elif job.slurm.get("JobState") != "COMPLETED" or rec.get("status") != "completed":
            problems.append(f"job {job.id} ({job.user}) {job.slurm.get('JobState')}, run {rec.get('status')}")
        if not rec.get("ended"):
            continue
        spans += held(rec)
        problems += ran_inside_and_collected(bed, job, rec, dirs[job.user], inventories[job.user])
    return spans, victim_outcome, problems


def victims_fate(job: Job, rec: dict, taken: str, said: str) -> tuple[str, str]:
    """What became of the job a node was taken from (``rec`` its run's record, ``said`` its
    output), and the problem ("" if none): it should restart without the node or fail naming it."""
    attempts = len(rec.get("attempts", []))
    if job.slurm.get("JobState") == "COMPLETED" and attempts > 1 and taken in (rec["attempts"][1].get("excluded") or {}):
        return f"restarted without {taken} and completed ({attempts} attempts)", ""
    if job.slurm.get("JobState") == "FAILED" and taken and taken in (rec.get("error") or ""):
        return f"failed naming {taken}", ""
    outcome = f"{job.slurm.get('JobState')}, {attempts} attempt(s)"
    return outcome, (f"job {job.id} (the node taken: {taken}) neither restarted without it nor failed naming it: "
                     f"{outcome}; {said.strip()[-400:]}")


def ran_inside_and_collected(bed: Testbed, job: Job, rec: dict, home: Path, inventory: str) -> list[str]:
    """What is wrong with an ended run: nodes it ran on outside its Slurm allocation, a collect
    (into ``home``/collected) that did not verify."""
    problems: list[str] = []
    job.nodelist = job.nodelist or job.slurm.get("NodeList", "")  # ran between two looks
    allocated = set(_hostnames(job.nodelist))
    ran = {h.node for h in held(rec)}
    if not ran <= allocated:
        problems.append(f"run {job.run} ran on {sorted(ran - allocated)}, outside its allocation {job.nodelist}")
    got = edgetrain_as(bed, job.user, home, "collect", job.run, "--dest", str(home / "collected"), "-i", inventory)
    if got.returncode != 0 or "verified" not in got.stdout:
        problems.append(f"collect {job.run} ({job.user}): {(got.stdout + got.stderr).strip()[-300:]}")
    return problems


def _hostnames(nodelist: str) -> list[str]:
    return hostnames(nodelist) if nodelist else []


def _attempts(record: Path) -> int:
    try:
        return len(json.loads(record.read_text()).get("attempts", []))
    except (OSError, ValueError):
        return 0


def summary(jobs: list[Job], nodes: int, taken: str, victim: Job, victim_outcome: str, spans: int, twice: int) -> list[str]:
    """One line a job, then the drain time against the jobs' run times."""
    done = [j for j in jobs if j.slurm.get("StartTime", "Unknown") != "Unknown" and j.slurm.get("EndTime", "Unknown") != "Unknown"]
    lines = [f"{'job':>5} {'user':<10} {'nodes':>5} {'where':<12} {'queued s':>8} {'ran s':>6} state"]
    for j in jobs:
        ran = f"{j.seconds('StartTime', 'EndTime'):6.0f}" if j in done else f"{'-':>6}"
        queued = f"{j.seconds('SubmitTime', 'StartTime'):8.0f}" if j in done else f"{'-':>8}"
        lines.append(f"{j.id:>5} {j.user:<10} {j.planned.nodes:>5} {j.nodelist:<12} {queued} {ran} {j.slurm.get('JobState', '?')}")
    if not done:
        return lines
    first = min(datetime.fromisoformat(j.slurm["SubmitTime"]) for j in jobs if j.slurm)
    last = max(datetime.fromisoformat(j.slurm["EndTime"]) for j in done)
    drain = (last - first).total_seconds()
    run_sum = sum(j.seconds("StartTime", "EndTime") for j in done)
    node_sum = sum(j.seconds("StartTime", "EndTime") * j.planned.nodes for j in done)
    lines += [
        f"queue drained in {drain:.0f} s; the jobs ran {run_sum:.0f} s in all ({run_sum / drain:.2f}x the drain), "
        f"{node_sum:.0f} node-seconds: {100 * node_sum / (nodes * drain):.0f}% of {nodes} nodes over the drain",
        f"{taken or 'no node'} taken from job {victim.id} ({victim.planned.nodes} nodes): {victim_outcome}",
        f"{twice} times a node held two runs at once, in {spans} node-spans from the runs' {runs.Run.RECORD}",
    ]
    return lines


@contextlib.contextmanager
def three_users(bed: Testbed) -> Iterator[list[str]]:
    """The testbed's login user and two more made as it was, removed afterwards."""
    made = [f"{bed.state.login_user}u{k}" for k in (2, 3)]
    try:
        for name in made:
            bed.add_user(name)
        yield [bed.state.login_user, *made]
    finally:
        for name in made:
            if name in bed.state.users:
                bed.remove_user(name)


def run_on(tid: str, inventory: str, seed: int) -> int:
    """The burst on a recorded testbed."""
    bed = Testbed.load(tid)
    bed.slurm_up()
    with three_users(bed) as users:
        outcome = burst(bed, inventory, users, seed)
    for problem in outcome.problems:
        print(f"problem: {problem}", file=sys.stderr)
    return 1 if outcome.problems else 0
