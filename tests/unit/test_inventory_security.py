"""Inventory values that reach command lines - ssh's destination, docker's image and volumes, MPI's
machinefile and its ranks' environment - are refused before anything runs, by the CLI and by the
preflight play alike, each in one line naming the host and the variable. The play stops on the
controller: no node is contacted."""

from __future__ import annotations

import shutil
from dataclasses import replace

import pytest
import yaml

from edgetrain.controller import inventory, monitor, placement
from edgetrain.shared import runs
from edgetrain.shared.errors import EdgetrainError
from tests.conftest import ROOT, assert_one_line_error, edgetrain, project_script
from tests.playbook import Playbook

from .test_inventory_schema import write as write_inventory

IFACE = "is not a network interface name (up to 15 letters, digits, '.', '-' and '_', not starting with '.' or '-')"
USER = "is not a user name (letters, digits, '.', '-' and '_', not starting with '-')"
ADDRESS = ("is not a host name or IPv4 address (letters, digits, '.', '-' and '_', not starting with '-'; "
           "no ':', spaces or line breaks)")
IMAGE = "is not an image reference (it starts with a letter or digit, and holds no spaces)"
RUNS_DIR = ("is not a directory a container's volume and a shell take as it is "
            "(no ':', quotes, '$', '`', '\\' or control characters, not starting with '-')")
DATASETS_DIR = ("must be an absolute path without ':', quotes, '$', '`', '\\' or control characters (the datasets role "
                "needs it absolute, a container's volume takes no ':', and nothing in it may read as shell)")
ENV_NAME = "is not a variable name (letters, digits and '_', not starting with a digit; mpirun would read anything else as its own arguments)"
ENV_VALUE = "is not a variable's value (text or a number, without line breaks or control characters)"


def write(tmp_path, **node2) -> str:
    """Two hosts on loopback addresses: a value that got through would reach no other machine."""
    return write_inventory(tmp_path, ("127.0.0.11", "127.0.0.12"), **node2)


CASES = {
    # ssh would take it as an option: -oProxyCommand runs a command on this machine.
    "address-option": ("ansible_host", "-oProxyCommand=touch pwned", ADDRESS),
    "address-colon": ("ansible_host", "127.0.0.12:7", ADDRESS),  # a machinefile line is host:count
    "address-newline": ("ansible_host", "127.0.0.12\n127.0.0.13", ADDRESS),  # a second machinefile line
    "user-option": ("ansible_user", "-oProxyCommand=touch pwned", USER),
    "mpi-user-newline": ("edgetrain_mpi_user", "mpi\n", "is not a valid user name"),
    "image-option": ("edgetrain_image", "--privileged", IMAGE),
    "runs-dir-colon": ("edgetrain_runs_dir", "runs:/etc", RUNS_DIR),  # docker -v would mount /etc's name
    "datasets-dir-colon": ("datasets_dir", "/srv/data:/etc", DATASETS_DIR),
    # mpirun's -iface and ip's dev: an option, or a second line, where an interface's name goes.
    "iface-option": ("edgetrain_iface", "-oProxyCommand=touch pwned", IFACE),
    "iface-newline": ("edgetrain_iface", "lo\neth1", IFACE),
    # Whatever quotes a directory today, nothing in its name may read as shell tomorrow.
    "runs-dir-shell": ("edgetrain_runs_dir", "runs/$(touch pwned)", RUNS_DIR),
    "runs-dir-del": ("edgetrain_runs_dir", "runs\x7f", RUNS_DIR),
    "runs-dir-line-separator": ("edgetrain_runs_dir", "runs\u2028x", RUNS_DIR),
    "datasets-dir-shell": ("datasets_dir", "/srv/`touch pwned`", DATASETS_DIR),
}


