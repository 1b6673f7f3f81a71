"""Commands on the nodes, reached over ssh exactly as Ansible reaches them (same inventory variables).

One ``Nodes`` session multiplexes every command to a node over a single ssh connection (OpenSSH
ControlMaster), so the many short commands of a run cost one handshake per node, and closes
those connections when it ends.
"""

from __future__ import annotations

import fnmatch
import io
import os
import shlex
import shutil
import subprocess
import tarfile
import tempfile
import threading
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from edgetrain.shared import checkpoints, tempdirs
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.layout import RunLayout
from edgetrain.controller.inventory import Host

UNREACHABLE = 255  # ssh's own exit status: the command never ran
# Where tarfile has extraction filters, the members extract() gets were vetted here already.
TRUSTED: dict[str, Any] = {"filter": "fully_trusted"} if hasattr(tarfile, "fully_trusted_filter") else {}
PROTECTED = frozenset({RunLayout.RECORD})  # the controller's own record: no node may overwrite it


def _move_into(src: Path, dest: Path) -> None:
    """Rename every file under ``src`` to the same place under ``dest`` (same file system)."""
    for path in sorted(src.rglob("*")):
        target = dest / path.relative_to(src)
        if path.is_dir():
            target.mkdir(exist_ok=True)
        else:
            os.replace(path, target)


@dataclass(frozen=True)
class Caps:
    """The most one fetch takes from a node: a node that sends more (a runaway log, a hostile
    archive) cannot fill this machine's disk or hold the controller."""

    bytes: int = 4 << 30
    members: int = 100_000


class _OverCap(Exception):
    pass


class _Unpacking:
    """One tar stream unpacked member by member into a directory: what was refused, and the
    member the stream was cut in or stopped at (None when it ended whole); a member that did not
    come whole is removed, so every file left is whole."""

    def __init__(self, names: list[str], caps: Caps) -> None:
        self.names, self.caps = names, caps
        self.refused: list[str] = []
        self.cut: str | None = None
        self.over: str | None = None
        self.members = self.bytes = 0

    def accepted(self, member: tarfile.TarInfo) -> bool:
        name = member.name.rstrip("/")
        top = name.split("/", 1)[0]
        if not checkpoints.confined(name):
            self.refused.append(f"{member.name} (not a name inside the directory)")
            return False
        if not any(fnmatch.fnmatchcase(top, n) for n in self.names) or top in PROTECTED:
            self.refused.append(f"{member.name} (not asked for)")
            return False
        if not (member.isfile() or member.isdir()):
            self.refused.append(f"{member.name} (a link or special file)")
            return False
        self.members += 1
        self.bytes += member.size
        if self.members > self.caps.members:
            raise _OverCap(f"more than {self.caps.members} files")
        if self.bytes > self.caps.bytes:
            raise _OverCap(f"more than {self.caps.bytes} bytes")
        return True

    def run(self, stream: IO[bytes], into: Path) -> None:
        current = last = None  # the member being unpacked, the last one unpacked whole
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for current in tar:
                    if self.accepted(current):
                        # Vetted above (a plain file or directory, a confined name, into a new
                        # directory), so no tarfile filter is needed: Python 3.11.2, Debian
                        # bookworm's, has none.
                        tar.extract(current, into, set_attrs=False, **TRUSTED)
                    last, current = current, None
        except _OverCap as exc:
            assert current is not None  # accepted() refused it
            self.cut, self.over = current.name, str(exc)
        except tarfile.ReadError:
            if current is not None:
                self.cut = current.name
                if current.isfile():
                    (into / current.name).unlink(missing_ok=True)
            elif last is not None:
                self.cut = f"the file after {last.name}"
            # else no archive at all: judged by ssh's status


# Seconds until ssh gives up on a node: to connect, or once a connection's keepalives go unanswered.
SSH_TIMEOUT = 15
# A new connection's time to answer (connect, log in, run ``true``) once the shared one broke. The
# TCP handshake is the kernel's and the SSH handshake a Pi's sshd does in a fraction of a second even
# while training, so only a node out of reach takes this long.
CONFIRM_TIMEOUT = 10


