"""A cluster of network-namespace hosts on this machine, reachable over real SSH.

Each node is a network namespace on a private bridge, with an address in 198.18.0.0/15 (the
benchmarking range, never routed elsewhere), its own hostname (UTS namespace), its own sshd on port
22 of its address, a private /etc/hosts, /etc/hostname and /etc/docker (bind mounts in a mount
namespace, so provisioning a node never edits the machine's own files), optional tc tbf shaping of
its link (default 1 Gbit/s, a Raspberry Pi 4's Ethernet; EDGETRAIN_TESTBED_LINK_MBIT for another
rate) and optionally its own Docker engine.

Each node also gets its own /root (an empty tmpfs, like another machine's root home); the
controller's Python installation, if it lives under /root (pyenv), is bind-mounted read-only into
it, so that the MPI user can run the project's virtualenv on every node.

Everything else is shared with the machine, like nodes with an NFS root: packages, /etc/passwd,
home directories. Consequences for tests: apt runs on every node take the same dpkg lock, user
creation contends for the same /etc/passwd lock, and files in the MPI user's home are written by
every node at once, so roles must write identical content (the ssh mesh and datasets roles do).

Every resource name starts with the testbed id (``et-<4 hex>``) and is recorded in
``<root>/<id>/state.json`` before it is created; ``down`` removes exactly the recorded resources and
ends only the processes it started or that live in its own namespaces.
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import pwd
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import yaml

from . import docker_engine

from .comm_core import comm_group
from .cpugroup import CpuGroup
from .emulation import Emulation

DEFAULT_ROOT = Path(os.environ.get("EDGETRAIN_TESTBED_ROOT", "/var/lib/edgetrain-testbed"))
# Pi OS ships every board with this name: the base role must rename them.
FACTORY_HOSTNAME = "raspberrypi"
# The rate of every node's link in Mbit/s: a Pi 4's Ethernet unless told (a slower switch, Wi-Fi).
LINK_MBIT = int(os.environ.get("EDGETRAIN_TESTBED_LINK_MBIT", "1000"))


def run(*cmd: str, check: bool = True, **kw) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), check=check, text=True, capture_output=True, **kw)


def _ip(*args: str, check: bool = True) -> subprocess.CompletedProcess:
    return run("ip", *args, check=check)


def _alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except FileNotFoundError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] != "Z"  # a zombie is gone for our purposes


def _started(pid: int) -> int | None:
    """A process's start time in clock ticks since boot (with the pid, it names one process: pids are reused)."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (FileNotFoundError, IndexError, ValueError):
        return None


def _stop(*pids: int, timeout: float = 10.0) -> None:
    """SIGTERM to every one at once (each node's dockerd takes seconds to shut down), then SIGKILL
    to any still there after ``timeout``."""
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and any(_alive(pid) for pid in pids):
        time.sleep(0.1)
    for pid in pids:
        if _alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


@dataclass
class Node:
    name: str  # inventory name, and the hostname the base role gives the node
    netns: str
    veth: str  # host-side end; the node sees its end as eth0
    address: str
    dir: str
    sshd_pid: int | None = None
    dockerd_pid: int | None = None
    # The node's cpu group from the hierarchy's root: below the group the testbed was made from.
    cgroup_path: str = ""
    # The board whose CPU the node has (emulation.Emulation as a dict): a calibrated quota; None: the machine's.
    emulation: dict | None = None

    @property
    def board(self) -> Emulation | None:
        return Emulation(**self.emulation) if self.emulation else None

    @property
    def cgroup(self) -> CpuGroup:
        """The node's CPU: its sshd, what that starts, and its engine's containers."""
        return CpuGroup(self.cgroup_path or self.netns)

    @property
    def docker_dir(self) -> Path:
        """The root of the node's Docker engine (docker_engine.py's layout)."""
        return Path(self.dir) / "docker"

    @property
    def docker_sock(self) -> str:
        return str(self.docker_dir / docker_engine.SOCKET)

    @property
    def docker_cli(self) -> list[str]:
        """The docker command, talking to this node's engine."""
        return ["docker", "-H", f"unix://{self.docker_sock}"]

    @property
    def docker_root(self) -> str:
        return str(self.docker_dir / docker_engine.DATA)


