"""A rank of a ``--strategy tf-ps`` run: the chief, which runs the script, or one of the
parameter servers and workers, which serve until the chief ends (edgetrain.shared.strategies).

TensorFlow's servers never end by themselves (``server.join()`` waits for good), and Hydra ends a
run only when every rank has. So each server holds a TCP connection to the chief's lifeline port:
when the chief's process ends, whatever way, the connection closes and the server's rank ends with
status 0. A chief that fails takes the job down through Hydra, as any failed rank does.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from dataclasses import dataclass

from edgetrain.shared.strategies import tf_ps_role

LIFELINE_WAIT_S = 300.0  # a server's wait for the chief to listen (it imports TensorFlow first)

_role: str | None = None
_built = False


@dataclass(frozen=True)
class Layout:
    """What every rank is told: each task's host:port in rank order, how many are parameter
    servers, and the chief's lifeline."""

    tasks: tuple[str, ...]
    ps: int
    lifeline: str

    @classmethod
    def parse(cls, peers: str) -> Layout:
        found = json.loads(peers)
        return cls(tuple(found["tasks"]), int(found["ps"]), found["lifeline"])

    def role(self, rank: int) -> tuple[str, int]:
        return tf_ps_role(rank, self.ps)

    def tf_config(self, rank: int) -> str:
        kind, index = self.role(rank)
        cluster = {"chief": list(self.tasks[:1]), "ps": list(self.tasks[1:1 + self.ps]), "worker": list(self.tasks[1 + self.ps:])}
        return json.dumps({"cluster": cluster, "task": {"type": kind, "index": index}})


def role() -> str | None:
    return _role


def strategy_built() -> bool:
    """Whether the chief's script built a ParameterServerStrategy."""
    return _built


def _address(hostport: str) -> tuple[str, int]:
    host, port = hostport.rsplit(":", 1)
    return ("127.0.0.1" if host == "localhost" else host), int(port)


def become_chief(layout: Layout) -> None:
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

    threading.Thread(target=accept, daemon=True, name="tf-ps lifeline").start()
    _watch_strategy()


def _watch_strategy() -> None:
    from tensorflow.python.distribute import parameter_server_strategy_v2 as pss

    built = pss.ParameterServerStrategyV2.__init__

    def init(self, *args, **kwargs):
        global _built
        _built = True
        return built(self, *args, **kwargs)

    pss.ParameterServerStrategyV2.__init__ = init


def serve(layout: Layout, rank: int) -> None:
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
        while conn.recv(4096):
            pass


def _lifeline(hostport: str) -> socket.socket:
    deadline = time.monotonic() + LIFELINE_WAIT_S
    while True:
        try:
            return socket.create_connection(_address(hostport), timeout=10)
        except OSError:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the chief did not listen on {hostport} within {LIFELINE_WAIT_S:.0f} s") from None
            time.sleep(0.5)
