"""One training container per node: started, wired together for MPI, watched, and always removed.

Each container runs the node's image with the host network (MPI sees the node's own address
and interface), the node's run directory and dataset directory mounted, and sshd on port 12345
of the cluster interface for Hydra. A key pair made for the run alone lets the rank-0 container
reach the others; the private key never leaves the rank-0 container and dies with it. Everything
a run starts on a node is owned by it: the container removes itself when stopped, and stops
itself when the controller stops renewing its lease (killed, powered off, cut off).
"""

from __future__ import annotations

import contextlib

import enum
import ipaddress
import posixpath
import shlex
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from edgetrain.controller import images, node_store
from edgetrain.shared import mpi
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.layout import RunLayout
from edgetrain.controller.inventory import Host
from edgetrain.controller.placement import Placement
from edgetrain.controller.remote import SSH_TIMEOUT, UNREACHABLE, Nodes, tar_bytes
from edgetrain.shared.runs import RUN_AS

SSH_PORT = 12345
REACH_FIX = f"check that the nodes reach each other on the cluster interface (edgetrain_iface) and port {SSH_PORT}"
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
# Docker's default capabilities, less what neither sshd nor the ranks use (raw sockets, device
# nodes, file capabilities, binding low ports, ...).
CAPABILITIES = ("CHOWN", "DAC_OVERRIDE", "FOWNER", "SETUID", "SETGID", "SYS_CHROOT", "KILL", "AUDIT_WRITE")
# sshd in the container: Hydra's commands only; nothing forwarded, tunnelled or displayed.
SSHD_OPTIONS = ("AllowTcpForwarding=no", "AllowStreamLocalForwarding=no", "AllowAgentForwarding=no",
                "X11Forwarding=no", "PermitTunnel=no", "GatewayPorts=no")
# How often the controller renews each container's lease (it runs out after the host's
# edgetrain_lease_seconds). The lease lives in a directory of the node's run directory that the
# container mounts read-only over its own (RunLayout.lease_dir): the ranks read it, none can renew it.
LEASE_RENEW = 5
# The shortest lease: three renewals may go missing, and the last one may wait on ssh's timeout,
# before a container of a running controller would end. The inventory schema says the same.
MIN_LEASE = 3 * LEASE_RENEW + SSH_TIMEOUT
LEASE_LABEL, LEASE_SECONDS_LABEL = "org.edgetrain.lease", "org.edgetrain.lease-seconds"
# Where the lease's watcher keeps its last renewal seen, on the node's monotonic clock (``clean``
# reads it): the container's own /run, root's, which ranks (run as the node's login user) cannot write.
LEASE_STATE = "/run/edgetrain-lease"
# The run's key: accepted from the head only, for no forwarding or terminal, and only for a day
# (Hydra connects once, when mpirun starts; the connections then stay up for the whole run).
KEY_LIFETIME = 24 * 3600
# A fork bomb in a rank stops here, not at the node's own limit; a rank of TensorFlow and Horovod
# runs some hundred threads (each one counts), so this leaves room for a GPU server's eight.
PIDS_LIMIT = 4096


def store_dir(node_run_dir: str) -> str:
    """The node's file store (see edgetrain.shared.workdir), beside its run directories."""
    return f"{posixpath.dirname(node_run_dir.rstrip('/'))}/{node_store.STORE}"


def store_view(node_run_dir: str) -> str:
    """The run's own files of the store (edgetrain.controller.node_store.view): all its ranks see."""
    head, run_id = posixpath.split(node_run_dir.rstrip("/"))
    return f"{head}/{node_store.VIEWS}/{run_id}"


def private_dirs(*dirs: str) -> str:
    """A shell command that creates directories only the login user can enter (a run's files are
    theirs alone, on a node other users log in to)."""
    quoted = " ".join(shlex.quote(d) for d in dirs)
    return f"umask 077 && mkdir -p -- {quoted} && chmod 0700 -- {quoted}"


