"""Faults on the testbed's container cluster, as a real Pi cluster meets them: a worker's container
killed, a worker's or the head's link going dark, the controller killed, two resumes of one run, the
rank-0 node's disk full during a checkpoint; and a node slow to answer, which must not be taken
for a lost one. Each asserts how soon it is noticed, what is said,
the exit code, that no container is left on any node, and that the resume which follows completes.
The figures go to the testbed report."""

from __future__ import annotations

import contextlib
import json
import os
import pwd
import signal
import time

import pytest

from edgetrain.controller import preflight
from lab.testbed import run
from tests.conftest import ROOT, descendants, edgetrain

from .conftest import Cluster
from .long_run import LEASE, NP, STEPS, LongRun, completed, cut_link, fault_cluster, gone_within, resume_completes, saved

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]

@pytest.fixture(scope="module")
def faults(cluster) -> Cluster:
    return fault_cluster(cluster)


def test_a_killed_worker_container_ends_the_run_naming_it(faults, report):
    with LongRun(faults) as job:
        rid = job.checkpoint()
        faults.docker("node3", "kill", f"edgetrain-{rid}")
        code, detected, err = job.wait(120)
    assert code == 1 and detected < 60, err
    last = err.strip().splitlines()[-1]
    assert "rank 2 on node3" in last and f"-i {faults.inventory}" in last and f"--resume {rid}" in last, last
    assert faults.leftovers() == {}
    resumed = resume_completes(faults, rid)
    report["fault: worker container killed"] = f"detected in {detected:.1f} s, 0 containers left, resumed from epoch {resumed}"


@pytest.mark.parametrize("node", ["node3", "node1"], ids=["worker", "head"])
def test_a_link_going_dark_ends_the_run_naming_the_node(faults, report, node):
    with LongRun(faults) as job:
        rid = job.checkpoint()
        cut = next(n for n in faults.bed.state.nodes if n.name == node)
        cut_at = time.monotonic()
        run("ip", "link", "set", cut.veth, "down")  # packets dropped, no reset: the link just goes dark
        try:
            code, detected, err = job.wait(180)
        finally:
            run("ip", "link", "set", cut.veth, "up")
            # The first connection after the link comes back once failed with "No route to host"
            # (address resolution starting over, presumably); the resume below needs the node back.
            faults.bed.wait_ssh(cut)
        # The node that was cut off ends its container itself once its lease runs out.
        cleared = gone_within(faults, LEASE + 30)
    # Named within the watcher's budget (README: about half a minute), and the run over soon after.
    said = job.said(f"edgetrain: {node}: unreachable")
    noticed = said - cut_at if said is not None else None
    assert code == 1 and noticed is not None and noticed <= 30 and detected <= 35, \
        (noticed, detected, job.console(cut_at)[-3000:])
    last = err.strip().splitlines()[-1]
    assert node in last and f"--resume {rid}" in last and f"-i {faults.inventory}" in last, last
    resumed = resume_completes(faults, rid)
    report[f"fault: {node} link cut"] = (f"noticed in {noticed:.1f} s, the run ended {detected:.1f} s after the cut; "
                                         f"its container gone {cleared:.0f} s after the CLI's exit "
                                         f"(lease {LEASE} s); resumed from epoch {resumed}")


