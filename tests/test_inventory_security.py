"""Inventory values that reach command lines - ssh's destination, docker's image and volumes, MPI's
machinefile - are refused before anything runs, by the CLI and by the preflight play alike, each in
one line naming the host and the variable. The play stops on the controller: no node is contacted."""

from __future__ import annotations

import pytest

from edgetrain.controller import inventory
from edgetrain.shared.errors import EdgetrainError
from tests.cluster.playbook import Playbook
from tests.conftest import ROOT, edgetrain

from .test_cli_errors import assert_one_line_error
from .test_inventory_schema import write as write_inventory

USER = "is not a user name (letters, digits, '.', '-' and '_', not starting with '-')"
ADDRESS = ("is not a host name or IPv4 address (letters, digits, '.', '-' and '_', not starting with '-'; "
           "no ':', spaces or line breaks)")
IMAGE = "is not an image reference (it starts with a letter or digit, and holds no spaces)"
RUNS_DIR = "cannot be a container's volume (no ':' or control characters, not starting with '-')"
DATASETS_DIR = ("must be an absolute path without ':' or control characters "
                "(the datasets role needs it absolute, a container's volume takes no ':')")


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
}


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
                               edgetrain_runs_dir="/data/edgetrain runs", datasets_dir="/srv/edgetrain/datasets"))
    node = inv.host("n2")
    assert (node.address, node.user, node.image) == ("127.0.0.12", "pi", "registry.lan:5000/edgetrain:0.1.0-arm64")
    assert (node.runs_dir, inv.host("n1").runs_dir) == ("/data/edgetrain runs", inventory.DEFAULT_RUNS_DIR)