def write_file(path: str) -> str:
    """A shell command that writes its stdin to ``path`` as a new file of the login user's alone,
    synced, then renamed over ``path``. Nothing is written through a link: the new file is created
    exclusively (a link a rank left at its name makes it fail), and the rename replaces whatever a
    rank left at ``path`` (a link to ~/.ssh/authorized_keys) rather than writing to what it names."""
    folder, name = posixpath.split(path)
    tmp = f"{folder}/.{name}.XXXXXXXXXX"
    return (f"umask 077 && t=$(mktemp -u -- {shlex.quote(tmp)}) && "
            f"{{ dd of=\"$t\" conv=excl,fsync oflag=nofollow status=none && mv -fT -- \"$t\" {shlex.quote(path)} || "
            f"{{ rm -f -- \"$t\"; false; }}; }}")


MOUNTED_RUN = RunLayout.posix(RUN_MOUNT)  # a node's run directory, as its container sees it


def docker_run_argv(host: Host, name: str, run_id: str, node_run_dir: str, image: str, listen: str | None) -> list[str]:
    """The container of one node: removed by Docker once it stops (by the controller, or by its
    own lease, which is its command under Docker's init), never pulled, with fewer capabilities,
    and sshd on the cluster address only."""
    node = RunLayout.posix(node_run_dir)
    argv = [
        "docker", "run", "--detach", "--rm", "--init", "--pull", "never", "--name", name, "--label", f"{LABEL}={run_id}",
        "--label", f"{LEASE_LABEL}={node.lease}", "--label", f"{LEASE_SECONDS_LABEL}={host.lease_seconds}",
        "--network", "host", "--shm-size", SHM_SIZE, "--cap-drop", "ALL",
        *(arg for cap in CAPABILITIES for arg in ("--cap-add", cap)),
        "--security-opt", "no-new-privileges", "--pids-limit", str(PIDS_LIMIT),
        "--volume", f"{node_run_dir}:{RUN_MOUNT}",
        "--volume", f"{node.lease_dir}:{MOUNTED_RUN.lease_dir}:ro",
        "--volume", f"{host.datasets_dir}:{DATA_MOUNT}:ro",
        "--volume", f"{store_view(node_run_dir)}:{STORE_MOUNT}:ro",  # this run's files, not the whole store
    ]
    if host.is_gpu:
        argv += ["--gpus", "all"]
    sshd = [f"-o{o}" for o in SSHD_OPTIONS] + ([f"-oListenAddress={listen}"] if listen else [])
    lease = [PYTHON, "-m", "edgetrain.rank.lease", str(MOUNTED_RUN.lease), str(host.lease_seconds), LEASE_STATE, "--"]
    return [*argv, image, *lease, "edgetrain-sshd", *sshd]


def _ip(address: str) -> str | None:
    try:
        return str(ipaddress.ip_address(address))
    except ValueError:
        return None


def authorize_key(public: str, sources: list[str], ssh_dir: str = "/root/.ssh") -> str:
    """Shell that authorizes the run's key in ``ssh_dir`` until a day after the clock of the machine
    it runs on: sshd judges expiry-time by the node's clock, which on a Pi without a real-time clock
    can be hours or years from the controller's."""
    expiry = f'date -u -d "@$(( $(date +%s) + {KEY_LIFETIME} ))" +%Y%m%d%H%MZ'
    line = shlex.quote(f'restrict,from="{",".join(sources)}",expiry-time="%s" {public.strip()}\n')
    return (f"umask 077 && mkdir -p {shlex.quote(ssh_dir)} && expiry=$({expiry}) && "
            f'printf {line} "$expiry" > {shlex.quote(ssh_dir + "/authorized_keys")}')