def ssh_command(host: Host, *options: str, connect_timeout: int = SSH_TIMEOUT) -> list[str]:
    """ssh to a node with the inventory's address, port, user, key and extra arguments."""
    hv = host.vars
    # Keepalives: a link that goes dark (packets dropped, no reset) ends the connection in ~15 s
    # instead of TCP's minutes, so no call to a node can hang the controller.
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", f"ConnectTimeout={connect_timeout}", "-o", f"ServerAliveInterval={SSH_TIMEOUT // 3}",
           "-o", "ServerAliveCountMax=3", "-p", str(host.port), *options]
    if hv.get("ansible_ssh_private_key_file"):
        cmd += ["-i", str(hv["ansible_ssh_private_key_file"])]
    for key in ("ansible_ssh_common_args", "ansible_ssh_extra_args"):
        cmd += shlex.split(str(hv.get(key) or ""))
    return [*cmd, "--", host.ssh_target]


def tar_bytes(files: dict[str, tuple[bytes, int]]) -> bytes:
    """A tar archive of ``{path: (content, mode)}``, to unpack on the other side of a pipe."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w") as tar:
        for name, (data, mode) in files.items():
            info = tarfile.TarInfo(name.lstrip("/"))
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _judge(what: str, unpacking: _Unpacking, code: int, err: str, timeout: float) -> None:
    """One error for a copy that did not come whole: over its caps, out of time, no way to the
    node, or a stream cut short."""
    if unpacking.over is not None:
        raise EdgetrainError(f"{what} stopped at {unpacking.cut}: {unpacking.over}", "look at what the run left in that directory on the node")
    if code == -9:
        raise EdgetrainError(f"{what} did not finish within {timeout:.0f} s", "check that the node is up and reachable")
    if code == UNREACHABLE:
        raise EdgetrainError(f"{what} failed: {err}", "check that the node is up and reachable")
    if unpacking.cut is not None:
        raise EdgetrainError(f"{what} was cut short in {unpacking.cut} (the files that came whole were kept)",
                             "check the link to the node, then copy again")


CONTROL_PERSIST = 60


class Nodes:
    """Runs commands on inventory hosts; local hosts run them directly."""

    def __init__(self) -> None:
        # ssh's connection sockets; the directory of a controller killed outright goes with the next one's
        self._dir = Path(tempdirs.make("ssh"))
        self._used: dict[str, Host] = {}

    def argv(self, host: Host, command: list[str]) -> list[str]:
        if host.is_local:
            return command
        self._used[host.name] = host
        # %C hashes host, port and user: a short socket path whatever the names. A run uses its
        # connection every few seconds (leases, looks); if this edgetrain is killed, its masters
        # (and their sessions on the nodes) end CONTROL_PERSIST seconds after their last use.
        mux = ("-o", "ControlMaster=auto", "-o", f"ControlPath={self._dir}/%C", "-o", f"ControlPersist={CONTROL_PERSIST}")
        return [*ssh_command(host, *mux), shlex.join(command)]

    def run(self, host: Host, command: list[str], *, input: bytes | str | None = None,
            timeout: float | None = 120) -> subprocess.CompletedProcess:
        text = not isinstance(input, bytes)
        try:
            # A command that reads nothing gets no terminal: ssh would set it non-blocking, and a
            # killed ssh leaves it so, breaking every later program that reads it (ansible-inventory).
            return subprocess.run(self.argv(host, command), input=input, capture_output=True, text=text, timeout=timeout,
                                  stdin=None if input is not None else subprocess.DEVNULL, check=False)
        except subprocess.TimeoutExpired:
            raise EdgetrainError(f"{host.name} did not answer within {timeout:.0f} s: {shlex.join(command)}",
                                 "check that the node is up and reachable") from None

    def answers(self, host: Host, seconds: int = CONFIRM_TIMEOUT) -> bool:
        """Whether a new connection (not the shared one, which may be what broke) reaches the node
        and runs a command within ``seconds``: the second opinion before a node is called lost."""
        if host.is_local:
            return True
        argv = [*ssh_command(host, "-o", "ControlPath=none", connect_timeout=seconds), "true"]
        try:
            # The whole exchange within ``seconds``: ConnectTimeout bounds only its first part.
            return subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, timeout=seconds, check=False).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    def check(self, host: Host, command: list[str], what: str, fix: str | None = None, **kw) -> str:
        """Run a command that must succeed; its stdout, or one error naming the node and the cause."""
        proc = self.run(host, command, **kw)
        if proc.returncode == 0:
            return proc.stdout if isinstance(proc.stdout, str) else proc.stdout.decode()
        err = proc.stderr if isinstance(proc.stderr, str) else proc.stderr.decode(errors="replace")
        last = (err.strip().splitlines() or [f"exit status {proc.returncode}"])[-1]
        if proc.returncode == UNREACHABLE and not host.is_local:
            raise EdgetrainError(f"cannot reach {host.name} ({host.address}) over ssh: {last}",
                                 fix or "check its address, user and key in the inventory")
        raise EdgetrainError(f"{what} on {host.name} failed: {last}", fix)

    def fetch(self, host: Host, directory: str, names: Iterable[str], dest: Path, timeout: float = 300,
              caps: Caps = Caps()) -> list[str]:
        """Copy files (globs allowed) from a directory on a node into ``dest``, through tar.

        Only what was asked for is accepted - regular files and directories whose top-level name
        matches one of ``names``; never a link, a device, or a file the controller keeps itself
        (``run.json``): a node cannot write anything else here. Only whole files replace what
        ``dest`` holds: a copy cut short (a dropped link, a timeout, a node over ``caps``) keeps the
        files that came whole, leaves the old version of the rest, and is one error naming it.
        Returns what was refused."""
        names = list(names)
        dest.mkdir(parents=True, exist_ok=True)
        # Unpacked beside the destination first, then each file renamed into place: a full disk
        # mid-copy leaves every file there whole (its old version, or the new one), never a part.
        try:
            incoming = Path(tempfile.mkdtemp(dir=dest, prefix=".incoming-"))
        except OSError as exc:
            raise EdgetrainError(f"cannot write {dest}: {exc.strerror or exc}", "free some disk on this machine") from None
        # Names that match nothing are skipped (a run that died early has fewer files).
        script = f"cd {shlex.quote(directory)} && exec tar -cf - --ignore-failed-read -- {' '.join(names)} 2>/dev/null"
        proc = subprocess.Popen(self.argv(host, ["sh", "-c", script]), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        # A node that stops answering mid-copy must not hold the controller: the copy is abandoned.
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        unpacking = _Unpacking(names, caps)
        try:
            unpacking.run(proc.stdout, incoming)
        except OSError as exc:
            proc.kill()
            shutil.rmtree(incoming, ignore_errors=True)
            raise EdgetrainError(f"cannot write {dest}: {exc.strerror or exc}", "free some disk on this machine") from None
        finally:
            timer.cancel()
            if unpacking.over is not None:
                proc.kill()  # nothing more is read
            proc.stdout.close()
            err = proc.stderr.read().decode(errors="replace").strip()
            code = proc.wait()
        try:
            _move_into(incoming, dest)
        except OSError as exc:
            raise EdgetrainError(f"cannot write {dest}: {exc.strerror or exc}", "free some disk on this machine") from None
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
        _judge(f"copying {directory} from {host.name}", unpacking, code, err, timeout)
        if code != 0 and "cd:" in err:
            raise EdgetrainError(f"{directory} does not exist on {host.name}")
        return unpacking.refused

    def close(self) -> None:
        for host in self._used.values():
            subprocess.run([*ssh_command(host, "-o", f"ControlPath={self._dir}/%C", "-O", "exit")],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30, check=False)
        self._used.clear()
        shutil.rmtree(self._dir, ignore_errors=True)

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
