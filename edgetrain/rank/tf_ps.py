"""A rank of a ``--strategy tf-ps`` run: the chief, which runs the script, or one of the
parameter servers and workers, which serve until the chief ends (edgetrain.rank.strategies).

TensorFlow's servers never end by themselves (``server.join()`` waits for good), and Hydra ends a
run only when every rank has. So each server holds a TCP connection to the chief's lifeline port:
when the chief's process ends, whatever way, the connection closes and the server's rank ends with
status 0. A chief that fails takes the job down through Hydra, as any failed rank does.

The lifeline also carries each server's heartbeat to the chief. TensorFlow's coordinator goes on
with the workers left when one is lost, but only once its gRPC calls to it fail: a worker whose
process died fails them at once (its connections close), a worker behind a link that went dark
never does - the call waits for an answer on a connection nothing closes. So a worker silent on
the lifeline for SILENCE_S is cut off: the chief shuts its own connections to that worker's task,
the calls in flight fail, and the coordinator runs their functions on the workers left; and
again every CUT_AGAIN_S, so that TensorFlow's later attempts to reach it fail at once too.

The heartbeat is heard by a Python thread, and TensorFlow can hold the GIL while one of its calls
waits on a dark worker (seen on the testbed: the chief's evaluation registering its functions on
every worker, begun before the silence ran out), so that thread may never run again. The chief's
connections to each worker are therefore armed beforehand with the kernel's own limits
(TCP_USER_TIMEOUT and keepalive probes), so that the kernel ends them once the worker has not
answered for SILENCE_S, whatever this process's threads are doing; the failed calls release the
GIL, and the cut-off above takes over.
"""

from __future__ import annotations

import os
import select
import socket
import threading
import time

from edgetrain.shared.strategies import ParameterServerPeers

LIFELINE_WAIT_S = 300.0  # a server's wait for the chief to listen (it imports TensorFlow first)
HEARTBEAT_S = 2.0  # how often a server says it lives, on the lifeline
SILENCE_S = 20.0  # a worker silent this long is cut off (a Pi's busiest moments stay well under it)
# And cut off again this often: TensorFlow goes on trying the lost worker (each function it registers
# afresh, an evaluation's or a save's), and a connection attempt to a dark host waits on its SYN, 3 s
# each on the testbed, where one shut at once fails at once.
CUT_AGAIN_S = 0.25
ARM_EVERY_S = 1.0  # a new connection to a worker is armed within this (gRPC's are made at the start)
KEEPALIVE_IDLE_S = 5  # an idle connection to a worker is probed after this, and then as often; the
# kernel ends it once TCP_USER_TIMEOUT (SILENCE_S) has passed with a probe or data unanswered

_role: str | None = None
_built = False


def role() -> str | None:
    return _role


def strategy_built() -> bool:
    """Whether the chief's script built a ParameterServerStrategy."""
    return _built


def _address(hostport: str) -> tuple[str, int]:
    host, port = hostport.rsplit(":", 1)
    return ("127.0.0.1" if host == "localhost" else host), int(port)


def become_chief(layout: ParameterServerPeers) -> None:
    """Listen on the lifeline (held until this process ends), and note when the script builds
    its ParameterServerStrategy."""
    global _role
    _role = "chief"
    listener = socket.create_server(_address(layout.lifeline))
    held: list[socket.socket] = []

    def accept() -> None:
        while True:
            conn, _ = listener.accept()
            held.append(conn)  # open until this process ends: the servers' sign that the chief lives
            threading.Thread(target=_hear, args=(layout, conn), daemon=True, name="tf-ps heartbeat").start()

    threading.Thread(target=accept, daemon=True, name="tf-ps lifeline").start()
    _watch_strategy()


def _hear(layout: ParameterServerPeers, conn: socket.socket, until: threading.Event | None = None) -> None:
    """One server's heartbeat: its rank, then a byte every HEARTBEAT_S. A worker's connections are
    armed every ARM_EVERY_S while it beats; one that falls silent or whose lifeline breaks is cut
    off, and again every CUT_AGAIN_S until this process ends (or ``until`` is set)."""
    conn.settimeout(SILENCE_S)
    try:
        said = b""
        while b"\n" not in said:
            block = conn.recv(64)
            if not block:
                return  # gone before it said which it is: nothing to cut
            said += block
        rank = int(said.split(b"\n", 1)[0])
    except (OSError, ValueError):
        return
    kind, index = layout.role(rank)
    task = layout.tasks[rank]
    why = _beats(conn, (lambda: arm(task)) if kind == "worker" else (lambda: None))
    if kind == "worker":
        shut = cut_off(task)
        print(f"edgetrain: worker {index} ({task}) {why}: {shut} connection(s) to it shut; the coordinator goes on "
              "with the workers left", flush=True)
        until = until or threading.Event()
        while not until.wait(CUT_AGAIN_S):
            cut_off(task)