def head_sources(head: Host, listen: str | None) -> list[str]:
    """Where the run's key is accepted from: the head's cluster address, else its inventory address
    (a name resolved here: sshd compares from= with the peer's IP, never a name), and loopback."""
    found = {a for a in (listen, _ip(head.address)) if a}
    if not found:
        try:
            found = {str(info[4][0]) for info in socket.getaddrinfo(head.address, None, socket.AF_INET)}
        except (OSError, UnicodeError):
            raise EdgetrainError(f"cannot resolve {head.address}, the address of {head.name}, to an IPv4 address",
                                 f"set edgetrain_iface of {head.name}, or its ansible_host to its IPv4 address") from None
    return sorted(found | {"127.0.0.1"})


def listen_address(nodes: Nodes, host: Host) -> str | None:
    """The node's IPv4 address on its cluster interface (edgetrain_iface), else its inventory
    address when that is one; None leaves sshd on every address."""
    if host.iface:
        out = nodes.check(host, ["ip", "-4", "-o", "addr", "show", "dev", host.iface], f"reading the address of {host.iface}",
                          f"set edgetrain_iface of {host.name} to its cluster interface")
        for word in out.split():
            if "/" in word and word.split("/")[0].count(".") == 3:
                return word.split("/")[0]
        raise EdgetrainError(f"{host.iface} on {host.name} has no IPv4 address", f"set edgetrain_iface of {host.name} to its cluster interface")
    return _ip(host.address)


@dataclass(frozen=True)
class NodeState:
    host: Host
    alive: bool
    detail: str  # why not, when not alive; when alive, a close call worth saying (a slow link)
    out_of_reach: bool = False  # no way to it (ssh's own failure): cleanup does not wait on it


