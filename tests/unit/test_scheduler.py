"""What `edgetrain submit` asks Slurm for, and what it says where no Slurm is configured; and, with
stand-in sbatch, squeue, scancel and sinfo (tests/slurm_standin.py) on PATH, what another user's job
in the queue or a shared runs directory can do to `submit`, `runs list` and `cancel`: nothing."""

from __future__ import annotations

import json
import os
import pwd
import shlex
import stat
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgetrain.controller import config as configs
from edgetrain.controller import program as programs
from edgetrain.controller import observers, scheduler
from edgetrain.controller.inventory import Host, Inventory
from edgetrain.shared.job_options import JobOptions
from edgetrain.shared.errors import EdgetrainError
from tests.conftest import assert_one_line_error, edgetrain


def _inventory(arch: str = "aarch64") -> Inventory:
    hosts = [Host("head", "198.18.0.10", arch, 2, "docker", groups=frozenset({"head", "rpi"}))]
    hosts += [Host(f"pi{i}", f"198.18.0.{10 + i}", arch, 1, "docker", groups=frozenset({"rpi"})) for i in range(1, 4)]
    return Inventory(Path("hosts.yml"), tuple(hosts))


def test_a_run_asks_for_the_whole_nodes_its_placement_uses(tmp_path):
    config = configs.resolve(programs.resolve("lenet", [], JobOptions()), np=4, runs_dir=tmp_path)
    argv = scheduler.sbatch_argv(config, _inventory(), "20261203-230102-lenet-4b1e", tmp_path)
    assert argv[:2] == ["sbatch", "--parsable"]
    # head takes 2 ranks, pi1 and pi2 one each: three nodes, whole, of the rpi partition and the ranks' architecture.
    for flag in ("--job-name=edgetrain:20261203-230102-lenet-4b1e", "--nodes=3", "--ntasks=4", "--exclusive",
                 "--constraint=aarch64", "--partition=rpi", "--export=ALL", f"--output={tmp_path.resolve()}/slurm-%j.out"):
        assert flag in argv, (flag, argv)


def test_the_job_is_this_edgetrains_run_with_the_same_arguments_and_its_id():
    script = scheduler.batch_script("20261203-230102-lenet-4b1e", ["lenet", "--np", "3", "-i", "my inv/hosts.yml", "--", "x;y"])
    first, assign, export, command = script.splitlines()
    assert first == "#!/bin/sh"
    assert (assign, export) == ("EDGETRAIN_RUN_ID=20261203-230102-lenet-4b1e", "export EDGETRAIN_RUN_ID")
    assert shlex.split(command) == ["exec", sys.executable, "-m", "edgetrain", "run", "lenet", "--np", "3", "-i", "my inv/hosts.yml", "--", "x;y"]


def test_without_slurm_submit_says_so_in_one_line_and_runs_list_shows_no_queue(tmp_path):
    env = {"SLURM_CONF": "", "EDGETRAIN_RUNS": str(tmp_path)}
    if Path(scheduler.DEFAULT_CONF).is_file():
        pytest.skip("this machine has a slurm.conf")
    r = edgetrain("submit", "lenet", "--np", "1", env=env)
    assert_one_line_error(r, "Slurm is not configured on this machine")
    assert not any(tmp_path.iterdir())  # nothing made
    listed = edgetrain("runs", "list", "--json", env=env)
    assert listed.returncode == 0 and '"slurm": []' in listed.stdout, listed.stdout + listed.stderr
    assert_one_line_error(edgetrain("cancel", "20261203-230102-lenet-4b1e", env=env), "is not queued or running under Slurm")