def test_the_preflight_play_takes_no_yaml_true_for_an_interface(tmp_path):
    """The play read every value as text: true became "True", a name the pattern takes (the CLI
    refuses a value of the wrong type already)."""
    ran = Playbook(ROOT, write(tmp_path, edgetrain_iface=True)).run("playbooks/preflight.yml", timeout=300)
    said = " ".join(ran.output.split())
    assert ran.returncode != 0, ran.output[-3000:]
    assert f"preflight: host n2 has edgetrain_iface true; it {IFACE}." in said, ran.output[-3000:]


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_cli_refuses_a_value_that_would_read_as_an_option_or_split_a_field(tmp_path, case):
    key, value, problem = case
    inv = write(tmp_path, **{key: value})
    result = edgetrain("run", "lenet", "-i", inv, "--runs-dir", str(tmp_path / "runs"), cwd=tmp_path)
    assert_one_line_error(result, f"host n2 in {inv}: {key} {value!r} {problem}")
    assert not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("case", CASES.values(), ids=CASES.keys())
def test_the_preflight_play_refuses_the_same_values_before_any_node(tmp_path, case):
    key, value, problem = case
    ran = Playbook(ROOT, write(tmp_path, **{key: value})).run("playbooks/preflight.yml", timeout=300)
    said = " ".join(ran.output.split())
    assert ran.returncode != 0, ran.output[-3000:]
    assert f"preflight: host n2 has {key} " in said and f"; it {problem}." in said, ran.output[-3000:]
    assert "PLAY [Preflight - gather facts" not in ran.output


def test_a_host_without_an_address_is_checked_by_its_name(tmp_path):
    path = tmp_path / "hosts.yml"
    path.write_text("cluster:\n  hosts:\n    '-oProxyCommand=x': {edgetrain_arch: aarch64}\n")
    with pytest.raises(EdgetrainError, match=r"host -oProxyCommand=x in .*: ansible_host '-oProxyCommand=x' is not a host name"):
        inventory.load(path)


def test_values_that_are_safe_pass_unchanged(tmp_path):
    inv = inventory.load(write(tmp_path, ansible_user="pi", edgetrain_image="registry.lan:5000/edgetrain:0.1.0-arm64",
                               edgetrain_runs_dir="/data/edgetrain runs", datasets_dir="/srv/edgetrain/datasets",
                               edgetrain_iface="eth0.100", ansible_port="2222",
                               edgetrain_mpi_env={"OMP_NUM_THREADS": 1, "HOROVOD_CYCLE_TIME": 0.5, "UCX_TLS": "tcp,self",
                                                  "X_2": "a b 'c' \"d\" $e ä", "EMPTY": ""}))
    node = inv.host("n2")
    assert (node.address, node.user, node.image) == ("127.0.0.12", "pi", "registry.lan:5000/edgetrain:0.1.0-arm64")
    assert (node.runs_dir, inv.host("n1").runs_dir) == ("/data/edgetrain runs", inventory.DEFAULT_RUNS_DIR)
    assert (node.iface, node.port) == ("eth0.100", 2222)
    assert node.mpi_env == {"OMP_NUM_THREADS": "1", "HOROVOD_CYCLE_TIME": "0.5", "UCX_TLS": "tcp,self",
                            "X_2": "a b 'c' \"d\" $e ä", "EMPTY": ""}


def test_the_cli_takes_a_value_only_of_its_own_type(tmp_path):
    """A YAML true is no interface name, though it reads as the text "True"."""
    inv = write(tmp_path, edgetrain_iface=True)
    assert_one_line_error(edgetrain("run", "lenet", "-i", inv, "--runs-dir", str(tmp_path / "runs")),
                          f"host n2 in {inv}: edgetrain_iface True {IFACE}")


def local_inventory(tmp_path, **hostvars) -> str:
    """This machine alone on the host runtime (a copy of inventories/local), with these variables."""
    inv = tmp_path / "inventory"
    shutil.copytree(ROOT / "inventories" / "local", inv)
    with open(inv / "host_vars" / "localhost.yml", "a") as f:
        f.write(yaml.safe_dump(hostvars))
    return str(inv)