@dataclass
class State:
    id: str
    dir: str
    subnet: int  # third octet of 198.18.X.0/24
    bridge: str
    mpi_user: str
    link_mbit: int | None  # every link's tbf rate; None: unshaped
    docker: bool
    nodes: list[Node] = field(default_factory=list)
    created_user: bool = False
    # The login user of every node, as `pi` is on Raspberry Pi OS: not root, sudo without a
    # password, its home private to each node (an empty tmpfs /home, like /root).
    login_user: str = ""
    created_login: bool = False
    # Paths under /root that every node's private /root shows (read-only).
    expose: list[str] = field(default_factory=list)
    # The emulation's daemon (emulator.py): moves communication threads, keeps idle nodes busy.
    emulator_pid: int | None = None
    # The process that made the testbed (a test session, or `python -m lab up`) and its
    # start time: while it runs the testbed is in use, and a bare `down` leaves it alone.
    owner_pid: int | None = None
    owner_started: int | None = None
    # Slurm (slurm_up): the one munged all nodes share, as they share /run's file system here.
    munged_pid: int | None = None
    # More users of the nodes (add_user), as people sharing a cluster are; each removed by down.
    users: list[str] = field(default_factory=list)

    @property
    def in_use(self) -> bool:
        return self.owner_pid is not None and _alive(self.owner_pid) and _started(self.owner_pid) == self.owner_started

    @property
    def gateway(self) -> str:
        return f"198.18.{self.subnet}.1"

    @property
    def key(self) -> str:
        return f"{self.dir}/id_ed25519"

    @property
    def known_hosts(self) -> str:
        return f"{self.dir}/known_hosts"

    @property
    def sudoers(self) -> str:
        return f"/etc/sudoers.d/edgetrain-testbed-{self.id}"

    @property
    def login_home(self) -> str:
        return f"/home/{self.login_user}"

    @property
    def inventory(self) -> str:
        return f"{self.dir}/inventory/hosts.yml"

    @property
    def head(self) -> Node:
        return self.nodes[0]

    @property
    def slurm_dir(self) -> str:
        """slurm.conf and the daemons' files; the role writes them here (write_inventory), not in the machine's /etc."""
        return f"{self.dir}/slurm"

    @property
    def slurm_env(self) -> dict[str, str]:
        """What Slurm's commands need to reach this testbed's controller."""
        return {"SLURM_CONF": f"{self.slurm_dir}/slurm.conf"}

    def save(self) -> None:
        tmp = Path(self.dir) / "state.json.tmp"
        tmp.write_text(json.dumps(asdict(self), indent=2))
        tmp.replace(Path(self.dir) / "state.json")

    @classmethod
    def load(cls, path: Path) -> State:
        raw = json.loads(path.read_text())
        raw.pop("emulation", None)  # recorded for the whole testbed by earlier versions; each node's own now
        raw["nodes"] = [Node(**n) for n in raw["nodes"]]
        return cls(**raw)


def _free_subnet() -> int:
    used = run("ip", "-4", "-o", "addr", "show").stdout
    for _ in range(64):
        x = 1 + secrets.randbelow(254)
        if f" 198.18.{x}." not in used:
            return x
    raise RuntimeError("no free /24 in 198.18.0.0/16 for the testbed bridge")


def _user_exists(name: str) -> bool:
    try:
        pwd.getpwnam(name)
    except KeyError:
        return False
    return True