def test_runs_list_stands_without_a_controller_that_answers(tmp_path):
    """A slurm.conf whose controller is not there (on loopback, a port nobody listens on): the runs
    are listed, the queue left out in one warning line."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=gone\nSlurmctldHost=localhost(127.0.0.1)\nSlurmctldPort=1\nAuthType=auth/munge\n"
                    f"AuthInfo=socket={tmp_path}/no-munge\nNodeName=n1 CPUs=1\nPartitionName=p Nodes=n1\n")
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    listed = edgetrain("runs", "list", "--json", env={"SLURM_CONF": str(conf), "EDGETRAIN_RUNS": str(runs_dir)})
    assert listed.returncode == 0, listed.stderr
    assert '"runs": []' in listed.stdout and '"slurm": []' in listed.stdout, listed.stdout
    [warning] = listed.stderr.strip().splitlines()
    assert warning.startswith("edgetrain: warning: Slurm's queue left out: squeue: "), warning


# -- another user's jobs and a shared runs directory (issue 80) ------------------------------------

ME = pwd.getpwuid(os.getuid()).pw_name


class Slurm:
    """The stand-in commands first on PATH, SLURM_CONF an empty file, and the queue they share."""

    def __init__(self, d: Path) -> None:
        self.bin, self.state, self.runs = d / "bin", d / "slurm.json", d / "runs"
        self.bin.mkdir()
        self.runs.mkdir()
        tests = Path(__file__).resolve().parents[1]
        for name in ("sbatch", "squeue", "scancel", "sinfo"):
            path = self.bin / name
            path.write_text(f"#!{sys.executable}\nimport sys\nsys.path.insert(0, {str(tests)!r})\nimport slurm_standin\n"
                            f"sys.exit(slurm_standin.main({name!r}))\n")
            path.chmod(0o755)
        (d / "slurm.conf").write_text("")
        self.env = {"PATH": f"{self.bin}:{os.environ['PATH']}", "SLURM_CONF": str(d / "slurm.conf"), "SLURM_STANDIN": str(self.state),
                    "EDGETRAIN_RUNS": str(self.runs)}
        self.save({"jobs": [], "calls": [], "scripts": [], "next_id": 200})

    def load(self) -> dict:
        return json.loads(self.state.read_text())

    def save(self, state: dict) -> None:
        self.state.write_text(json.dumps(state))

    def add(self, job_id: str, name: str, user: str, state: str = "RUNNING", nodelist: str = "node9") -> None:
        s = self.load()
        s["jobs"].append({"id": job_id, "name": name, "state": state, "user": user, "nodes": 1, "nodelist": nodelist, "reason": "None"})
        self.save(s)

    def calls(self, command: str) -> list[list[str]]:
        return [c[1:] for c in self.load()["calls"] if c[0] == command]

    def run(self, *args: str) -> subprocess.CompletedProcess:
        return edgetrain(*args, env=self.env)

    def submit(self) -> tuple[str, str]:
        """A run of mine, queued: its run id and job id."""
        r = self.run("submit", "lenet", "--np", "1")
        assert r.returncode == 0, r.stderr
        said = r.stdout.strip().splitlines()[-1]  # run <id>: Slurm job <n>
        return said.split()[1].rstrip(":"), said.split()[-1]


@pytest.fixture
def slurm(tmp_path, monkeypatch) -> Slurm:
    s = Slurm(tmp_path)
    for k, v in s.env.items():
        monkeypatch.setenv(k, v)
    return s


def _listed(slurm: Slurm) -> tuple[list[dict], str]:
    r = slurm.run("runs", "list", "--json")
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return json.loads(r.stdout)["slurm"], r.stderr


def test_another_users_job_name_neither_crashes_nor_forges_the_queue(slurm):
    """Item 1: a name with | and a number where squeue's node count was, and one that forges a
    second running row for my run, as Slurm accepts job names."""
    mine, job = slurm.submit()
    slurm.add("102", "edgetrain:x|y|PENDING|mallory|1||Resources", "mallory", "PENDING", "")
    slurm.add("103", f"edgetrain:{mine}|RUNNING|{ME}|1|node9|", "mallory")
    slurm.add("105", "edgetrain:two\nlines|RUNNING", "mallory")
    jobs, warned = _listed(slurm)
    assert jobs == [{"job_id": job, "run_id": mine, "state": "PENDING", "user": ME, "nodes": 1, "nodelist": "", "reason": "Priority"}]
    assert all("--me" in c for c in slurm.calls("squeue"))
    table = slurm.run("runs", "list")
    assert table.returncode == 0 and "mallory" not in table.stdout and "node9" not in table.stdout, table.stdout + table.stderr
    # My own cancel stays unambiguous, and signals my job alone.
    done = slurm.run("cancel", mine)
    assert done.returncode == 0 and f"run {mine}: Slurm job {job} taken out of the queue" in done.stdout, done.stderr
    assert slurm.calls("scancel") == [[f"--user={os.getuid()}", job]]


def test_an_unreadable_line_of_the_queue_is_left_out_and_counted(slurm):
    mine, job = slurm.submit()
    s = slurm.load()
    s["jobs"].append({"id": "106", "state": "RUNNING", "user": ME, "name": "n", "nodes": "many", "nodelist": "", "reason": ""})
    slurm.save(s)
    jobs, warned = _listed(slurm)
    assert [j["job_id"] for j in jobs] == [job]
    assert warned.strip() == ("edgetrain: warning: 1 line(s) of Slurm's queue or of your job records did not read as they must "
                              "and are left out")


def test_cancel_touches_only_the_callers_own_jobs_and_refuses_an_empty_id(slurm):
    """Item 2: `cancel ""` and `cancel 2026` matched every user's jobs by prefix; another user's id
    that extends mine made mine ambiguous; the job's name reached the terminal raw."""
    slurm.add("104", "edgetrain:20261205-000000-lenet-zz\x1b]0;PWNED\x07\x1b[2Jx", "mallory")
    assert_one_line_error(slurm.run("cancel", ""), "'' is not a run id", code=2)
    assert_one_line_error(slurm.run("cancel", "2026"), "run 2026 is not queued or running under Slurm")
    assert slurm.calls("scancel") == []
    mine, job = slurm.submit()
    slurm.add("107", f"edgetrain:{mine}0", "mallory")  # an id that extends mine
    listed = slurm.run("runs", "list")
    assert "\x1b" not in listed.stdout + listed.stderr
    done = slurm.run("cancel", mine)
    assert done.returncode == 0, done.stderr
    assert slurm.calls("scancel") == [[f"--user={os.getuid()}", job]]