def test_a_lost_worker_node_is_left_out_then_taken_back_and_the_run_completes(faults, report):
    """--max-restarts --rejoin: node3's link goes dark after the first checkpoint; the run notices,
    leaves node3 out, resumes on node1 and node2 from its newest checkpoint; once node3 answers
    again (and its old container has ended itself), it is taken back at the next epoch, and the
    run completes on three nodes - no command typed."""
    with LongRun(faults, "--max-restarts", "1", "--rejoin", epochs=12) as job:
        rid = job.checkpoint(1)
        node3 = next(n for n in faults.bed.state.nodes if n.name == "node3")
        cut = time.monotonic()
        run("ip", "link", "set", node3.veth, "down")
        try:
            job.until("restart", lambda: any("restarting on node1, node2" in line for line in job.err), 180)
            noticed = time.monotonic() - cut
        finally:
            run("ip", "link", "set", node3.veth, "up")
            faults.bed.wait_ssh(node3)
        job.until("node3 taken back", lambda: any("node3 answers again" in line for line in job.err), 300)
        back = time.monotonic() - cut
        code, _, err = job.wait(600)
        total = time.monotonic() - cut
    assert code == 0, err[-3000:]
    assert "edgetrain: node3 lost (unreachable" in err and "with 2 ranks from the newest intact checkpoint (0 restart(s) left)" in err, err
    assert "edgetrain: node3 answers again; restarting on 3 nodes with 3 ranks" in err, err
    # Said as soon as it was noticed, before the attempt's end and the restart's line
    said_lost = job.said("edgetrain: node3: unreachable")
    assert said_lost is not None and said_lost < job.said("restarting on node1, node2"), job.out
    info = faults.run_json(rid)
    assert info["status"] == "completed", info
    assert [a["np"] for a in info["attempts"]] == [3, 2, 3]
    assert [list(a["excluded"]) for a in info["attempts"]] == [[], ["node3"], []]
    assert [h["host"] for h in info["placement"]["hosts"]] == ["node1", "node2", "node3"]
    metrics = faults.metrics(rid)
    assert metrics[-1]["epoch"] == 12 and metrics[-1]["ranks"] == 3
    shrunk = [m["epoch"] for m in metrics if m["ranks"] == 2]
    assert shrunk, metrics  # some epochs trained on the two nodes left
    shrunk_attempt, back_attempt = info["attempts"][1], info["attempts"][2]
    report["fault: node3 link cut, --max-restarts 1 --rejoin"] = (
        f"restart began {noticed:.0f} s after the cut; its launch (teardown done: preflight, containers, probe, restore) to "
        f"first step {shrunk_attempt['first_step_s']} s, resumed from epoch {shrunk_attempt['resumed_from_epoch']} on 2 nodes "
        f"(epochs {shrunk[0]}-{shrunk[-1]} there); node3 taken back {back:.0f} s after the cut, launch to first step "
        f"{back_attempt['first_step_s']} s; completed {total:.0f} s after the cut")


def test_bench_survives_a_lost_node_under_max_restarts_as_run_does(faults, report):
    """`edgetrain bench --max-restarts 1`: node3's link goes dark after the 3-node run's first
    checkpoint; the supervisor restarts that run on node1 and node2 as it would `edgetrain run`'s,
    the run completes, and bench finishes, its try recorded as one that lost node3 (left out of
    the medians: it stands for no N), with no container left on any node."""
    with LongRun(faults, "--nodes", "3", "--repeat", "1", "--max-restarts", "1", epochs=6, command=("bench", "lenet")) as job:
        trained = lambda: sorted(r for r in faults.run_ids() - job.runs_before if "-lenet-" in r)  # noqa: E731 - not the probe's run
        job.until("the 3-node run", trained, 600)
        rid = job.checkpoint(1, rid=trained()[0])
        cut = time.monotonic()
        with cut_link(faults, "node3"):
            job.until("restart", lambda: any("restarting on node1, node2" in line for line in job.out), 180)
            noticed = time.monotonic() - cut
        code, _, err = job.wait(600)
        out = "".join(job.out)
    assert code == 0, (out + err)[-3000:]
    assert "3 nodes, try 1/1: edgetrain: node3 lost (unreachable" in out and "with 2 ranks from the newest intact checkpoint" in out, out
    [body] = [b for b in (json.loads(f.read_text()) for f in faults.runs.glob("*-bench-lenet-*/bench.json"))
              if any(t["run"] == rid for t in b["trials"])]
    [trial] = body["trials"]
    assert trial["run"] == rid and trial["status"] == "completed" and list(trial["lost"]) == ["node3"], trial
    assert body["points"][0]["images_per_sec"] is None  # the only try lost a node: no figure for N = 3
    assert [a["np"] for a in faults.run_json(rid)["attempts"]] == [3, 2]
    cleared = gone_within(faults, LEASE + 30)  # node3's old container ends itself once its lease runs out
    report["fault: node3 link cut during bench --max-restarts 1"] = (
        f"restart began {noticed:.0f} s after the cut; the run completed on 2 nodes; every container gone {cleared:.0f} s after bench's exit")