class Containers:
    """The containers of one run (or probe) across the nodes of a placement."""

    def __init__(self, nodes: Nodes, plan: Placement, run_id: str, node_run_dirs: dict[str, str]) -> None:
        self.nodes, self.plan, self.run_id = nodes, plan, run_id
        self.node_run_dirs = node_run_dirs
        self.name = f"edgetrain-{run_id}"
        self.listen: dict[str, str | None] = {}
        # Each container's main process as the node sees it: while it exists the container runs, and
        # asking /proc costs a node almost nothing, where the docker CLI every few seconds cost an
        # emulated Pi a tenth of its CPU (docs/scaling-history.md).
        self.pids: dict[str, int] = {}
        self.login: dict[str, str] = {}  # uid:gid of each node's login user, whom its ranks run as (RUN_AS)
        # Nodes whose last look found them out of reach (NodeState.out_of_reach), as the attempt's
        # monitor told it: cleanup does not wait on them, their containers end themselves when the
        # lease runs out.
        self.unreachable: frozenset[str] = frozenset()
        self.lost: set[str] = set()  # nodes the run goes on without: no longer watched
        self._renewing = threading.Event()

    def _node(self, host: Host) -> RunLayout[PurePosixPath]:
        return RunLayout.posix(self.node_run_dirs[host.name])

    def _renew(self, host: Host) -> None:
        """Renew one node's lease until the run ends: a node each, so that one out of reach (each
        try waits up to ssh's timeout) delays no other node's renewal."""
        while not self._renewing.wait(LEASE_RENEW):
            try:
                # -h: the lease's own times, never a file a link there names, nor one made anew.
                self.nodes.run(host, ["touch", "-h", "--", str(self._node(host).lease)], timeout=LEASE_RENEW + SSH_TIMEOUT)
            except EdgetrainError:
                pass  # a node out of reach: its container ends itself when the lease runs out

    def _each(self, fn, hosts=None) -> list:
        hosts = list(self.plan.hosts if hosts is None else hosts)
        with ThreadPoolExecutor(max_workers=min(16, len(hosts) or 1)) as pool:
            return list(pool.map(fn, hosts))

    def start(self) -> None:
        """Start every container and connect them; on any failure, remove what started and raise."""
        for host in self.plan.hosts:
            threading.Thread(target=self._renew, args=(host,), daemon=True, name=f"lease {host.name}").start()
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
            self.listen[host.name] = listen_address(self.nodes, host)
            # The lease exists before the container: one whose controller dies from here on ends by itself.
            node = self._node(host)
            ids = self.nodes.check(host, ["sh", "-c", f"{private_dirs(d, store_view(d), str(node.lease_dir))} && "
                                          f"{write_file(str(node.lease))} && id -u && id -g"], f"creating {d}").split()
            self.nodes.check(host, docker_run_argv(host, self.name, self.run_id, d, images.image_for(host), self.listen[host.name]),
                             "starting the training container", "see docker logs on the node; edgetrain doctor -i INVENTORY")
            self.pids[host.name] = int(self.nodes.check(host, ["docker", "inspect", "--format", "{{.State.Pid}}", self.name],
                                                         "reading the container's process"))
            self.login[host.name] = f"{int(ids[0])}:{int(ids[1])}"
        except EdgetrainError as exc:
            return exc
        return None

    def _connect(self) -> None:
        with tempfile.TemporaryDirectory(prefix="edgetrain-key-") as tmp:
            key = Path(tmp) / "id_ed25519"
            subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.name, "-f", str(key)], check=True)
            private, public = key.read_bytes(), key.with_suffix(".pub").read_text()
        # In one exec per container (each costs a Pi's share of CPU a good part of a second): record the
        # login user, install the run's public key, wait for sshd, and read back the container's host key.
        head = self.plan.head
        script = (
            f"mkdir -p {posixpath.dirname(RUN_AS)} && echo \"$1\" > {RUN_AS} && "
            f"{authorize_key(public, head_sources(head, self.listen.get(head.name)))} && i=0; "
            "while [ ! -s /run/sshd.pid ] && [ $i -lt 300 ]; do sleep 0.1; i=$((i+1)); done; "
            "cat /etc/ssh/ssh_host_ed25519_key.pub"
        )
        host_keys = self._each(lambda h: self.nodes.check(
            h, ["docker", "exec", self.name, "sh", "-c", script, "sh", self.login[h.name]], "installing the run's ssh key"))
        known = "".join(f"[{h.address}]:{SSH_PORT} {' '.join(k.split()[:2])}\n" for h, k in zip(self.plan.hosts, host_keys, strict=True))
        bundle = tar_bytes({
            "/root/.ssh/id_ed25519": (private, 0o600),
            "/root/.ssh/known_hosts": (known.encode(), 0o644),
            "/root/.ssh/config": (SSH_CLIENT_CONFIG.encode(), 0o600),
            MACHINEFILE: (self.plan.machinefile().encode(), 0o644),
        })
        self.nodes.check(self.plan.head, ["docker", "exec", "-i", self.name, "tar", "-x", "-C", "/"],
                         "installing the MPI files", input=bundle)

    @property
    def hydra(self) -> mpi.Hydra:
        """mpirun as it starts in the rank-0 container."""
        return mpi.Hydra("mpirun", MACHINEFILE, self.plan.head.iface, True, self.plan.rank_env)

    def on_head(self, argv: list[str]) -> list[str]:
        """The local argv that runs ``argv`` in the rank-0 container, output streamed."""
        return self.nodes.argv(self.plan.head, ["docker", "exec", self.name, *argv])

    def mpirun(self, command: list[str]) -> list[str]:
        """The local argv that runs ``mpirun ... command`` over the placement in the rank-0 container."""
        return self.on_head([*self.hydra.argv(self.plan.np), *command])

    def states(self) -> list[NodeState]:
        def one(host: Host) -> NodeState:
            try:
                pid = self.pids.get(host.name)
                if pid:
                    # No longer than ssh's own timeout: a shared connection that went dark may not
                    # notice for a while; an answer late is the cue for the second opinion.
                    alive = self.nodes.run(host, ["test", "-d", f"/proc/{pid}"], timeout=SSH_TIMEOUT)
                    if alive.returncode == 0:
                        return NodeState(host, True, "")
                    if alive.returncode == UNREACHABLE and not host.is_local:
                        return self._unreachable(host, (alive.stderr.strip().splitlines() or ["no answer"])[-1])
                proc = self.nodes.run(host, ["docker", "inspect", "--format", "{{.State.Running}} {{.State.ExitCode}} {{.State.OOMKilled}}", self.name],
                                      timeout=SSH_TIMEOUT)  # as the check above: a look's part of DARK_LINK_NOTICED_S
            except EdgetrainError as exc:
                return self._unreachable(host, exc.problem)
            if proc.returncode != 0:
                err = (proc.stderr.strip().splitlines() or ["no answer"])[-1]
                if proc.returncode == UNREACHABLE and not host.is_local:
                    return self._unreachable(host, err)
                return NodeState(host, False, f"container gone ({err})")
            running, code, oom = proc.stdout.split()
            if running == "true":
                return NodeState(host, True, "")
            return NodeState(host, False, "container ran out of memory" if oom == "true" else f"container exited with status {code}")
        return self._each(one, [h for h in self.plan.hosts if h.name not in self.lost])

    def _unreachable(self, host: Host, err: str) -> NodeState:
        """The shared connection to a node failed (its keepalives went unanswered for ssh's
        timeout, or it could not connect): a node that answers a new connection within
        CONFIRM_TIMEOUT is taken as up (the next check looks again), one that does not is out of
        reach - two observations, a lost node within observers.DARK_LINK_NOTICED_S instead of two checks' 40."""
        if self.nodes.answers(host):
            return NodeState(host, True, f"its shared connection failed ({err}) but a new one answered")
        return NodeState(host, False, f"unreachable: {err}", out_of_reach=True)

    def remove(self) -> list[str]:
        """Remove the run's container on every node it may be on; the nodes where that failed
        (their containers end by themselves once the lease, no longer renewed, runs out)."""
        self._renewing.set()
        # A node the run went on without may be out of reach too: one look, not a removal's minutes.
        lost = [h for h in self.plan.hosts if h.name in self.unreachable or (h.name in self.lost and not self.nodes.answers(h))]
        left = [f"{h.name}: unreachable; its container stops itself once its lease runs out ({h.lease_seconds} s)" for h in lost]

        def one(host: Host) -> str | None:
            try:
                proc = self.nodes.run(host, ["docker", "rm", "--force", self.name], timeout=60)
            except EdgetrainError as exc:
                return f"{host.name}: {exc}"
            if proc.returncode == 0 or "No such container" in proc.stderr:
                # No container holds the lease now: nothing is left that a renewal could keep alive.
                with contextlib.suppress(EdgetrainError):
                    self.nodes.run(host, ["rm", "-f", "--", str(self._node(host).lease)], timeout=60)
                return None
            return f"{host.name}: {(proc.stderr.strip().splitlines() or ['?'])[-1]}"
        reachable = [h for h in self.plan.hosts if h not in lost]
        failed = [f for f in self._each(one, reachable) if f]
        if failed:
            # A removal already in progress (the run's watcher) or a busy engine: one more pass.
            time.sleep(2)
            failed = [f for f in self._each(one, reachable) if f]
        return left + failed