def test_a_run_directorys_name_never_reaches_sbatchs_environment_list(slurm):
    """Item 3: a directory whose name holds commas, found by a prefix; and a run.json that names no run."""
    evil = slurm.runs / "20261205-000000-lenet-aa,PYTHONPATH=runs,LD_PRELOAD=libevil.so"
    evil.mkdir()
    (evil / "run.json").write_text(json.dumps({"job": "lenet"}))
    assert_one_line_error(slurm.run("submit", "lenet", "--resume", "20261205-000000-lenet-aa"), "no run '20261205-000000-lenet-aa'")
    damaged = slurm.runs / "20261205-000000-lenet-bb"
    damaged.mkdir()
    (damaged / "run.json").write_text("{}")
    assert_one_line_error(slurm.run("submit", "lenet", "--resume", "20261205-000000-lenet-bb"), "run 20261205-000000-lenet-bb's run.json is damaged")
    assert slurm.calls("sbatch") == []
    mine, _ = slurm.submit()
    [argv] = slurm.calls("sbatch")
    assert [a for a in argv if a.startswith("--export")] == ["--export=ALL"]
    assert f"\nEDGETRAIN_RUN_ID={mine}\nexport EDGETRAIN_RUN_ID\n" in slurm.load()["scripts"][0]


def test_a_slow_controller_is_one_line_not_a_traceback(slurm, monkeypatch):
    """Item 4, the commands' side: squeue that does not answer in time."""
    s = slurm.load()
    s["sleep"] = {"squeue": 5}
    slurm.save(s)
    monkeypatch.setattr(scheduler, "ANSWER_SECONDS", 0.5, raising=False)
    for call in (lambda: scheduler.queue(slurm.runs), lambda: scheduler.cancel("20261205-000000-lenet-aa", slurm.runs)):
        with pytest.raises(EdgetrainError, match="squeue: no answer in 0 s: the Slurm controller is busy or out of reach"):
            call()


def test_slurms_output_is_the_users_alone(slurm):
    """Item 7: the job's console went to <runs root>/slurm-%j.out, in a root others can read."""
    slurm.submit()
    [argv] = slurm.calls("sbatch")
    [output] = [a.split("=", 1)[1] for a in argv if a.startswith("--output=")]
    where = Path(output).parent
    assert where != slurm.runs.resolve() and where.parent == slurm.runs.resolve(), output
    st = where.lstat()
    assert stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid() and stat.S_IMODE(st.st_mode) == 0o700


def test_a_users_slurm_directory_someone_else_made_is_not_used(slurm):
    (slurm.runs / f".slurm-{os.getuid()}").symlink_to(slurm.runs)
    assert_one_line_error(slurm.run("submit", "lenet", "--np", "1"), "is not a directory of yours that only you can read")
    assert slurm.calls("sbatch") == []


def test_a_line_of_sinfo_that_is_not_a_node_and_its_state_is_left_out(slurm):
    """The watcher's and doctor's view of the nodes: a line without its separator ended them in a ValueError."""
    s = slurm.load()
    s["nodes"] = {"n1": "idle", "half\nn2": "down*"}  # sinfo prints "half", then "n2|down*"
    slurm.save(s)
    assert scheduler.nodes_view() == [scheduler.NodeView("n1", "idle"), scheduler.NodeView("n2", "down*")]
    assert scheduler.taken(["n1", "n2"]) == {"n2": "down*"}



def test_the_watchers_question_to_slurm_keeps_within_the_dark_link_budget(slurm):
    """Inside an allocation each look also asks sinfo which nodes Slurm took: a controller slower
    than the look's share of DARK_LINK_NOTICED_S says nothing this time, rather than hold up the
    verdict on a dark node (with Slurm's usual 60 s, half a minute became a minute and a half)."""
    s = slurm.load()
    s["nodes"], s["sleep"] = {"n2": "down*"}, {"sinfo": 10}
    slurm.save(s)
    runtime = SimpleNamespace(plan=SimpleNamespace(hosts=[SimpleNamespace(name="n2")]))
    watcher = observers.Watcher(runtime, "r1", lambda event: None, held=SimpleNamespace(job_id="4242"))
    started = time.monotonic()
    assert watcher._taken() == {}
    assert time.monotonic() - started < observers.SLURM_LOOK_S + 2
    assert observers.DARK_LINK_NOTICED_S <= 30
    s["sleep"] = {}
    slurm.save(s)
    assert watcher._taken() == {"n2": "Slurm took it from job 4242 (down*)"}