def _beats(conn: socket.socket, meanwhile) -> str:
    """Hear a server's beats, calling ``meanwhile`` every ARM_EVERY_S, until they stop; why they did."""
    conn.settimeout(ARM_EVERY_S)
    heard = time.monotonic()
    while True:
        meanwhile()
        try:
            if not conn.recv(64):
                return "its lifeline closed"
            heard = time.monotonic()
        except TimeoutError:
            if silent(conn, heard):
                return f"silent for {SILENCE_S:.0f} s"
        except OSError as exc:
            return f"its lifeline failed ({exc})"


def silent(conn: socket.socket, heard: float) -> bool:
    """Whether a server last heard at ``heard`` is silent: SILENCE_S gone by and nothing waiting
    on its lifeline. The socket decides, not the clock alone: while TensorFlow holds the GIL this
    thread does not run, and a live worker's beats wait in the socket meanwhile; by the clock,
    every worker would be silent after such a wait, and a live one cut off."""
    return time.monotonic() - heard >= SILENCE_S and not select.select([conn], [], [], 0)[0]


def _connections(task: str):
    """This process's TCP connections to ``task`` (host:port), each as a socket on a dup of its fd.
    The sockets are gRPC's: what is done to them (shutdown, options) is done to gRPC's."""
    host, port = _address(task)
    ip = socket.gethostbyname(host)
    inodes = set()
    for table in ("/proc/self/net/tcp", "/proc/self/net/tcp6"):
        try:
            with open(table) as f:
                rows = [line.split() for line in f.readlines()[1:]]
        except OSError:
            continue
        for row in rows:
            address, hexport = row[2].split(":")
            # The address's last 32 bits, in the kernel's byte order: IPv4, or IPv4 mapped into IPv6.
            if int(hexport, 16) == port and socket.inet_ntoa(bytes.fromhex(address[-8:])[::-1]) == ip:
                inodes.add(int(row[9]))
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
            if not (target.startswith("socket:[") and int(target[8:-1]) in inodes):
                continue
            copy = os.dup(int(fd))
        except OSError:
            continue  # closed meanwhile
        if os.fstat(copy).st_ino not in inodes:  # the fd was closed and reused meanwhile
            os.close(copy)
            continue
        with socket.socket(fileno=copy) as s:
            yield s


def cut_off(task: str) -> int:
    """Shut this process's TCP connections to ``task``; how many. The sockets stay open (they are
    gRPC's): shutdown ends their connections, and gRPC sees them closed."""
    shut = 0
    for s in _connections(task):
        try:
            s.shutdown(socket.SHUT_RDWR)
            shut += 1
        except OSError:
            pass
    return shut


def arm(task: str) -> None:
    """Have the kernel end this process's connections to ``task`` once it has not answered for
    SILENCE_S: unacknowledged data (TCP_USER_TIMEOUT), or probes of an idle connection."""
    for s in _connections(task):
        try:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE, KEEPALIVE_IDLE_S)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL, KEEPALIVE_IDLE_S)
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT, int(SILENCE_S * 1000))
        except OSError:
            pass  # ended meanwhile


def _watch_strategy() -> None:
    from tensorflow.python.distribute import parameter_server_strategy_v2 as pss

    built = pss.ParameterServerStrategyV2.__init__

    def init(self, *args, **kwargs):
        global _built
        _built = True
        return built(self, *args, **kwargs)

    pss.ParameterServerStrategyV2.__init__ = init


def serve(layout: ParameterServerPeers, rank: int) -> None:
    """Run this rank's TensorFlow server until the chief's process ends."""
    global _role
    kind, index = layout.role(rank)
    _role = kind
    import tensorflow as tf

    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    server = tf.distribute.Server(resolver.cluster_spec(), job_name=kind, task_index=index,
                                  protocol=resolver.rpc_layer or "grpc", start=True)
    print(f"edgetrain: {kind} {index} serving at {server.target}; it ends when the chief does", flush=True)
    with _lifeline(layout.lifeline) as conn:
        conn.settimeout(None)
        conn.sendall(f"{rank}\n".encode())
        threading.Thread(target=_beat, args=(conn,), daemon=True, name="tf-ps heartbeat").start()
        try:
            while conn.recv(4096):
                pass
        except ConnectionResetError:
            pass  # the chief's process ended with a heartbeat unread: its kernel resets, not closes


def _beat(conn: socket.socket) -> None:
    try:
        while True:
            time.sleep(HEARTBEAT_S)
            conn.sendall(b".")
    except OSError:
        pass  # the chief is gone: the lifeline's end says so to serve()


def _lifeline(hostport: str) -> socket.socket:
    deadline = time.monotonic() + LIFELINE_WAIT_S
    while True:
        try:
            return socket.create_connection(_address(hostport), timeout=10)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the chief did not listen on {hostport} within {LIFELINE_WAIT_S:.0f} s") from None
            time.sleep(0.5)
