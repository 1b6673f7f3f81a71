"""Least privilege in provisioning: sshd takes keys only from the two users edgetrain needs, the MPI
user is not given the engine, the cluster key's line is restricted.

The sshd tasks run for real with ansible-playbook against this machine (connection local), their
drop-in pointed into a temp dir and checked by this machine's sshd; nothing is reloaded. The docker
role's default is rendered by Ansible itself. The cluster key's line needs a whole cluster to be
written (tests/cluster/test_provisioning.py checks it there), so here the task's text is read."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.playbook import Playbook, Result

ROOT = Path(__file__).resolve().parents[2]


class Node:
    """This machine as an inventory host, and a play that runs one role's tasks on it."""

    def __init__(self, d: Path, tasks: str) -> None:
        self.d = d
        (d / "hosts.yml").write_text(f"all:\n  hosts:\n    pi1:\n      ansible_connection: local\n"
                                     f"      ansible_python_interpreter: {ROOT / '.venv/bin/python'}\n")
        (d / "play.yml").write_text(f"---\n- name: Least privilege\n  hosts: pi1\n  gather_facts: false\n  tasks:\n{tasks}")

    def run(self, *args: str, **variables) -> Result:
        varfile = self.d / "vars.json"
        varfile.write_text(json.dumps(variables))
        return Playbook(ROOT, str(self.d / "hosts.yml")).run(str(self.d / "play.yml"), "-e", f"@{varfile}", *args, timeout=300)


SSHD_TASKS = "    - name: Sshd\n      ansible.builtin.include_role:\n        name: ssh_mesh\n        tasks_from: sshd\n"


@pytest.fixture
def sshd(tmp_path) -> tuple[Node, dict]:
    drop_in = tmp_path / "sshd_config.d" / "edgetrain.conf"
    drop_in.parent.mkdir()
    return Node(tmp_path, SSHD_TASKS), {"ansible_user": "pi", "edgetrain_mpi_user": "mpi", "ssh_mesh_sshd_config": str(drop_in),
                                        "ssh_mesh_sshd_reload": False}


def test_sshd_takes_keys_only_from_the_login_and_mpi_users(sshd):
    node, variables = sshd
    node.run(**variables).check()
    drop_in = Path(variables["ssh_mesh_sshd_config"])
    lines = [line for line in drop_in.read_text().splitlines() if not line.startswith("#")]
    assert lines == ["AuthenticationMethods publickey", "AllowUsers pi mpi"]
    assert node.run(**variables).check().changed() == {"pi1": 0}


def test_check_mode_writes_nothing_and_its_reload_does_not_fail(sshd):
    node, variables = sshd
    result = node.run("--check", **{**variables, "ssh_mesh_sshd_reload": True}).check()
    assert not Path(variables["ssh_mesh_sshd_config"]).exists()
    assert "RUNNING HANDLER [ssh_mesh : Reload sshd]" in result.output


@pytest.mark.parametrize(("change", "said"), [
    ({"ansible_password": "raspberry"}, "Ansible logs in as pi with a password."),
    ({"ansible_user": None}, "Ansible logs in as an unset ansible_user."),
], ids=["password", "no-user"])
def test_a_login_sshd_would_refuse_is_refused_before_sshd_changes(sshd, change, said):
    node, variables = sshd
    variables = {k: v for k, v in {**variables, **change}.items() if v is not None}
    result = node.run(**variables)
    assert result.returncode != 0, result.output[-3000:]
    flat = " ".join(result.output.split())
    assert f"ssh_mesh: sshd on pi1 will take keys only, from {'pi, mpi' if 'ansible_user' in variables else 'mpi'}; {said}" in flat
    assert not Path(variables["ssh_mesh_sshd_config"]).exists()


def test_the_mpi_user_is_not_given_the_docker_engine(tmp_path):
    tasks = "    - name: Users\n      ansible.builtin.debug:\n        msg: \"USERS {{ docker_users | to_json }}\"\n"
    node = Node(tmp_path, tasks)
    (tmp_path / "play.yml").write_text((tmp_path / "play.yml").read_text().replace(
        "  tasks:\n", f"  vars_files: [{ROOT / 'roles/docker/defaults/main.yml'}]\n  tasks:\n"))
    said = node.run(ansible_user="pi", edgetrain_mpi_user="mpi").check().output
    assert '"msg": "USERS [\\"pi\\"]"' in said, said[-2000:]


def test_the_cluster_keys_line_is_restricted():
    tasks = yaml.safe_load((ROOT / "roles/ssh_mesh/tasks/main.yml").read_text())
    [task] = [t for t in tasks if t["name"].startswith("Authorize the cluster key")]
    assert task["ansible.builtin.lineinfile"]["line"].startswith('restrict,from="{{ ')
