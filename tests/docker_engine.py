"""Private Docker engines for tests: one dockerd per call, its own root, socket and pid.

Nothing here touches a system engine: every engine lives under its own directory with its own
--data-root, --exec-root, unix socket and pidfile, has no bridge and no iptables rules, and is
stopped by the pid it was started with.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from tests.cluster.cpugroup import CpuGroup


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
            subprocess.run(["umount", "-l", mount], capture_output=True)
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
        proc = subprocess.run(["docker", "version", "--format", "{{.Server.Version}}"], env=env, capture_output=True, timeout=20)
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


def start(root: Path | None = None, *, netns: str | None = None, timeout: float = 90) -> DockerEngine:
    """Start dockerd under ``root`` (a new temp dir when None; a given root is kept, for caching).

    With ``netns`` the engine runs in that network namespace (through nsenter: ``ip netns exec``
    remounts /sys and dockerd then fails), so ``--network host`` containers see the node's address.
    """
    keep = root is not None
    root = Path(root) if root is not None else Path(tempfile.mkdtemp(prefix="edgetrain-docker-"))
    root.mkdir(parents=True, exist_ok=True)
    sock = root / "docker.sock"
    cmd = [
        "dockerd",
        "--data-root", str(root / "data"),
        "--exec-root", str(root / "exec"),
        "-H", f"unix://{sock}",
        "--pidfile", str(root / "docker.pid"),
        "--storage-driver", "overlay2",
        "--iptables=false",
        "--ip-masq=false",
        "--bridge=none",
    ]
    # Its containers (image builds among them) in a group of its own below the one the tests run
    # in: they share its CPU (tests/capped.py), and the group goes with the engine (dockerd
    # leaves its default /docker behind).
    cgroup = CpuGroup.mine(root.name)
    cmd.append(f"--cgroup-parent=/{cgroup.name}")
    if netns:
        cmd = ["nsenter", f"--net=/var/run/netns/{netns}", *cmd]
    log = (root / "dockerd.log").open("ab")
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    log.close()
    engine = DockerEngine(root=root, host=f"unix://{sock}", process=process, keep_root=keep, cgroup=cgroup)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = (root / "dockerd.log").read_text(errors="replace")[-2000:]
            engine.stop()
            raise RuntimeError(f"dockerd exited with {process.returncode}:\n{tail}")
        if sock.exists() and reachable(engine.host):
            return engine
        time.sleep(0.5)
    engine.stop()
    raise RuntimeError(f"dockerd under {root} did not answer within {timeout:.0f}s")
