"""What `edgetrain submit` asks Slurm for, and what it says where no Slurm is configured."""

from __future__ import annotations

import shlex
import sys
from pathlib import Path

import pytest

from edgetrain.controller import config as configs
from edgetrain.controller import program as programs
from edgetrain.controller import scheduler
from edgetrain.controller.inventory import Host, Inventory
from edgetrain.shared.job_options import JobOptions
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
                 "--constraint=aarch64", "--partition=rpi", "--export=ALL,EDGETRAIN_RUN_ID=20261203-230102-lenet-4b1e",
                 f"--output={tmp_path.resolve()}/slurm-%j.out"):
        assert flag in argv, (flag, argv)


def test_the_job_is_this_edgetrains_run_with_the_same_arguments():
    script = scheduler.batch_script(["lenet", "--np", "3", "-i", "my inv/hosts.yml", "--", "x;y"])
    first, command = script.splitlines()
    assert first == "#!/bin/sh"
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
