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
from pathlib import Path

from edgetrain.shared.errors import EdgetrainError
from edgetrain.controller.inventory import Host

UNREACHABLE = 255  # ssh's own exit status: the command never ran
PROTECTED = frozenset({"run.json"})  # the controller's own record: no node may overwrite it


def _move_into(src: Path, dest: Path) -> None:
    """Rename every file under ``src`` to the same place under ``dest`` (same file system)."""
    for path in sorted(src.rglob("*")):
        target = dest / path.relative_to(src)
        if path.is_dir():
            target.mkdir(exist_ok=True)
        else:
            os.replace(path, target)


def ssh_command(host: Host, *options: str) -> list[str]:
    """ssh to a node with the inventory's address, port, user, key and extra arguments."""
    hv = host.vars
    # Keepalives: a link that goes dark (packets dropped, no reset) ends the connection in ~15 s
    # instead of TCP's minutes, so no call to a node can hang the controller.
    cmd = ["ssh", "-o", "BatchMode=yes", "-o", "ConnectTimeout=15", "-o", "ServerAliveInterval=5",
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


class Nodes:
    """Runs commands on inventory hosts; local hosts run them directly."""

    def __init__(self) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="edgetrain-ssh-")
        self._used: dict[str, Host] = {}

    def argv(self, host: Host, command: list[str]) -> list[str]:
        if host.is_local:
            return command
        self._used[host.name] = host
        # %C hashes host, port and user: a short socket path whatever the names.
        mux = ("-o", "ControlMaster=auto", "-o", f"ControlPath={self._dir.name}/%C", "-o", "ControlPersist=300")
        return [*ssh_command(host, *mux), shlex.join(command)]

    def run(self, host: Host, command: list[str], *, input: bytes | str | None = None,
            timeout: float | None = 120) -> subprocess.CompletedProcess:
        text = not isinstance(input, bytes)
        try:
            # A command that reads nothing gets no terminal: ssh would set it non-blocking, and a
            # killed ssh leaves it so, breaking every later program that reads it (ansible-inventory).
            return subprocess.run(self.argv(host, command), input=input, capture_output=True, text=text, timeout=timeout,
                                  **({} if input is not None else {"stdin": subprocess.DEVNULL}))
        except subprocess.TimeoutExpired:
            raise EdgetrainError(f"{host.name} did not answer within {timeout:.0f} s: {shlex.join(command)}",
                                 "check that the node is up and reachable") from None

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

    def fetch(self, host: Host, directory: str, names: Iterable[str], dest: Path, timeout: float = 300) -> list[str]:
        """Copy files (globs allowed) from a directory on a node into ``dest``, through tar.

        Only what was asked for is accepted - regular files and directories whose top-level name
        matches one of ``names``; never a link, a device, or a file the controller keeps itself
        (``run.json``): a node cannot write anything else here. Returns what was refused."""
        names = list(names)
        dest.mkdir(parents=True, exist_ok=True)
        refused: list[str] = []
        # Unpacked beside the destination first, then each file renamed into place: a full disk
        # mid-copy leaves every file there whole (its old version, or the new one), never a part.
        try:
            incoming = Path(tempfile.mkdtemp(dir=dest, prefix=".incoming-"))
        except OSError as exc:
            raise EdgetrainError(f"cannot write {dest}: {exc.strerror or exc}", "free some disk on this machine") from None

        def accepted(member: tarfile.TarInfo, path: str) -> tarfile.TarInfo | None:
            top = member.name.split("/", 1)[0]
            if not any(fnmatch.fnmatchcase(top, n) for n in names) or top in PROTECTED:
                refused.append(f"{member.name} (not asked for)")
                return None
            if not (member.isfile() or member.isdir()):
                refused.append(f"{member.name} (a link or special file)")
                return None
            return tarfile.data_filter(member, path)

        # Names that match nothing are skipped (a run that died early has fewer files).
        script = f"cd {shlex.quote(directory)} && exec tar -cf - --ignore-failed-read -- {' '.join(names)} 2>/dev/null"
        proc = subprocess.Popen(self.argv(host, ["sh", "-c", script]), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE)
        assert proc.stdout is not None and proc.stderr is not None
        # A node that stops answering mid-copy must not hold the controller: the copy is abandoned.
        timer = threading.Timer(timeout, proc.kill)
        timer.start()
        try:
            with tarfile.open(fileobj=proc.stdout, mode="r|") as tar:
                tar.extractall(incoming, filter=accepted)
        except tarfile.ReadError:
            pass  # no archive at all: judged by ssh's status below
        except OSError as exc:
            proc.kill()
            shutil.rmtree(incoming, ignore_errors=True)
            raise EdgetrainError(f"cannot write {dest}: {exc.strerror or exc}", "free some disk on this machine") from None
        finally:
            timer.cancel()
            proc.stdout.close()
            err = proc.stderr.read().decode(errors="replace").strip()
            code = proc.wait()
        try:
            _move_into(incoming, dest)
        except OSError as exc:
            raise EdgetrainError(f"cannot write {dest}: {exc.strerror or exc}", "free some disk on this machine") from None
        finally:
            shutil.rmtree(incoming, ignore_errors=True)
        if code == -9:
            raise EdgetrainError(f"copying {directory} from {host.name} did not finish within {timeout:.0f} s",
                                 "check that the node is up and reachable")
        if code == UNREACHABLE:
            raise EdgetrainError(f"copying {directory} from {host.name} failed: {err}", "check that the node is up and reachable")
        if code != 0 and "cd:" in err:
            raise EdgetrainError(f"{directory} does not exist on {host.name}")
        return refused

    def close(self) -> None:
        for host in self._used.values():
            subprocess.run([*ssh_command(host, "-o", f"ControlPath={self._dir.name}/%C", "-O", "exit")],
                           stdin=subprocess.DEVNULL, capture_output=True, timeout=30)
        self._used.clear()
        self._dir.cleanup()

    def __enter__(self) -> Nodes:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