ENV_CASES = {
    # Hydra reads "-genv PWN=1" as NAME=VALUE, and the value that follows as the program to run.
    "name-with-equals": ({"PWN=1": "{evil}"}, "edgetrain_mpi_env name 'PWN=1' " + ENV_NAME),
    "name-an-option": ({"-n": "{evil}"}, "edgetrain_mpi_env name '-n' " + ENV_NAME),
    "name-from-a-digit": ({"1X": "y"}, "edgetrain_mpi_env name '1X' " + ENV_NAME),
    "value-newline": ({"X": "a\nb"}, "edgetrain_mpi_env X 'a\\nb' " + ENV_VALUE),
    "value-nul": ({"X": "a\0b"}, "edgetrain_mpi_env X 'a\\x00b' " + ENV_VALUE),
    "value-true": ({"X": True}, "edgetrain_mpi_env X True " + ENV_VALUE),
}


@pytest.mark.parametrize("case", ENV_CASES.values(), ids=ENV_CASES.keys())
def test_an_mpi_env_that_would_run_another_program_is_refused_before_anything_runs(tmp_path, case):
    env, problem = case
    evil = tmp_path / "evil.sh"
    evil.write_text(f"#!/bin/sh\ntouch {tmp_path / 'pwned'}\n")
    evil.chmod(0o755)
    inv = local_inventory(tmp_path, edgetrain_mpi_env={k: v.format(evil=evil) if isinstance(v, str) else v for k, v in env.items()})
    root = tmp_path / "runs"
    script = project_script(tmp_path, "print('trained', flush=True)\n")
    result = edgetrain("run", str(script), "--np", "1", "-i", inv, "--runs-dir", str(root))
    assert_one_line_error(result, f"host localhost in {inv}: {problem}")
    assert not (tmp_path / "pwned").exists()
    assert not root.exists() or not any(root.iterdir())


def test_a_run_whose_ranks_never_started_the_worker_is_not_completed(tmp_path):
    """Whatever mpirun ran in the worker's place - here Python ending in a sitecustomize the
    inventory's PYTHONPATH brings in - exits with 0, and the run fails saying so."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    ran = tmp_path / "ran"
    (elsewhere / "sitecustomize.py").write_text(f"import os\nopen({str(ran)!r}, 'w').close()\nos._exit(0)\n")
    root = tmp_path / "runs"
    script = project_script(tmp_path, "print('trained', flush=True)\n")
    result = edgetrain("run", str(script), "--np", "2", "-i", local_inventory(tmp_path, edgetrain_mpi_env={"PYTHONPATH": str(elsewhere)}),
                       "--runs-dir", str(root))
    line = assert_one_line_error(result, "mpirun exited with 0, but no rank started edgetrain's worker: mpirun ran something else in its place",
                                 "fix what mpirun starts on the nodes")
    assert "resume with" not in line  # a resume would start the same thing again
    assert ran.exists()  # the stand-in did run
    [run] = runs.all_runs(root)
    assert run.record().status is runs.Status.FAILED


def test_a_rank_that_never_started_is_named(tmp_path):
    plan = placement.plan(inventory.load(local_inventory(tmp_path, edgetrain_slots=4)), 3, None, None)
    known = monitor.Facts(hosts=tuple(plan.hosts), np=plan.np, ranks={h.name: tuple(plan.ranks_on(h)) for h in plan.hosts}, losable={},
                          expendable=frozenset(), hang_timeout=300.0, started=0.0)
    watched = monitor.State(known, last_output=0.0, said=monitor.Said(started=frozenset({0, 2})))
    assert monitor.unstarted(watched).startswith("mpirun exited with 0, but rank 1 never started edgetrain's worker")
    assert monitor.unstarted(replace(watched, said=monitor.Said(started=frozenset({0, 1, 2})))) is None
