"""MPICH's Hydra launcher: where ``mpirun`` is, which MPICH it is, and what its output says about how ranks ended."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from dataclasses import asdict, dataclass

from edgetrain.shared.errors import EdgetrainError

# Hydra's report of a process that died without finalizing (killed, crashed, out of memory).
BAD_TERMINATION = re.compile(r"PID (\d+) RUNNING AT (\S+)")
EXIT_CODE = re.compile(r"EXIT CODE: (\d+)")
# Hydra's ssh to a node that went away (container gone, or no answer to keepalives).
SSH_LOST = re.compile(r"Connection to (\S+) closed by remote host|Timeout, server (\S+) not responding")
# Hydra's ssh to a node it could not reach at all (nothing listening, no route, a firewall).
SSH_UNREACHED = re.compile(r"ssh: connect to host (\S+) port \d+: (.+)")


def mpirun_path() -> str:
    exe = shutil.which("mpirun")
    if exe is None:
        raise EdgetrainError("mpirun is not on PATH", "install MPICH (apt-get install mpich, or: make setup)")
    return exe


def mpich_version(mpirun: str) -> str:
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True, check=False).stdout
    m = re.search(r"Version:\s*(\S+)", out)
    return m.group(1) if m else "unknown"


# A rank of a job that holds one host's share of a run (HostJob) is numbered from the job's first
# rank, in a run of this many ranks; Hydra numbers it within its job (PMI_RANK, PMI_SIZE).
RANK_BASE = "EDGETRAIN_RANK_BASE"
WORLD_SIZE = "EDGETRAIN_WORLD_SIZE"


def rank_and_size(env: Mapping[str, str] = os.environ) -> tuple[int, int]:
    """This process's rank in the run, and the run's size."""
    rank = int(env.get("PMI_RANK", "0")) + int(env.get(RANK_BASE, "0"))
    return rank, int(env.get(WORLD_SIZE) or env.get("PMI_SIZE", "1"))


@dataclass(frozen=True)
class Hydra:
    """How ``mpirun`` starts where it runs: its path, the placement's machinefile there, the
    cluster interface, whether it reaches the nodes over ssh, and what every rank's environment gets."""

    exe: str
    machinefile: str
    iface: str | None
    ssh: bool
    env: dict[str, str]

    def argv(self, np: int, hosts: list[str] | None = None, env: dict[str, str] | None = None) -> list[str]:
        """``mpirun -f MACHINEFILE -n N [-iface IF] [-bootstrap ssh] [-genv K V ...]``, the command to
        follow; with ``hosts`` (``host:count`` each), ``-hosts`` instead of the machinefile."""
        argv = [self.exe, *(["-hosts", ",".join(hosts)] if hosts else ["-f", self.machinefile]), "-n", str(np)]
        if self.iface:
            argv += ["-iface", self.iface]
        if self.ssh:
            argv += ["-bootstrap", "ssh"]
        # Hydra reads a name holding "=" as NAME=VALUE, and the value after it as the program to run:
        # the inventory's names are variable names (edgetrain.controller.inventory's schema).
        for k, v in {**self.env, **(env or {})}.items():
            argv += ["-genv", k, v]
        return argv


@dataclass(frozen=True)
class HostJob:
    """One host's ranks as a Hydra job of their own, for a strategy whose run can go on without
    some of them (edgetrain.rank.hostjobs): Hydra ends a whole job when one of its nodes is lost."""

    host: str
    ranks: tuple[int, ...]
    expendable: bool  # the run goes on without them; the first job (rank 0's) never is
    argv: tuple[str, ...]


def encode_jobs(jobs: list[HostJob]) -> str:
    return json.dumps([asdict(j) for j in jobs], separators=(",", ":"))


def decode_jobs(text: str) -> list[HostJob]:
    return [HostJob(j["host"], tuple(j["ranks"]), bool(j["expendable"]), tuple(j["argv"])) for j in json.loads(text)]


def terminated(output: str) -> tuple[str, str, int | None] | None:
    """(pid, machinefile entry, exit code) of the process Hydra reports as ended badly, if any."""
    m = BAD_TERMINATION.search(output)
    if m is None:
        return None
    code = EXIT_CODE.search(output)
    return m.group(1), m.group(2), int(code.group(1)) if code else None


def lost_node(output: str) -> str | None:
    """The address of a node whose ssh connection Hydra reports lost."""
    m = SSH_LOST.search(output)
    return (m.group(1) or m.group(2)) if m else None


def unreached(output: str) -> tuple[str, str] | None:
    """(address, ssh's reason) of a node Hydra's ssh could not connect to."""
    m = SSH_UNREACHED.search(output)
    return (m.group(1), m.group(2).strip()) if m else None