def test_a_node_slow_to_answer_is_warned_about_not_called_lost(faults):
    """node2's ssh sessions (the controller's shared connection among them) stalled past ssh's
    15 s: the watcher's check through that connection times out, a new connection gets through,
    and the run goes on with a warning naming node2 - a near miss, not a lost node."""
    node2 = faults.bed.state.nodes[1]
    with LongRun(faults) as job:
        job.checkpoint()
        stalled = descendants(node2.sshd_pid)  # sshd's sessions on node2, not sshd itself
        for pid in stalled:
            with contextlib.suppress(ProcessLookupError):  # a command that just ended
                os.kill(pid, signal.SIGSTOP)
        try:
            job.until("a near miss", lambda: job.said("warning: node2: its shared connection failed"), 90)
        finally:
            for pid in stalled:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)
        time.sleep(5)  # a check or two more on node2, answered as before
        assert job.proc.poll() is None and not job.said("ending this attempt"), "".join(job.out + job.err)[-3000:]
        job.proc.send_signal(signal.SIGINT)
        assert job.wait(120)[0] == 130
    assert faults.leftovers() == {}


def test_a_killed_controller_leaves_containers_that_end_themselves(faults, report, tmp_path):
    with LongRun(faults) as job:
        rid = job.checkpoint()
        job.proc.kill()  # SIGKILL: nothing of ours runs
        job.wait(30)
        killed = time.monotonic()
        shown = edgetrain("runs", "show", rid, env=faults.env)
        # Another runs directory cannot tell this run from another controller's: its containers,
        # their leases not yet run out, are not proven dead, and stay.
        elsewhere = edgetrain("clean", "-i", faults.inventory, "--runs-dir", str(tmp_path / "elsewhere"), env=faults.env)
        cleared = gone_within(faults, LEASE + 30)
    assert elsewhere.returncode == 0 and "0 container(s) removed, 3 kept" in elsewhere.stdout, elsewhere.stdout + elsewhere.stderr
    assert elsewhere.stdout.count("another controller renewed its lease") == 3, elsewhere.stdout
    assert "status abandoned" in shown.stdout and f"--resume {rid}" in shown.stdout, shown.stdout
    assert cleared <= LEASE + 30 and time.monotonic() - killed >= cleared
    resumed = resume_completes(faults, rid)
    report["fault: controller SIGKILL"] = f"every container gone {cleared:.0f} s after (lease {LEASE} s); the next run resumed from epoch {resumed}"


def test_a_second_resume_of_a_live_run_is_refused_and_changes_nothing(faults):
    with LongRun(faults) as first:
        rid = first.checkpoint()
        second = edgetrain("run", "lenet", *NP, "-i", faults.inventory, "--epochs", "40", "--max-steps", str(STEPS), "--resume", rid, env=faults.env)
        assert second.returncode == 1
        assert f"run {rid} is in use by pid {first.proc.pid}" in second.stderr.strip().splitlines()[-1]
        assert first.proc.poll() is None and faults.docker("node2", "inspect", f"edgetrain-{rid}", check=False).returncode == 0
        first.proc.send_signal(signal.SIGINT)
        assert first.wait(120)[0] == 130
    assert faults.leftovers() == {}


