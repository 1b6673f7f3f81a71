"""One training container per node: started, wired together for MPI, watched, and always removed.

Each container runs the node's image with the host network (MPI sees the node's own address
and interface), the node's run directory and dataset directory mounted, and sshd on port 12345
for Hydra. A key pair made for the run alone lets the rank-0 container reach the others; the
private key never leaves the rank-0 container and dies with it.
"""

from __future__ import annotations

import posixpath
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from . import images
from .errors import EdgetrainError
from .inventory import Host
from .placement import Placement
from .remote import Nodes, tar_bytes

SSH_PORT = 12345
PYTHON = "/opt/edgetrain/bin/python"  # the image's virtualenv
RUN_MOUNT = "/edgetrain/run"
DATA_MOUNT = "/edgetrain/data"
STORE_MOUNT = "/edgetrain/store"
MACHINEFILE = "/etc/edgetrain/machinefile"
LABEL = "org.edgetrain.run"
# Containers share /dev/shm among the ranks of one node; Docker's default 64 MB is too small.
SHM_SIZE = "1g"
# Hydra's ssh to the containers. MPICH 4.0's Hydra has no -bootstrap-exec-args, so the port and
# options live in the rank-0 container's ssh client configuration; a dead peer is noticed within
# ~15 s instead of TCP's minutes.
SSH_CLIENT_CONFIG = f"""Host *
    Port {SSH_PORT}
    BatchMode yes
    StrictHostKeyChecking yes
    ConnectTimeout 10
    ServerAliveInterval 5
    ServerAliveCountMax 3
"""
def store_dir(node_run_dir: str) -> str:
    """The node's file store (see edgetrain.workdir), beside its run directories."""
    return f"{posixpath.dirname(node_run_dir.rstrip('/'))}/.store"


def docker_run_argv(host: Host, name: str, run_id: str, node_run_dir: str, image: str) -> list[str]:
    argv = [
        "docker", "run", "--detach", "--name", name, "--label", f"{LABEL}={run_id}",
        "--network", "host", "--shm-size", SHM_SIZE,
        "--volume", f"{node_run_dir}:{RUN_MOUNT}",
        "--volume", f"{host.datasets_dir}:{DATA_MOUNT}:ro",
        "--volume", f"{store_dir(node_run_dir)}:{STORE_MOUNT}:ro",
    ]
    if host.is_gpu:
        argv += ["--gpus", "all"]
    return [*argv, image]


@dataclass(frozen=True)
class NodeState:
    host: Host
    alive: bool
    detail: str  # why not, when not alive


class Containers:
    """The containers of one run (or probe) across the nodes of a placement."""

    def __init__(self, nodes: Nodes, plan: Placement, run_id: str, node_run_dirs: dict[str, str]) -> None:
        self.nodes, self.plan, self.run_id = nodes, plan, run_id
        self.node_run_dirs = node_run_dirs
        self.name = f"edgetrain-{run_id}"

    def _each(self, fn, hosts=None) -> list:
        hosts = list(self.plan.hosts if hosts is None else hosts)
        with ThreadPoolExecutor(max_workers=min(16, len(hosts) or 1)) as pool:
            return list(pool.map(fn, hosts))

    def start(self) -> None:
        """Start every container and connect them; on any failure, remove what started and raise."""
        try:
            errors = [e for e in self._each(self._start_one) if e]
            if errors:
                raise errors[0]
            self._connect()
        except BaseException:
            self.remove()
            raise

    def _start_one(self, host: Host) -> EdgetrainError | None:
        d = self.node_run_dirs[host.name]
        try:
            self.nodes.check(host, ["mkdir", "-p", d, store_dir(d)], f"creating {d}")
            self.nodes.check(host, docker_run_argv(host, self.name, self.run_id, d, images.image_for(host)),
                                   "starting the training container", "see docker logs on the node; edgetrain doctor -i INVENTORY")
        except EdgetrainError as exc:
            return exc
        return None

    def _connect(self) -> None:
        with tempfile.TemporaryDirectory(prefix="edgetrain-key-") as tmp:
            key = Path(tmp) / "id_ed25519"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name, "-f", str(key)], check=True)
            private, public = key.read_bytes(), key.with_suffix(".pub").read_text()
        # Install the run's public key, wait for sshd, and read back the container's host key.
        script = (
            "umask 077 && cat > /root/.ssh/authorized_keys && i=0; "
            "while [ ! -s /run/sshd.pid ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
            "cat /etc/ssh/ssh_host_ed25519_key.pub"
        )
        host_keys = self._each(lambda h: self.nodes.check(
            h, ["docker", "exec", "-i", self.name, "sh", "-c", script], "installing the run's ssh key", input=public))
        known = "".join(f"[{h.address}]:{SSH_PORT} {' '.join(k.split()[:2])}\n" for h, k in zip(self.plan.hosts, host_keys))
        bundle = tar_bytes({
            "/root/.ssh/id_ed25519": (private, 0o600),
            "/root/.ssh/known_hosts": (known.encode(), 0o644),
            "/root/.ssh/config": (SSH_CLIENT_CONFIG.encode(), 0o600),
            MACHINEFILE: (self.plan.machinefile().encode(), 0o644),
        })
        self.nodes.check(self.plan.head, ["docker", "exec", "-i", self.name, "tar", "-x", "-C", "/"],
                         "installing the MPI files", input=bundle)

    def mpirun(self, command: list[str]) -> list[str]:
        """The local argv that runs ``mpirun ... command`` in the rank-0 container, output streamed."""
        head = self.plan.head
        argv = ["mpirun", "-f", MACHINEFILE, "-n", str(self.plan.np)]
        if head.iface:
            argv += ["-iface", head.iface]
        argv += ["-bootstrap", "ssh"]
        for k, v in head.mpi_env.items():
            argv += ["-genv", k, v]
        return self.nodes.argv(head, ["docker", "exec", self.name, *argv, *command])

    def states(self) -> list[NodeState]:
        def one(host: Host) -> NodeState:
            proc = self.nodes.run(host, ["docker", "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}} {{.State.OOMKilled}}", self.name], timeout=30)
            if proc.returncode != 0:
                err = (proc.stderr.strip().splitlines() or ["no answer"])[-1]
                reachable = proc.returncode != 255 or host.is_local
                return NodeState(host, False, f"container gone ({err})" if reachable else f"unreachable: {err}")
            running, code, oom = proc.stdout.split()
            if running == "true":
                return NodeState(host, True, "")
            return NodeState(host, False, "container ran out of memory" if oom == "true" else f"container exited with status {code}")
        return self._each(one)

    def remove(self) -> list[str]:
        """Remove the run's container on every node it may be on; the nodes where that failed."""
        def one(host: Host) -> str | None:
            try:
                proc = self.nodes.run(host, ["docker", "rm", "--force", self.name], timeout=60)
            except EdgetrainError as exc:
                return f"{host.name}: {exc}"
            if proc.returncode == 0 or "No such container" in proc.stderr:
                return None
            return f"{host.name}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
        failed = [f for f in self._each(one) if f]
        if failed:
            # A removal already in progress (the run's watcher) or a busy engine: one more pass.
            time.sleep(2)
            failed = [f for f in self._each(one) if f]
        return failed


def leftovers(nodes: Nodes, host: Host) -> list[str]:
    """edgetrain containers on a node that belong to no running edgetrain (a killed controller)."""
    out = nodes.check(host, ["docker", "ps", "--all", "--filter", f"label={LABEL}", "--format", "{{.Names}}"], "listing containers")
    return out.split()

