"""Private Docker engines, for the testbed's nodes and the tests: one dockerd per call, its own root, socket and pid.

Nothing here touches a system engine: every engine lives under its own directory with its own
--data-root, --exec-root, unix socket and pidfile, has no bridge and no iptables rules, and is
stopped by the pid it was started with.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from .cpugroup import CpuGroup


@dataclass
class DockerEngine:
    root: Path
    host: str  # DOCKER_HOST value, unix://...
    process: subprocess.Popen | None  # None: an engine this harness did not start
    keep_root: bool = False
    # Where its containers' cgroups go (dockerd --cgroup-parent), removed when it stops.
    cgroup: CpuGroup | None = None

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process else None

    def env(self, base: dict[str, str] | None = None) -> dict[str, str]:
        return {**(os.environ if base is None else base), "DOCKER_HOST": self.host}

    def docker(self, *args: str, check: bool = True, **kwargs) -> subprocess.CompletedProcess:
        return subprocess.run(["docker", *args], env=self.env(), text=True, capture_output=True, check=check, **kwargs)

    def stop(self) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=30)
        self.process = None
        # An engine that died uncleanly leaves overlay mounts under its data-root.
        prefix = f"{self.root}/"
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()]
        for mount in sorted((m for m in mounts if m.startswith(prefix)), key=len, reverse=True):
            subprocess.run(["umount", "-l", mount], capture_output=True, check=False)
        if not self.keep_root:
            # rm, not shutil.rmtree: image layers are hundreds of thousands of files.
            subprocess.run(["rm", "-rf", "--one-file-system", str(self.root)], check=False)
        if self.cgroup is not None:
            self.cgroup.remove()


def reachable(host: str | None = None) -> bool:
    env = dict(os.environ)
    if host:
        env["DOCKER_HOST"] = host
    try:
        proc = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], env=env, capture_output=True, timeout=20, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return proc.returncode == 0


def why_unavailable() -> str | None:
    """Why this machine cannot start a private engine, or None when it can."""
    for tool in ("dockerd", "docker"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install docker.io)"
    if os.geteuid() != 0:
        return "starting a private dockerd needs root"
    return None


# Where an engine keeps what, below its root: one layout for every engine the tests start.
DATA, EXEC, SOCKET, PIDFILE, LOG = "data", "exec", "docker.sock", "docker.pid", "dockerd.log"
# dockerd gives the containerd it starts 15 s to answer, then exits ("timeout waiting for containerd
# to start"): a disk or CPU stalled that long by something else ends a start that would have worked.
START_ATTEMPTS = 3


def start(root: Path | None = None, *, enter: Sequence[str] = (), cgroup: CpuGroup | None = None,
          timeout: float = 90) -> DockerEngine:
    """Start dockerd under ``root`` (a new temp dir when None; a given root is kept, for caching).

    ``enter`` prefixes the command (an ``nsenter`` into a testbed node's namespaces, so that
    ``--network host`` containers see the node's address). Its containers go below ``cgroup``, or
    below a group of the engine's own, removed when it stops. An engine that exits while starting is
    started again, up to START_ATTEMPTS times, each exit's log shown as a warning; the last one
    raises with it.
    """
    keep = root is not None
    root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="edgetrain-docker-"))
    root.mkdir(parents=True, exist_ok=True)
    own_cgroup = cgroup is None
    # By default its containers (image builds among them) go in a group of its own below the one
    # the tests run in: they share its CPU (lab/capped.py), and the group goes with the engine
    # (dockerd leaves its default /docker behind).
    group = cgroup if cgroup is not None else CpuGroup.mine(root.name)
    cmd = [
        *enter, "dockerd",
        "--data-root", str(root / DATA),
        "--exec-root", str(root / EXEC),
        "-H", f"unix://{root / SOCKET}",
        "--pidfile", str(root / PIDFILE),
        "--storage-driver", "overlay2",
        "--iptables=false",
        "--ip-masq=false",
        "--bridge=none",
        f"--cgroup-parent=/{group.name}",
    ]
    deadline = time.monotonic() + timeout
    attempt = 0
    while True:
        attempt += 1
        with (root / LOG).open("ab") as log:
            offset = log.tell()
            process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                       start_new_session=True)
        engine = DockerEngine(root=root, host=f"unix://{root / SOCKET}", process=process, keep_root=keep,
                              cgroup=group if own_cgroup else None)
        while time.monotonic() < deadline and process.poll() is None:
            if (root / SOCKET).exists() and reachable(engine.host):
                return engine
            time.sleep(0.5)
        said = _log_tail(root / LOG, offset)
        exited = process.poll()
        if exited is not None and attempt < START_ATTEMPTS and time.monotonic() < deadline:
            warnings.warn(f"dockerd under {root} exited with {exited} while starting (attempt {attempt}); "
                          f"starting it again. It said:\n{said}", stacklevel=2)
            _end_abandoned_containerd(root)
            continue
        engine.stop()
        if exited is None:
            raise RuntimeError(f"dockerd under {root} did not answer within {timeout:.0f}s; it said:\n{said}")
        raise RuntimeError(f"dockerd under {root} exited with {exited} (attempt {attempt}); it said:\n{said}")


def _end_abandoned_containerd(root: Path, timeout: float = 10) -> None:
    """End the containerd that a dockerd which gave up on it leaves behind, and its pidfile: the next
    dockerd would otherwise adopt the pid (even as a zombie no one has reaped yet) and wait on it again."""
    pidfile = root / EXEC / "containerd" / "containerd.pid"
    try:
        pid = int(pidfile.read_text())
    except (OSError, ValueError):
        return
    with contextlib.suppress(OSError):
        # A zombie's cmdline is empty: then there is nothing left to end.
        if str(root).encode() in Path(f"/proc/{pid}/cmdline").read_bytes():
            os.kill(pid, signal.SIGKILL)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and Path(f"/proc/{pid}/cmdline").read_bytes():
                time.sleep(0.1)
    pidfile.unlink(missing_ok=True)


def _log_tail(log: Path, offset: int, lines: int = 15) -> str:
    """The last lines one start of dockerd wrote to its log, from ``offset``."""
    with log.open("rb") as f:
        f.seek(offset)
        return "\n".join(f.read().decode(errors="replace").splitlines()[-lines:])