def test_a_full_disk_on_the_rank0_node_during_a_checkpoint_is_named_and_resumed(faults, report):
    node1 = faults.bed.state.head
    runs_dir = f"{faults.home}/runs"
    user = pwd.getpwnam(faults.bed.state.login_user)
    # node1's runs directory becomes a file system of its own, roomy enough for preflight (2 GiB);
    # once the first checkpoint is written it is filled to 10 MB short, so the second (~20 MB) cannot be.
    mount = ["nsenter", "-t", str(node1.sshd_pid), "--mount"]
    run(*mount, "mount", "-t", "tmpfs", "-o", f"size=2100m,uid={user.pw_uid},gid={user.pw_gid}", "tmpfs", runs_dir)
    try:
        with LongRun(faults) as job:
            rid = job.checkpoint()
            free = int(run(*mount, "df", "-B1", "--output=avail", runs_dir).stdout.split()[-1])
            # The run keeps writing meanwhile (with Gloo it trains fast enough to), so the filler may
            # itself meet the full disk: that is the point; what counts is how little room is left.
            run(*mount, "sh", "-c", f"head -c {free - 10 * 1024**2} /dev/zero > {runs_dir}/filler", check=False)
            left = int(run(*mount, "df", "-B1", "--output=avail", runs_dir).stdout.split()[-1])
            assert left <= 12 * 1024**2, left
            # Rank 0 fails writing checkpoint 2; ranks 1 and 2 wait in their allreduce until it takes them down.
            code, detected, err = job.wait(180)
        assert code == 1 and detected < 60, (detected, err[-3000:])
        last = err.strip().splitlines()[-1]
        # The one report of a full disk (as on this machine's, tests/mpi/test_disk_full.py), with the node's own path.
        assert last.startswith(f"edgetrain: error: run {rid} failed: the disk of its run directory on node1 is full"), last
        assert f"free disk space there ({runs_dir}/{rid}), then resume with: " in last, last
        assert f"-i {faults.inventory}" in last and f"--resume {rid}" in last, last
        assert faults.leftovers() == {}
        assert faults.run_json(rid)["status"] == "failed"
        # Only the epoch in progress is lost: the checkpoints before it are whole, no half-written one is left.
        # Its first write to fail is its checkpoint, or - where the filler met the run's own writes and
        # left nothing - the metrics line written just before it; either is named.
        good = saved(faults, rid)
        writing = (f"while writing checkpoints/epoch-{good + 1:04d}", "while writing metrics.jsonl")
        assert any(f"is full (No space left on device) {w} - " in last for w in writing), last
        assert faults.node_ls("node1", f"-A {runs_dir}/{rid}/checkpoints") == [f"epoch-{e:04d}" for e in range(1, good + 1)]
        run(*mount, "rm", f"{runs_dir}/filler")
        # The epochs checkpointed before the disk filled hold some of it: how many depends on how fast
        # this machine trained while the filler was written. Room enough for preflight again, whatever.
        used = int(run(*mount, "df", "-B1", "--output=used", runs_dir).stdout.split()[-1])
        run(*mount, "mount", "-o", f"remount,size={used + preflight.MIN_FREE_DISK + 64 * 1024**2}", runs_dir)
        resumed = resume_completes(faults, rid)
        assert resumed == good
        report["fault: rank-0 node's disk full during a checkpoint"] = (
            f"detected in {detected:.1f} s (from the disk filling to the CLI's exit), 0 containers left, "
            f"named on node1 (disk full); resumed from epoch {resumed}: only epoch {good + 1}, in progress, lost")
    finally:
        run(*mount, "rm", "-f", f"{runs_dir}/filler", check=False)
        run(*mount, "umount", runs_dir, check=False)


def test_a_login_shell_that_prints_text_fails_preflight_with_the_fix(faults):
    bashrc = f"{faults.bed.state.login_home}/.bashrc"
    node2 = faults.bed.state.nodes[1]
    faults.bed.ssh(node2, f"echo 'echo Welcome to node2' >> {bashrc}")
    try:
        r = edgetrain("doctor", "-i", faults.inventory, env=faults.env)
    finally:
        faults.bed.ssh(node2, f"rm -f {bashrc}")
    assert r.returncode == 1
    row = next(line for line in r.stdout.splitlines() if line.split()[:2] == ["node2", "ssh"])
    assert "FAIL" in row and "prints text" in row and "interactive" in row, row
    assert faults.leftovers() == {}


@pytest.fixture(scope="module")
def ps_faults(cluster) -> Cluster:
    """The fault tests' short lease, with node1's two slots: tf-ps's chief and parameter server there,
    a worker on each of node2 and node3."""
    return Cluster(cluster.bed, cluster.docker_inventory("docker-ps-faults.yml", head_slots=2, edgetrain_lease_seconds=LEASE),
                   cluster.env, cluster.runs)


EPOCHS = 12


STEPS_PER_EPOCH = 40


def epoch_begun(n: int):
    return lambda said: said.said(f"Epoch {n}/{EPOCHS}") is not None


