"""Two users, one cluster: Slurm (roles/slurm, configured by the session's site.yml) queues their
container runs on the testbed.

The testbed runs Slurm's daemons itself (no systemd in its nodes): one munged for every node, as
they share this machine's file system, slurmctld in node1 and a slurmd in each node. Both users
submit from node1, as people logged in to a cluster's head do: root, and the nodes' login user
(not root). Each job is `edgetrain run` on three whole nodes (partition OverSubscribe=EXCLUSIVE):
Slurm gives no core of a node to a second job while the first holds it, so the second waits. What
this proves here is Slurm's allocation - the nodes' CPUs are quotas on this machine's two cores,
which every node shares whoever holds it.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
from datetime import datetime

import pytest

from lab import slurm_burst

from .conftest import Cluster

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]

STEPS = ["--epochs", "1", "--max-steps", "30"]


class Users:
    """The two users and what each submits with: its inventory, runs directory and environment."""

    def __init__(self, cluster: Cluster):
        self.c = cluster
        bed = cluster.bed.state
        self.login = bed.login_user
        self.inventory = cluster.docker_inventory("slurm.yml", head_slots=1)
        # The login user's own copy of the nodes' key and an inventory naming it: a user's job
        # reaches the nodes with that user's credentials.
        self.login_inventory = slurm_burst.user_inventory(cluster.bed, self.inventory, self.login)
        self.runs = {"root": cluster.runs, self.login: slurm_burst.runs_dir(cluster.bed, self.login)}

    def on_head(self, user: str, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """`edgetrain ARGS` as ``user`` in a login shell on node1, the cluster's head."""
        inv = self.inventory if user == "root" else self.login_inventory
        args = tuple(inv if a == "INVENTORY" else a for a in args)
        return slurm_burst.edgetrain_as(self.c.bed, user, self.runs[user], *args, timeout=timeout)

    def submit(self, user: str, *args: str) -> tuple[str, str]:
        r = self.on_head(user, "submit", *args)
        assert r.returncode == 0, r.stdout + r.stderr
        m = slurm_burst.SUBMITTED.search(r.stdout)
        assert m, r.stdout
        return m.group(1), m.group(2)


def scontrol_job(bed, job: str) -> dict[str, str]:
    return slurm_burst.slurm_jobs(bed, job)[job]


def wait_for(what: str, predicate, timeout: float = 600, every: float = 1.0):
    deadline = time.monotonic() + timeout
    while True:
        found = predicate()
        if found:
            return found
        assert time.monotonic() < deadline, f"not within {timeout:.0f} s: {what}"
        time.sleep(every)


def state(bed, job: str) -> str:
    return scontrol_job(bed, job)["JobState"]


@pytest.fixture(scope="module")
def users(cluster) -> Users:
    cluster.bed.slurm_up()
    return Users(cluster)


def test_doctor_shows_the_schedulers_view(users):
    r = users.on_head("root", "doctor", "-i", "INVENTORY")
    assert r.returncode == 0, r.stdout + r.stderr
    for node in ("node1", "node2", "node3"):
        assert any(line.split()[:3] == [node, "idle", "ok"] for line in r.stdout.splitlines()), r.stdout


def test_two_users_queue_and_neither_shares_a_node(users, report):
    c = users.c
    first, first_job = users.submit("root", "lenet", "--np", "3", "-i", "INVENTORY", *STEPS)
    wait_for("the first job runs", lambda: state(c.bed, first_job) == "RUNNING")
    second, second_job = users.submit(users.login, "lenet", "--np", "3", "-i", "INVENTORY", *STEPS)
    time.sleep(3)  # a scheduling pass (sched_min_interval 2 s)
    waiting = scontrol_job(c.bed, second_job)
    assert waiting["JobState"] == "PENDING" and waiting["Reason"] == "Resources", waiting
    # Each user's list holds that user's own jobs, read from squeue --me (never another's job name).
    for user, run_id, job, state_now in (("root", first, first_job, "RUNNING"), (users.login, second, second_job, "PENDING")):
        listed = users.on_head(user, "runs", "list", "--json")
        assert listed.returncode == 0 and listed.stderr == "", listed.stderr
        queue = json.loads(listed.stdout)["slurm"]
        assert [(j["run_id"], j["job_id"], j["state"], j["user"]) for j in queue] == [(run_id, job, state_now, user)], queue
    table = users.on_head(users.login, "runs", "list")
    assert re.search(rf"{second}\s+{second_job}\s+pending\s+{users.login}\s+3\s+Resources", table.stdout), table.stdout

    wait_for("both jobs end", lambda: {state(c.bed, first_job), state(c.bed, second_job)} == {"COMPLETED"}, timeout=1200, every=3)
    a, b = scontrol_job(c.bed, first_job), scontrol_job(c.bed, second_job)
    # Whole nodes each: the second ran on the same three nodes, only once the first had let them go.
    assert a["NodeList"] == b["NodeList"] == "node[1-3]" and a["OverSubscribe"] == b["OverSubscribe"] == "NO", (a, b)
    assert datetime.fromisoformat(a["EndTime"]) <= datetime.fromisoformat(b["StartTime"]), (a, b)
    report["slurm: two 3-node jobs, second waited"] = (
        f"{(datetime.fromisoformat(b['StartTime']) - datetime.fromisoformat(b['SubmitTime'])).total_seconds():.0f} s queued, "
        f"each ran {(datetime.fromisoformat(a['EndTime']) - datetime.fromisoformat(a['StartTime'])).total_seconds():.0f} s"
        f" / {(datetime.fromisoformat(b['EndTime']) - datetime.fromisoformat(b['StartTime'])).total_seconds():.0f} s")

    for user, run_id, job in (("root", first, first_job), (users.login, second, second_job)):
        record = json.loads((users.runs[user] / run_id / "run.json").read_text())
        assert record["status"] == "completed", record
        assert [(h["host"], h["ranks"]) for h in record["placement"]["hosts"]] == [("node1", 1), ("node2", 1), ("node3", 1)]
        dest = users.runs[user] / "collected"
        got = users.on_head(user, "collect", run_id, "--dest", str(dest), "-i", "INVENTORY")
        assert got.returncode == 0, got.stdout + got.stderr
        assert (dest / run_id / "metrics.jsonl").is_file() and "verified" in got.stdout, got.stdout
    assert c.leftovers() == {}


