"""MPICH's Hydra launcher: where ``mpirun`` is, which MPICH it is, and what its output says about how ranks ended."""

from __future__ import annotations

import re
import shutil
import subprocess

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
    out = subprocess.run([mpirun, "--version"], capture_output=True, text=True).stdout
    m = re.search(r"Version:\s*(\S+)", out)
    return m.group(1) if m else "unknown"


def mpirun_argv(mpirun: str, machinefile: str, np: int, iface: str | None, env: dict[str, str], ssh: bool) -> list[str]:
    """``mpirun -f MACHINEFILE -n N [-iface IF] [-bootstrap ssh] [-genv K V ...]``; the command follows."""
    argv = [mpirun, "-f", machinefile, "-n", str(np)]
    if iface:
        argv += ["-iface", iface]
    if ssh:
        argv += ["-bootstrap", "ssh"]
    for k, v in env.items():
        argv += ["-genv", k, v]
    return argv


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