@dataclass(frozen=True)
class Found:
    """An edgetrain container on a node, as ``docker ps`` shows it."""

    name: str
    run: str  # the run (or probe) it belongs to
    running: bool
    lease: str  # its lease file on the node; "" for a container from before leases were labelled
    lease_seconds: float | None


def listed(nodes: Nodes, host: Host) -> list[Found]:
    fields = ("{{.Names}}", "{{.State}}", *(f'{{{{.Label "{k}"}}}}' for k in (LABEL, LEASE_LABEL, LEASE_SECONDS_LABEL)))
    out = nodes.check(host, ["docker", "ps", "--all", "--filter", f"label={LABEL}", "--format", "\t".join(fields)], "listing containers")
    found = []
    for line in out.splitlines():
        name, state, run, lease, seconds = (line.split("\t") + [""] * 5)[:5]
        found.append(Found(name, run, state == "running", lease, float(seconds) if seconds.isdigit() else None))
    return found


def leftovers(nodes: Nodes, host: Host) -> dict[str, str]:
    """edgetrain containers on a node: name -> the run (or probe) they belong to."""
    return {f.name: f.run for f in listed(nodes, host)}


def remove_run(nodes: Nodes, hosts: list[Host], run_id: str) -> list[str]:
    """The containers of a run that no command holds (its edgetrain died), removed before it
    resumes, as ``clean`` would remove them: the nodes each was removed from."""
    def one(host: Host) -> list[str]:
        mine = [c.name for c in listed(nodes, host) if c.run == run_id]
        return [host.name for name in mine if nodes.run(host, ["docker", "rm", "--force", name], timeout=60).returncode == 0]

    with ThreadPoolExecutor(max_workers=min(16, len(hosts) or 1)) as pool:
        return [name for names in pool.map(one, hosts) for name in names]


