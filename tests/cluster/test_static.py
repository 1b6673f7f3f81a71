"""The playbooks and roles parse, lint clean (production profile) and the example inventory keeps the contract."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.playbook import Playbook, tool

from .conftest import ROOT

PLAYBOOKS = sorted(str(p.relative_to(ROOT)) for p in (ROOT / "playbooks").glob("*.yml"))


def _run(*argv: str) -> subprocess.CompletedProcess:
    env = Playbook(ROOT, "").env()
    return subprocess.run(list(argv), cwd=ROOT, env=env, text=True, capture_output=True, timeout=600)


@pytest.mark.parametrize("inventory", ["inventories/example", "inventories/local"])
def test_syntax_check(inventory):
    r = _run(tool("ansible-playbook"), "--syntax-check", "-i", inventory, "playbooks/site.yml")
    assert r.returncode == 0, r.stdout + r.stderr


def test_ansible_lint_production_profile():
    r = _run(tool("ansible-lint"), "--profile", "production", "--offline", "ansible.cfg", "playbooks", "roles", "inventories")
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-4000:]


def test_yamllint():
    r = _run(tool("yamllint"), "--strict", "playbooks", "roles", "inventories", ".yamllint", ".ansible-lint")
    assert r.returncode == 0, r.stdout + r.stderr


def test_example_inventory_keeps_the_contract():
    r = _run(tool("ansible-inventory"), "-i", "inventories/example", "--list")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert set(data["cluster"]["children"]) == {"head", "rpi", "gpu"}
    assert len(data["head"]["hosts"]) == 1
    hostvars = data["_meta"]["hostvars"]
    for host, hv in hostvars.items():
        for var in ("ansible_host", "ansible_user", "edgetrain_arch", "edgetrain_slots", "edgetrain_iface",
                    "edgetrain_runtime", "edgetrain_mpi_user"):
            assert var in hv, (host, var)
        assert hv["edgetrain_arch"] in ("aarch64", "x86_64")
        assert int(hv["edgetrain_slots"]) >= 1
    assert {hv["edgetrain_arch"] for h, hv in hostvars.items() if h in data["rpi"]["hosts"]} == {"aarch64"}
    assert {hv["edgetrain_arch"] for h, hv in hostvars.items() if h in data["gpu"]["hosts"]} == {"x86_64"}
