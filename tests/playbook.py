"""Run the project's playbooks the way a user does, and read their PLAY RECAP."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

RECAP = re.compile(
    r"^(?P<host>\S+)\s+:\s+ok=(?P<ok>\d+)\s+changed=(?P<changed>\d+)\s+unreachable=(?P<unreachable>\d+)"
    r"\s+failed=(?P<failed>\d+)\s+skipped=(?P<skipped>\d+)\s+rescued=(?P<rescued>\d+)\s+ignored=(?P<ignored>\d+)",
    re.M,
)


def tool(name: str) -> str:
    """An Ansible tool from the environment running the tests."""
    return str(Path(sys.executable).parent / name)


@dataclass
class Result:
    args: list[str]
    returncode: int
    output: str
    seconds: float

    @property
    def recap(self) -> dict[str, dict[str, int]]:
        tail = self.output.rsplit("PLAY RECAP", 1)[-1] if "PLAY RECAP" in self.output else ""
        return {m["host"]: {k: int(v) for k, v in m.groupdict().items() if k != "host"} for m in RECAP.finditer(tail)}

    def changed(self) -> dict[str, int]:
        return {h: r["changed"] for h, r in self.recap.items()}

    def changed_tasks(self) -> list[str]:
        """'TASK name: host' for every task result reported as changed."""
        found, task = [], None
        for line in self.output.splitlines():
            if line.startswith(("TASK [", "RUNNING HANDLER [")):
                task = line.split("[", 1)[1].rsplit("]", 1)[0]
            elif line.startswith("changed: ["):
                found.append(f"{task}: {line.split('[', 1)[1].split(']', 1)[0]}")
        return found

    def check(self) -> Result:
        bad = {h: r for h, r in self.recap.items() if r["failed"] or r["unreachable"]}
        assert self.returncode == 0 and not bad, f"{' '.join(self.args)} failed ({self.returncode}):\n{self.output[-6000:]}"
        return self


class Playbook:
    def __init__(self, project: Path, inventory: str):
        self.project = project
        self.inventory = inventory

    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "ANSIBLE_CONFIG": str(self.project / "ansible.cfg"),
            "ANSIBLE_NOCOLOR": "1",
            "ANSIBLE_FORCE_COLOR": "0",
            "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        }

    def run(self, playbook: str, *args: str, inventory: str | None = None, timeout: float = 900) -> Result:
        argv = [tool("ansible-playbook"), "-i", inventory or self.inventory, playbook, *args]
        start = time.monotonic()
        proc = subprocess.run(argv, cwd=self.project, env=self.env(), text=True, capture_output=True, timeout=timeout)
        return Result(argv, proc.returncode, proc.stdout + proc.stderr, time.monotonic() - start)