def test_a_job_larger_than_the_cluster_is_refused_at_once(users):
    c = users.c
    start = time.monotonic()
    r = users.on_head("root", "submit", "lenet", "--np", "4", "-i", "INVENTORY", *STEPS, timeout=60)
    assert r.returncode == 1 and r.stderr.strip().count("\n") == 0, r.stdout + r.stderr
    assert "--np 4 needs more ranks than the 3 slots of 3 hosts" in r.stderr, r.stderr
    # Slurm itself refuses one too large for its partition, whoever submits it (EnforcePartLimits).
    direct = subprocess.run(["sbatch", "--nodes=4", "--wrap=true"], capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", **c.bed.state.slurm_env})
    assert direct.returncode == 1 and direct.stderr.strip().count("\n") == 0, direct.stderr
    assert "Batch job submission failed" in direct.stderr, direct.stderr
    assert time.monotonic() - start < 30


@pytest.mark.parametrize("how", ["scancel", "edgetrain cancel"])
def test_cancelling_a_running_job_leaves_no_container(users, how):
    c = users.c
    run_id, job = users.submit("root", "lenet", "--np", "3", "-i", "INVENTORY", "--epochs", "20")
    record = users.runs["root"] / run_id / "run.json"
    # Training: a cancel before then ends the run in its preparation, which (as Ctrl-C does there) leaves no record.
    wait_for("the run trains", lambda: record.is_file() and json.loads(record.read_text())["status"] == "running", timeout=300)
    assert len(c.leftovers()) == 3
    if how == "scancel":
        r = subprocess.run(["scancel", job], capture_output=True, text=True, env={"PATH": "/usr/bin:/bin", **c.bed.state.slurm_env})
    else:
        r = users.on_head("root", "cancel", run_id)
        assert f"run {run_id}: Slurm job {job} signalled" in r.stdout, r.stdout
    assert r.returncode == 0, r.stdout + r.stderr
    # Within Slurm's KillWait (60 s, then SIGKILL): edgetrain's own cleanup, not the containers' leases (90 s).
    start = time.monotonic()
    wait_for("the job ends", lambda: state(c.bed, job) in ("CANCELLED", "FAILED"), timeout=90)
    wait_for("no container on any node", lambda: c.leftovers() == {}, timeout=90)
    assert time.monotonic() - start < 70, "the containers outlived the job's cleanup"
    wait_for("the run recorded interrupted", lambda: json.loads(record.read_text())["status"] == "interrupted", timeout=30)


def test_a_node_slurm_takes_away_is_a_lost_node_and_the_run_resumes_without_it(users):
    c = users.c
    run_id, job = users.submit("root", "lenet", "--np", "3", "-i", "INVENTORY", "--epochs", "3", "--max-steps", "20",
                               "--max-restarts", "1")
    out = users.runs["root"] / ".slurm-0" / f"slurm-{job}.out"  # root's own corner of the runs directory
    wait_for("the first epoch and its checkpoint", lambda: out.is_file() and "epoch 1/3" in out.read_text(), timeout=600, every=2)
    slurm = {"PATH": "/usr/bin:/bin", **c.bed.state.slurm_env}
    subprocess.run(["scontrol", "update", "nodename=node3", "state=down", "reason=taken by the test"], check=True, env=slurm)
    try:
        wait_for("the job ends", lambda: state(c.bed, job) not in ("RUNNING", "COMPLETING"), timeout=900, every=3)
    finally:
        subprocess.run(["scontrol", "update", "nodename=node3", "state=resume"], check=True, env=slurm)
    said = out.read_text()
    assert state(c.bed, job) == "COMPLETED", said[-3000:]
    assert "node3: Slurm took it from job" in said, said[-3000:]
    record = json.loads((users.runs["root"] / run_id / "run.json").read_text())
    assert record["status"] == "completed", record
    assert len(record["attempts"]) == 2 and "node3" in record["attempts"][1]["excluded"], record["attempts"]
    assert [h["host"] for h in record["placement"]["hosts"]] == ["node1", "node2"], record["placement"]
    wait_for("no container on any node", lambda: c.leftovers() == {}, timeout=120)


@pytest.mark.bench
def test_a_burst_of_twelve_jobs_from_three_users_drains_with_a_node_taken(users, report):
    """`python -m lab slurm-burst` on this cluster (EDGETRAIN_BURST_SEED, default 1): three users
    (the login user and two made for it), twelve jobs of 1-3 nodes at once, a node set down under
    a multi-node job mid-burst. Every run completes or fails naming the node, collects, and held
    its nodes alone, read from the runs' records."""
    bed = users.c.bed
    with slurm_burst.three_users(bed) as three:
        outcome = slurm_burst.burst(bed, users.inventory, three, int(os.environ.get("EDGETRAIN_BURST_SEED", "1")))
    for line in outcome.lines:
        report["slurm burst"] = line
    assert outcome.problems == [], "\n".join(outcome.problems)
    assert bed.state.users == []
    wait_for("no container on any node", lambda: users.c.leftovers() == {}, timeout=120)
