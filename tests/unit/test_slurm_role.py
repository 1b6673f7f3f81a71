"""slurm.conf is one file on every node, rendered from every node's variables and facts (issue 80,
item 11): ``slurm_cpus: "4\\nPrologFlags=Alloc\\nProlog=evil.sh"`` on one host made a Prolog= line
that every slurmd would run as root, and the role's argument_specs check only the host it runs on.

The role's checks and its template run for real with ansible-playbook on this machine (connection
local); the other hosts of the cluster group are never contacted: their values are read from the
inventory, as the role reads them."""

from __future__ import annotations

import json
from pathlib import Path

from tests.playbook import Playbook

ROOT = Path(__file__).resolve().parents[2]
ROLE = ROOT / "roles" / "slurm"
GOOD = {"slurm_cpus": 4, "slurm_real_memory": 3800, "edgetrain_arch": "aarch64"}


def _play(tmp_path: Path, checks: bool, **hosts: dict) -> tuple[int, str, Path]:
    """The role's checks (or none), then slurm.conf rendered into tmp_path, on node0; hosts' variables as given."""
    out = tmp_path / "slurm.conf"
    inventory = {"cluster": {"children": {
        "head": {"hosts": {"node0": {**GOOD, "ansible_host": "198.18.0.10", "ansible_connection": "local",
                                    "ansible_python_interpreter": str(ROOT / ".venv/bin/python")}}},
        "rpi": {"hosts": {name: {**GOOD, "ansible_host": f"198.18.0.{11 + i}", **v} for i, (name, v) in enumerate(hosts.items())}}}}}
    (tmp_path / "hosts.json").write_text(json.dumps(inventory))
    check = (f"    - name: Checks\n      ansible.builtin.include_tasks: {ROLE / 'tasks/check.yml'}\n") if checks else ""
    (tmp_path / "play.yml").write_text(
        f"---\n- name: slurm.conf\n  hosts: node0\n  gather_facts: false\n"
        f"  vars_files: [{ROLE / 'defaults/main.yml'}, {ROLE / 'vars/main.yml'}]\n  tasks:\n{check}"
        f"    - name: Render\n      ansible.builtin.template:\n        src: {ROLE / 'templates/slurm.conf.j2'}\n        dest: {out}\n"
        f"        mode: '0644'\n")
    r = Playbook(ROOT, str(tmp_path / "hosts.json")).run(str(tmp_path / "play.yml"), timeout=300)
    return r.returncode, " ".join(r.output.split()), out


def test_every_hosts_values_are_checked_not_only_the_one_the_role_runs_on(tmp_path):
    code, said, out = _play(tmp_path, True,
                            pi1={"slurm_cpus": "4\nPrologFlags=Alloc\nProlog=evil.sh"},
                            pi2={"ansible_host": "198.18.0.12 Prolog=evil.sh"},
                            pi3={"edgetrain_arch": "aarch64\nProlog=evil.sh"},
                            pi4={"slurm_real_memory": "3800\n"},  # Ansible's match takes it for ^[0-9]+$
                            pi5={})
    assert code != 0 and not out.exists()
    for name in ("pi1", "pi2", "pi3", "pi4"):
        assert f'slurm: host "{name}": its name, ansible_host, edgetrain_arch' in said, said[-3000:]
    assert 'slurm: host "pi5"' not in said


def test_plain_values_make_one_line_per_node(tmp_path):
    code, said, out = _play(tmp_path, True, pi1={})
    assert code == 0, said[-3000:]
    assert [line for line in out.read_text().splitlines() if line.startswith("NodeName=")] == [
        "NodeName=node0 NodeAddr=198.18.0.10 CPUs=4 RealMemory=3800 Feature=aarch64 State=UNKNOWN",
        "NodeName=pi1 NodeAddr=198.18.0.11 CPUs=4 RealMemory=3800 Feature=aarch64 State=UNKNOWN"]


def test_the_template_types_its_numbers_even_unchecked(tmp_path):
    code, said, out = _play(tmp_path, False, pi1={"slurm_cpus": "4\nPrologFlags=Alloc\nProlog=evil.sh"})
    assert code == 0, said[-3000:]
    text = out.read_text()
    assert "Prolog" not in text and "NodeName=pi1 NodeAddr=198.18.0.11 CPUs=0 RealMemory=3800" in text
