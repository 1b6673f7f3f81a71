"""One inventory schema (edgetrain/controller/inventory.schema.json): the CLI and the preflight play refuse the
same host variables by the same rules, each in one line naming the host and the variable. Only
failing inventories are used: the play stops on the controller before it would contact a node."""

from __future__ import annotations

import json

import pytest
import yaml

from edgetrain.controller import containers
from edgetrain.controller.remote import SSH_TIMEOUT

from tests.conftest import ROOT, assert_one_line_error, edgetrain
from tests.playbook import Playbook


MODEL_PROBLEM = "is not a board's name (up to 64 letters, digits, '.', '-' and '_', starting with a letter or digit)"
GOOD = {"edgetrain_arch": "aarch64", "edgetrain_slots": 1, "edgetrain_iface": "eth0", "edgetrain_mpi_user": "mpi"}


def write(tmp_path, addresses: tuple[str, str] = ("198.18.250.11", "198.18.250.12"), **node2) -> str:
    """Two hosts; node2 with the variables given. The play stops before it contacts either."""
    hosts = {"n1": {"ansible_host": addresses[0]}, "n2": {"ansible_host": addresses[1], **node2}}
    inv = {"cluster": {"children": {"head": {"hosts": {"n1": None}}, "rpi": {"hosts": hosts}}, "vars": GOOD}}
    path = tmp_path / "hosts.yml"
    path.write_text(yaml.safe_dump(inv))
    return str(path)


@pytest.mark.parametrize(("node2", "cli", "play"), [
    ({"edgetrain_slots": 0}, "host n2 in {inv}: edgetrain_slots is 0; it must be a number of slots from 1 to 4096",
     "preflight: host n2 has edgetrain_slots '0'; it must be a number of slots from 1 to 4096."),
    ({"edgetrain_lease_seconds": 29}, "host n2 in {inv}: edgetrain_lease_seconds is 29; it must be a number of seconds from 30 to 604800",
     "preflight: host n2 has edgetrain_lease_seconds '29'; it must be a number of seconds from 30 to 604800."),
    ({"edgetrain_arch": "armv7l"}, "host n2 in {inv}: edgetrain_arch is armv7l; set it to one of aarch64, x86_64",
     "preflight: host n2 has edgetrain_arch 'armv7l'; set it to one of aarch64, x86_64"),
    ({"edgetrain_mpi_user": "Bad User"}, "host n2 in {inv}: edgetrain_mpi_user 'Bad User' is not a valid user name",
     "preflight: host n2 has edgetrain_mpi_user \"Bad User\"; it is not a valid user name."),
    # Types are exact: a YAML true is no port (Python's int(True) is 1), 22.9 no port, 3.99 no count of slots.
    ({"ansible_port": True}, "host n2 in {inv}: ansible_port is True, not a port number",
     "preflight: host n2 has ansible_port 'True'; it must be a port number from 1 to 65535."),
    ({"ansible_port": 22.9}, "host n2 in {inv}: ansible_port is 22.9, not a port number",
     "preflight: host n2 has ansible_port '22.9'; it must be a port number from 1 to 65535."),
    ({"edgetrain_slots": 3.99}, "host n2 in {inv}: edgetrain_slots is 3.99, not a number of slots",
     "preflight: host n2 has edgetrain_slots '3.99'; it must be a number of slots from 1 to 4096."),
    # Informational, yet checked: it reaches reports as it is.
    ({"edgetrain_model": "pi 5"}, "host n2 in {inv}: edgetrain_model 'pi 5' " + MODEL_PROBLEM,
     "preflight: host n2 has edgetrain_model \"pi 5\"; it " + MODEL_PROBLEM + "."),
], ids=["slots", "lease", "arch", "mpi-user", "port-true", "port-fraction", "slots-fraction", "model"])
def test_the_cli_and_the_preflight_play_refuse_the_same_values(tmp_path, node2, cli, play):
    inv = write(tmp_path, **node2)
    assert_one_line_error(edgetrain("run", "lenet", "-i", inv, "--runs-dir", str(tmp_path / "runs")), cli.format(inv=inv))
    ran = Playbook(ROOT, inv).run("playbooks/preflight.yml", timeout=300)
    assert ran.returncode != 0 and play in " ".join(ran.output.split()), ran.output[-3000:]
    assert "PLAY [Preflight - gather facts" not in ran.output  # no node was contacted


def test_the_shortest_lease_is_three_renewals_and_sshs_timeout():
    """The schema's minimum is what the controller's renewal needs (edgetrain.controller.containers)."""
    schema = json.loads((ROOT / "edgetrain" / "controller" / "inventory.schema.json").read_text())
    assert schema["properties"]["edgetrain_lease_seconds"]["minimum"] == containers.MIN_LEASE == 3 * containers.LEASE_RENEW + SSH_TIMEOUT