class Testbed:
    __test__ = False  # a fixture's type, not a test class

    def __init__(self, state: State):
        self.state = state

    # ---- lifecycle -------------------------------------------------------------------------

    @classmethod
    def create(cls, nodes: int = 3, *, shape: bool = True, docker: bool = False, root: Path = DEFAULT_ROOT) -> Testbed:
        tid = f"et-{secrets.token_hex(2)}"
        d = root / tid
        d.mkdir(parents=True, mode=0o755)
        mpi_user = tid.replace("-", "")  # et1a2b: short, valid everywhere a user name is
        login = f"pi{tid[3:]}"
        state = State(
            id=tid, dir=str(d), subnet=_free_subnet(), bridge=f"{tid}-br", mpi_user=mpi_user,
            link_mbit=LINK_MBIT if shape else None, docker=docker, created_user=not _user_exists(mpi_user),
            expose=[p for p in {sys.base_prefix, sys.prefix} if p.startswith("/root/")],
            login_user=login, created_login=not _user_exists(login),
            owner_pid=os.getpid(), owner_started=_started(os.getpid()),
        )
        for i in range(1, nodes + 1):
            state.nodes.append(Node(
                name=f"node{i}", netns=f"{tid}-n{i}", veth=f"{tid}-v{i}",
                address=f"198.18.{state.subnet}.{10 + i}", dir=f"{d}/node{i}",
                cgroup_path=CpuGroup.mine(f"{tid}-n{i}").name,
            ))
        state.save()
        bed = cls(state)
        try:
            bed._up()
        except BaseException:
            bed.down()
            raise
        return bed

    @classmethod
    def load(cls, tid: str, root: Path = DEFAULT_ROOT) -> Testbed:
        return cls(State.load(root / tid / "state.json"))

    @staticmethod
    def recorded(root: Path = DEFAULT_ROOT) -> list[str]:
        return sorted(p.parent.name for p in root.glob("et-*/state.json"))

    def _up(self) -> None:
        s = self.state
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{s.id}-controller", "-f", s.key)
        if s.created_login:
            # One /etc/passwd for all nodes: the user exists once; its home is made in each node.
            run("useradd", "--no-create-home", "--home-dir", s.login_home, "--shell", "/bin/bash", "--user-group", s.login_user)
        # Each node's engine listens on a socket of its own (sshd's SetEnv DOCKER_HOST): sudo keeps it.
        Path(s.sudoers).write_text(f"Defaults:{s.login_user} env_keep += \"DOCKER_HOST\"\n{s.login_user} ALL=(ALL) NOPASSWD:ALL\n")
        os.chmod(s.sudoers, 0o440)
        # sshd refuses to run without its privilege-separation directory.
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        _ip("link", "add", s.bridge, "type", "bridge")
        _ip("addr", "add", f"{s.gateway}/24", "dev", s.bridge)
        _ip("link", "set", s.bridge, "up")
        known = []
        for n in s.nodes:
            self._node_up(n)
            s.save()
            pub = Path(f"{n.dir}/ssh_host_ed25519_key.pub").read_text().split()
            known.append(f"{n.address} {pub[0]} {pub[1]}\n")
        Path(s.known_hosts).write_text("".join(known))
        for n in s.nodes:
            self.wait_ssh(n)
            if s.docker:
                self._docker_up(n)
                s.save()
        self.write_inventory()

    def _node_up(self, n: Node) -> None:
        Path(n.dir).mkdir(mode=0o755)
        n.cgroup.create()
        self._link_up(n)
        self._node_files(n)
        self._start_sshd(n)

    def _link_up(self, n: Node) -> None:
        """The node's namespace, its end of a veth pair as eth0 on the bridge, shaped where the testbed is."""
        s = self.state
        _ip("netns", "add", n.netns)
        _ip("link", "add", n.veth, "type", "veth", "peer", "name", f"{n.veth}p")
        _ip("link", "set", f"{n.veth}p", "netns", n.netns)
        ns = ("-n", n.netns)
        _ip(*ns, "link", "set", f"{n.veth}p", "name", "eth0")
        _ip(*ns, "addr", "add", f"{n.address}/24", "dev", "eth0")
        _ip(*ns, "link", "set", "eth0", "up")
        _ip(*ns, "link", "set", "lo", "up")
        _ip("link", "set", n.veth, "master", s.bridge)
        _ip("link", "set", n.veth, "up")
        if s.link_mbit:
            # Both directions: the host-side end shapes traffic into the node, eth0 traffic out.
            tbf = ("root", "tbf", "rate", f"{s.link_mbit}mbit", "burst", "256kb", "latency", "10ms")
            run("tc", "qdisc", "add", "dev", n.veth, *tbf)
            run("ip", "netns", "exec", n.netns, "tc", "qdisc", "add", "dev", "eth0", *tbf)

    def _node_files(self, n: Node) -> None:
        """What the node's mount namespace shows in place of the machine's: its host key, /etc
        files, root's authorized keys and sshd_config."""
        d = Path(n.dir)
        run("ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", n.name, "-f", f"{d}/ssh_host_ed25519_key")
        (d / "hosts").write_text(f"127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n127.0.1.1\t{FACTORY_HOSTNAME}\n")
        (d / "hostname").write_text(FACTORY_HOSTNAME + "\n")
        (d / "etc-docker").mkdir()
        (d / "sys").mkdir()
        (d / "roothome").mkdir()
        pub = Path(self.state.key + ".pub").read_text()
        (d / "root_authorized_keys").write_text(pub)
        (d / "sshd_config").write_text(self._sshd_config(n))

    def _sshd_config(self, n: Node) -> str:
        d = Path(n.dir)
        env = f"SetEnv DOCKER_HOST=unix://{n.docker_sock}\n" if self.state.docker else ""
        return (
            f"ListenAddress {n.address}:22\n"
            f"HostKey {d}/ssh_host_ed25519_key\n"
            f"PidFile {d}/sshd.pid\n"
            "PermitRootLogin prohibit-password\n"
            "PasswordAuthentication no\n"
            "KbdInteractiveAuthentication no\n"
            "UsePAM yes\n"
            "AuthorizedKeysFile .ssh/authorized_keys\n"
            "Subsystem sftp /usr/lib/openssh/sftp-server\n"
            "MaxStartups 100\n"
            "MaxSessions 100\n"
            + env +
            "Match User root\n"
            f"  AuthorizedKeysFile {d}/root_authorized_keys\n"
        )

    def _node_script(self, n: Node) -> str:
        """The shell that makes the node's mounts and hostname, then becomes its sshd."""
        s = self.state
        d = Path(n.dir)
        # A fresh sysfs shows this namespace's interfaces (Ansible's facts read it); the machine's
        # cgroup hierarchy is carried over so that a Docker engine can still run in the node.
        expose = "".join(
            f"mkdir -p {shlex.quote(p)}\nmount --bind -o ro {d}/roothome/{shlex.quote(p[len('/root/'):])} {shlex.quote(p)}\n"
            for p in sorted(s.expose)
        )
        return f"""set -e
mount --bind /root {d}/roothome
mount -t tmpfs -o mode=0711 tmpfs /root
mount -t tmpfs -o mode=0755 tmpfs /home
install -d -o {s.login_user} -g {s.login_user} -m 0700 {s.login_home} {s.login_home}/.ssh
install -o {s.login_user} -g {s.login_user} -m 0600 {d}/root_authorized_keys {s.login_home}/.ssh/authorized_keys
{expose}mount -t sysfs sysfs {d}/sys
mount --rbind /sys/fs/cgroup {d}/sys/fs/cgroup
mount --move {d}/sys /sys
mount --bind {d}/hosts /etc/hosts
mount --bind {d}/hostname /etc/hostname
if [ -d /etc/docker ]; then mount --bind {d}/etc-docker /etc/docker; fi
hostname {FACTORY_HOSTNAME}
exec /usr/sbin/sshd -D -f {d}/sshd_config -E {d}/sshd.log
"""

    def _start_sshd(self, n: Node) -> None:
        script = self._node_script(n)
        with open(Path(n.dir) / "node.log", "ab") as log:  # the node's copy stays open, ours closes
            proc = subprocess.Popen(
                ["nsenter", f"--net=/var/run/netns/{n.netns}", "unshare", "--mount", "--uts",
                 "--propagation", "private", "sh", "-c", script],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            )
        n.sshd_pid = proc.pid  # nsenter, unshare and sh all exec: this pid ends up being sshd
        # Before sshd accepts anything, so that every process of the node is charged to it.
        n.cgroup.move(proc.pid)

    def wait_ssh(self, n: Node, timeout: float = 20.0) -> None:
        deadline = time.monotonic() + timeout
        while True:
            r = self.ssh(n, "hostname", check=False, timeout=10)
            if r.returncode == 0:
                return
            if time.monotonic() > deadline or not n.sshd_pid or not _alive(n.sshd_pid):
                log = Path(n.dir, "node.log").read_text(errors="replace")
                raise RuntimeError(f"sshd on {n.name} ({n.address}) did not come up: {r.stderr.strip()}\n{log}")
            time.sleep(0.2)

    def _docker_up(self, n: Node) -> None:
        engine = docker_engine.start(n.docker_dir, enter=("nsenter", "-t", str(n.sshd_pid), "--net", "--mount", "--uts"),
                                     cgroup=n.cgroup, timeout=60)
        n.dockerd_pid = engine.pid

    def slurm_up(self, timeout: float = 60.0) -> None:
        """Start what roles/slurm configured (site.yml first): one munged for every node, slurmctld
        in the head, slurmd in each node under its own name; return once every node is idle."""
        s = self.state
        if s.munged_pid and _alive(s.munged_pid):
            return
        sock = Path(f"{s.dir}/munge-run")
        # munged refuses a socket directory others can write into or not traverse.
        sock.mkdir(mode=0o755, exist_ok=True)
        shutil.chown(sock, "munge", "munge")
        log_path = Path(s.slurm_dir) / "daemons.log"
        with open(log_path, "ab") as log:
            munged = subprocess.Popen(
                ["setpriv", "--reuid=munge", "--regid=munge", "--init-groups", "munged", "--foreground", f"--socket={sock}/munge.socket",
                 f"--key-file={s.dir}/munge/munge.key", f"--pid-file={sock}/munged.pid", f"--log-file={sock}/munged.log",
                 f"--seed-file={sock}/munged.seed"],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        s.munged_pid = munged.pid
        s.save()
        conf = self.state.slurm_env["SLURM_CONF"]
        deadline = time.monotonic() + timeout
        while not Path(f"{sock}/munge.socket").exists():
            if time.monotonic() > deadline or munged.poll() is not None:
                raise RuntimeError(f"munged did not start: {Path(sock, 'munged.log').read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)
        daemons = [(s.head, ["slurmctld", "-D", "-f", conf])] + [(n, ["slurmd", "-D", "-f", conf, "-N", n.name]) for n in s.nodes]
        for n, argv in daemons:
            with open(log_path, "ab") as log:
                proc = subprocess.Popen(["nsenter", "-t", str(n.sshd_pid), "--net", "--mount", "--uts", *argv],
                                        stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
            n.cgroup.move(proc.pid)  # the jobs slurmd starts are the node's CPU
        while True:
            r = run("sinfo", "--noheader", "--Node", "--format=%N %T", check=False, env={**os.environ, "SLURM_CONF": conf})
            states = dict(line.split() for line in r.stdout.splitlines() if line.strip())
            if r.returncode == 0 and len(states) == len(s.nodes) and set(states.values()) == {"idle"}:
                return
            if time.monotonic() > deadline:
                raise RuntimeError(f"Slurm's nodes are not idle after {timeout:.0f} s: {r.stdout}{r.stderr}")
            time.sleep(0.5)

    def add_user(self, name: str) -> None:
        """Another user of every node, made as the login user is (one /etc/passwd, a home private
        to each node): it logs in with the testbed's key and holds a copy of it to reach the nodes
        as the login user, as a person's own key would. Not root, no sudo."""
        s = self.state
        if _user_exists(name):
            raise RuntimeError(f"user {name} exists already: the testbed makes its own users")
        s.users.append(name)  # recorded before it exists, so that down removes it whatever follows
        s.save()
        run("useradd", "--no-create-home", "--home-dir", f"/home/{name}", "--shell", "/bin/bash", "--user-group", name)
        for n in s.nodes:
            self.ssh(n, f"install -d -o {name} -g {name} -m 0700 /home/{name} /home/{name}/.ssh && "
                        f"install -o {name} -g {name} -m 0600 {n.dir}/root_authorized_keys /home/{name}/.ssh/authorized_keys")
        self.give_key(name)

    def give_key(self, name: str) -> str:
        """A copy of the nodes' key in ``name``'s home on every node (a job may start on any of
        them), for an inventory of that user's to name; its path."""
        key = f"/home/{name}/.ssh/id_ed25519"
        for n in self.state.nodes:
            self.ssh(n, f"install -o {name} -g {name} -m 0600 {self.state.key} {key}")
        return key

    def remove_user(self, name: str) -> None:
        """Undo add_user: its homes in the nodes, then the user."""
        s = self.state
        for n in s.nodes:
            if n.sshd_pid and _alive(n.sshd_pid):
                self.ssh(n, f"rm -rf /home/{name}", check=False)
        if _user_exists(name):
            run("userdel", name, check=False)
        s.users.remove(name)
        s.save()

    def down(self) -> None:
        """Remove exactly what state.json records; safe to call on a half-built testbed."""
        s = self.state
        for name in list(s.users):
            self.remove_user(name)
        daemons = [s.emulator_pid, s.munged_pid] + [pid for n in s.nodes for pid in (n.dockerd_pid, n.sshd_pid)]
        _stop(*filter(None, daemons))
        for n in s.nodes:
            if Path(f"/var/run/netns/{n.netns}").exists():
                # Whatever still runs in our namespace was started inside the node (mpirun
                # leftovers, containerd shims): ours by construction.
                _stop(*(int(pid) for pid in _ip("netns", "pids", n.netns, check=False).stdout.split()), timeout=5)
                _ip("netns", "del", n.netns, check=False)
            _ip("link", "del", n.veth, check=False)
        _ip("link", "del", s.bridge, check=False)
        if s.created_user and _user_exists(s.mpi_user):
            run("userdel", "--remove", s.mpi_user, check=False)
        if s.created_login and s.login_user and _user_exists(s.login_user):
            run("userdel", s.login_user, check=False)  # its homes were tmpfs mounts of the nodes
        if s.login_user:
            Path(s.sudoers).unlink(missing_ok=True)
        # Docker leaves read-only layers and mounts behind in its data-root until unmounted.
        for n in s.nodes:
            run("umount", "-R", n.docker_root, check=False)
            comm_group(n.cgroup).remove()
            n.cgroup.remove()
        # rm, not shutil.rmtree: the nodes' image layers are hundreds of thousands of files.
        run("rm", "-rf", "--one-file-system", s.dir, check=False)

    # ---- use -------------------------------------------------------------------------------

    def emulate(self, emulation: Emulation | Sequence[Emulation] | None) -> None:
        """Give every node the CPU of a Raspberry Pi (a calibrated quota, with ``comm_quota_us`` a
        Pi core for its communication threads, and with ``neighbours`` a stand-in training whenever
        the node has nothing of its own to train) - one board for every node, or one per node in
        node order (a mixed cluster: a Pi 5 beside Pi 4s) - or all of it back (None)."""
        nodes = self.state.nodes
        boards = [emulation] * len(nodes) if emulation is None or isinstance(emulation, Emulation) else list(emulation)
        if len(boards) != len(nodes):
            raise ValueError(f"{len(boards)} boards for the {len(nodes)} nodes of testbed {self.state.id}")
        self._stop_emulator()
        for n, board in zip(nodes, boards, strict=True):
            n.emulation = asdict(board) if board else None
            if board is None:
                n.cgroup.unlimit()
                continue
            n.cgroup.limit(board.quota_us, board.period_us)
            if board.comm_quota_us:
                comm = comm_group(n.cgroup)
                comm.create()
                comm.limit(board.comm_quota_us, board.period_us)
        flags = []
        if any(b and b.comm_quota_us for b in boards):
            flags.append("--comm")
        if any(b and b.neighbours for b in boards):
            flags.append("--stand-ins")
        if flags:
            with open(Path(self.state.dir) / "emulator.log", "ab") as log:
                proc = subprocess.Popen([sys.executable, "-m", "lab.emulator", *flags, *(n.cgroup.name for n in self.state.nodes)],
                                        cwd=Path(__file__).resolve().parents[1], stdin=subprocess.DEVNULL, stdout=log,
                                        stderr=subprocess.STDOUT, start_new_session=True)
            self.state.emulator_pid = proc.pid
        self.state.save()

    def _stop_emulator(self) -> None:
        """Stop the daemon (its stand-ins end with it), and give the threads it moved back to their nodes' groups."""
        if self.state.emulator_pid:
            _stop(self.state.emulator_pid)
            self.state.emulator_pid = None
            self.state.save()
        for n in self.state.nodes:
            comm = comm_group(n.cgroup)
            if comm.path().is_dir():
                for tid in (comm.path() / "tasks").read_text().split():
                    try:
                        n.cgroup.move_thread(int(tid))
                    except OSError:
                        pass  # ended meanwhile
                comm.remove()

    def cpu_stat(self) -> dict[str, dict[str, int]]:
        """Each node's cpu.stat and CPU used, with its communication threads' own (``comm_*``) when split."""
        out = {}
        for n in self.state.nodes:
            out[n.name] = n.cgroup.stat()
            comm = comm_group(n.cgroup)
            if comm.path().is_dir():
                out[n.name].update({f"comm_{k}": v for k, v in comm.stat().items()})
        return out


    def ssh_argv(self, n: Node, user: str = "root") -> list[str]:
        s = self.state
        return [
            "ssh", "-i", s.key, "-o", "IdentitiesOnly=yes", "-o", "BatchMode=yes",
            "-o", f"UserKnownHostsFile={s.known_hosts}", "-o", "StrictHostKeyChecking=yes",
            "-o", "ConnectTimeout=5", f"{user}@{n.address}",
        ]

    def ssh(self, n: Node, command: str, *, check: bool = True, timeout: float | None = 120) -> subprocess.CompletedProcess:
        r = subprocess.run([*self.ssh_argv(n), command], text=True, capture_output=True, timeout=timeout, check=False)
        if check and r.returncode != 0:
            raise RuntimeError(f"on {n.name}: {command!r} exited {r.returncode}\n{r.stdout[-2000:]}{r.stderr[-2000:]}")
        return r

    def as_mpi_user(self, n: Node, command: str, **kw) -> subprocess.CompletedProcess:
        """Run a login shell of the MPI user inside the node, as mpirun would be started there."""
        from shlex import quote

        return self.ssh(n, f"runuser -l {self.state.mpi_user} -c {quote(command)}", **kw)

    def _cluster_vars(self) -> dict:
        """The cluster group's variables: the roles pointed at the testbed's own directory, and
        told what nodes that share this machine cannot do."""
        s = self.state
        return {
            "edgetrain_arch": platform.machine(),
            "edgetrain_slots": 1,
            "edgetrain_iface": "eth0",
            "edgetrain_runtime": "host",
            "edgetrain_mpi_user": s.mpi_user,
            # Shared package database: lists are the machine's, never refreshed by a test run.
            "base_apt_update_cache": False,
            # /etc/hosts and /etc/hostname are bind mounts in each node (as in a container): they
            # can only be rewritten in place, not replaced by rename.
            "base_etc_unsafe_writes": True,
            # One /etc/passwd for all nodes: useradd on several nodes at once fails on its lock.
            "base_user_throttle": 1,
            "docker_user_throttle": 1,
            # The testbed runs each node's engine itself (no systemd in the nodes).
            "docker_manage_service": False,
            # Its nodes share this machine's /etc/ssh and run their own sshd (sshd_config above):
            # the role's drop-in goes to the testbed's directory, and nothing is reloaded.
            "ssh_mesh_sshd_config": f"{s.dir}/sshd-edgetrain.conf",
            "ssh_mesh_sshd_reload": False,
            "docker_verify_engine": s.docker,
            "mpich_record_file": f"{s.dir}/mpich-version",
            "datasets_dir": f"{s.dir}/datasets",
            "images_stage_dir": f"{s.dir}/images-stage",
            "machinefile_dir": f"{s.dir}/mpi",
            "edgetrain_venv": f"{s.dir}/edgetrain-venv",
            # Slurm (roles/slurm): configured by the role, its daemons run by slurm_up (no systemd in
            # the nodes), every file under the testbed's directory, each node's apart (%n).
            "edgetrain_scheduler": "slurm",
            "slurm_manage_service": False,
            "slurm_cluster_name": s.mpi_user,
            "slurm_conf_dir": s.slurm_dir,
            "slurm_munge_key": f"{s.dir}/munge/munge.key",
            "slurm_munge_socket": f"{s.dir}/munge-run/munge.socket",
            "slurm_state_dir": f"{s.slurm_dir}/ctld",
            "slurm_spool_dir": f"{s.slurm_dir}/spool/%n",
            "slurm_slurmctld_pid_file": f"{s.slurm_dir}/run/slurmctld.pid",
            "slurm_slurmd_pid_file": f"{s.slurm_dir}/run/slurmd-%n.pid",
            "slurm_slurmctld_log_file": f"{s.slurm_dir}/log/slurmctld.log",
            "slurm_slurmd_log_file": f"{s.slurm_dir}/log/slurmd-%n.log",
            # The nodes share this machine's cgroup hierarchies (and their CPU is the testbed's own
            # group): Slurm tracks a job's processes by their parentage instead, and confines none.
            "slurm_proctrack_type": "proctrack/linuxproc",
            "slurm_task_plugin": "task/none",
            # Every node is this machine: its facts' memory, 24 GB, would be each node's.
            "slurm_real_memory": 1024,
            "edgetrain_install_deps": False,
            # /usr/local/bin is the machine's own.
            "edgetrain_bin_link": "",
        }

    def write_inventory(self, extra_vars: dict | None = None, host_vars: dict[str, dict] | None = None,
                        name: str = "hosts.yml") -> str:
        s = self.state
        cluster_vars = self._cluster_vars()
        cluster_vars.update(extra_vars or {})
        hosts = {n.name: {"ansible_host": n.address, **self._board_vars(n), **(host_vars or {}).get(n.name, {})} for n in s.nodes}
        inv = {
            "all": {
                "vars": {
                    # As on a Pi: a login user that is not root, root through sudo.
                    "ansible_user": s.login_user,
                    "ansible_port": 22,
                    "ansible_become": True,
                    "ansible_python_interpreter": "/usr/bin/python3",
                    "ansible_ssh_private_key_file": s.key,
                    "ansible_ssh_common_args": f"-o IdentitiesOnly=yes -o UserKnownHostsFile={s.known_hosts} -o StrictHostKeyChecking=yes",
                },
                "children": {
                    "cluster": {
                        "vars": cluster_vars,
                        "children": {
                            "head": {"hosts": {s.head.name: hosts[s.head.name]}},
                            "rpi": {"hosts": hosts},
                        },
                    },
                },
            },
        }
        path = Path(s.inventory).with_name(name)
        path.parent.mkdir(exist_ok=True)
        path.write_text(f"# Written by the edgetrain testbed {s.id}; removed by its teardown.\n" + yaml.safe_dump(inv, sort_keys=False))
        return str(path)

    @staticmethod
    def _board_vars(n: Node) -> dict:
        """What an inventory says of the board a node emulates: its model (informational) and its
        calibrated rate as its ``edgetrain_speed`` (what --batch-by speed falls back on)."""
        board = n.board
        return {"edgetrain_model": board.model, "edgetrain_speed": round(board.images_per_sec)} if board else {}

    def status(self) -> dict:
        s = self.state
        out: dict[str, Any] = {"id": s.id, "dir": s.dir, "bridge": s.bridge, "inventory": s.inventory, "mpi_user": s.mpi_user,
               "in_use_by": s.owner_pid if s.in_use else None, "nodes": []}
        for n in s.nodes:
            out["nodes"].append({
                "name": n.name, "netns": n.netns, "address": n.address, "emulation": n.emulation,
                "sshd": n.sshd_pid if n.sshd_pid and _alive(n.sshd_pid) else None,
                "dockerd": n.dockerd_pid if n.dockerd_pid and _alive(n.dockerd_pid) else None,
                "netns_exists": Path(f"/var/run/netns/{n.netns}").exists(),
            })
        return out

    def link_bytes(self) -> dict[str, int]:
        """Bytes through each node's link as seen on the bridge side (rx + tx)."""
        total = {}
        for n in self.state.nodes:
            base = Path("/sys/class/net") / n.veth / "statistics"
            total[n.name] = int((base / "rx_bytes").read_text()) + int((base / "tx_bytes").read_text())
        return total