def lease_age(nodes: Nodes, host: Host, container: str) -> float | None:
    """Seconds since the container's lease watcher last saw its lease renewed, on the node's
    monotonic clock as the watcher times it (a wall clock stepped at NTP sync moves a file's age
    by hours); None when it cannot be read."""
    proc = nodes.run(host, ["docker", "exec", container, PYTHON, "-m", "edgetrain.rank.lease", "--age", LEASE_STATE], timeout=60)
    try:
        return float(proc.stdout) if proc.returncode == 0 else None
    except ValueError:
        return None


class Here(enum.Enum):
    """What this machine's runs directory knows of a container's run."""

    LIVE = "a command here holds it"
    ENDED = "no command here holds it"
    UNKNOWN = "not a run of this runs directory"


def verdict(c: Found, here: Here, age: float | None) -> tuple[bool, str]:
    """Whether ``clean`` may remove a container, and why: only one proven dead - stopped, its run
    ended here, or its lease run out (on the node's monotonic clock, as its watcher times it). A
    running container of a run this machine does not know may belong to another controller or runs
    directory: it is kept while its lease is renewed, or when its lease cannot be read."""
    if not c.running:
        return True, "stopped"
    if here is Here.LIVE:
        return False, "its run is going"
    if here is Here.ENDED:
        return True, "its run ended: no command here holds it"
    if age is None or c.lease_seconds is None:
        return False, "kept: not proven dead (its lease cannot be read); remove it with docker rm --force if it is yours"
    if age > c.lease_seconds:
        return True, f"its lease ran out {age - c.lease_seconds:.0f} s ago"
    return False, f"kept: another controller renewed its lease {age:.0f} s ago"


@dataclass(frozen=True)
class Cleaned:
    host: str
    container: str
    run: str
    removed: bool
    detail: str
    kept_alive: bool = False  # kept because it is someone's live run, not because removal failed


def clean(nodes: Nodes, hosts: list[Host], here: Callable[[str], Here]) -> list[Cleaned]:
    """Remove every edgetrain container proven dead (see ``verdict``)."""
    def one(host: Host) -> list[Cleaned]:
        cleaned = []
        for c in listed(nodes, host):
            known = here(c.run)
            age = lease_age(nodes, host, c.name) if c.running and known is Here.UNKNOWN and c.lease else None
            dead, why = verdict(c, known, age)
            if not dead:
                cleaned.append(Cleaned(host.name, c.name, c.run, False, why, kept_alive=True))
                continue
            proc = nodes.run(host, ["docker", "rm", "--force", c.name], timeout=60)
            ok = proc.returncode == 0 or "No such container" in proc.stderr
            cleaned.append(Cleaned(host.name, c.name, c.run, ok, f"removed: {why}" if ok else (proc.stderr.strip().splitlines() or ["?"])[-1]))
        return cleaned

    with ThreadPoolExecutor(max_workers=min(16, len(hosts) or 1)) as pool:
        return [c for cs in pool.map(one, hosts) for c in cs]