def training_ended(said) -> bool:
    """The last epoch's line of steps has come: the chief's fit is over, its evaluation next."""
    begun = said.said(f"Epoch {EPOCHS}/{EPOCHS}")
    return begun is not None and any(t >= begun and line.startswith(f"{STEPS_PER_EPOCH}/{STEPS_PER_EPOCH} ")
                                     for t, line in list(said.timed))


# The container is killed in the middle of the training. The link goes dark once the training is
# over: the chief's evaluation then registers its functions on every worker, the dark one included,
# before the heartbeat's silence has run out, in a call that holds the GIL until it is answered, so
# the chief's threads that would cut the worker off cannot run; only the kernel's limits armed on
# its connections end the call (edgetrain/rank/tf_ps.py). Without them that run hung every time.
@pytest.mark.parametrize("how, when", [("container killed", epoch_begun(2)), ("link cut", training_ended)],
                         ids=["container killed", "link cut"])
def test_a_parameter_server_run_goes_on_without_a_lost_worker(ps_faults, report, how, when):
    """tf-ps (examples/parameter_server) across the containers, the chief and the parameter server on
    node1, a worker on each of node2 and node3: node3's worker lost - its container killed, or its
    link gone dark for good - and the run completes on node2's worker, no command typed: the loss
    said on the console and kept in run.json, the epochs after it trained, the evaluation after it
    done, the servers serving until the chief's end, the chief's model saved, nothing left behind."""
    c = ps_faults
    before, link_before = c.run_ids(), c.bed.link_bytes()
    lost: list[float] = []

    def lose(said, undo) -> None:
        if lost or not when(said):
            return
        lost.append(time.monotonic())
        if how == "container killed":
            c.docker("node3", "kill", f"edgetrain-{c.new_run(before)}")
        else:
            undo.enter_context(cut_link(c, "node3"))

    # Polled often: the example's epochs take half a second.
    said, _ = completed(c, str(ROOT / "examples" / "parameter_server" / "train.py"), "--np", "4", "--strategy", "tf-ps", "--ps", "1",
                        "--dataset", "fashion-mnist", "-i", c.inventory, "--", "--epochs", str(EPOCHS),
                        "--steps-per-epoch", str(STEPS_PER_EPOCH), timeout=1500, meanwhile=lose, every=0.05)
    ended = time.monotonic()
    rid = c.new_run(before)
    console = "".join(said.out) + "".join(said.err)
    assert lost, console[-5000:]
    lost_at = lost[0]
    noticed = said.said("the run goes on without its worker 1 (rank 3)")
    assert noticed is not None and "edgetrain: node3: " in console, console[-5000:]
    after = [line for t, line in list(said.timed) if t > lost_at and line.startswith("Epoch ")]
    assert how == "link cut" or (after and f"Epoch {EPOCHS}/{EPOCHS}" in after[-1]), console[-5000:]
    tested = said.said("test accuracy")
    assert tested is not None and tested > lost_at, console[-5000:]  # the chief's evaluation, on the workers
    attempt = c.run_json(rid)["attempts"][-1]
    assert c.run_json(rid)["status"] == "completed" and list(attempt["went_on_without"]) == ["node3"], attempt
    shown = edgetrain("runs", "show", rid, env=c.env)
    assert "; went on without node3 (" in shown.stdout, shown.stdout + shown.stderr
    assert "keras-model" in c.node_ls("node1", f"{c.home}/runs/{rid}/work")
    logs = {rank: (c.runs / rid / f"rank.{rank}.log").read_text() for rank in (1, 2)}
    assert "edgetrain: ps 0 serving" in logs[1] and "edgetrain: worker 0 serving" in logs[2]
    moved = c.bed.link_bytes()["node2"] - link_before["node2"]
    assert moved > 1e6, moved  # node2's worker pulled variables and pushed gradients
    cleared = gone_within(c, LEASE + 30)
    report[f"fault: tf-ps worker {how}"] = (f"said {noticed - lost_at:.1f} s after; completed {ended - lost_at:.0f} s after, "
                                            f"{len(after)} epoch(s) from the loss on; no container left {cleared:.0f} s after the exit")
