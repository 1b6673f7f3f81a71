"""tf-ps's lifeline as the chief hears it: each server's heartbeat, and a worker that falls silent
(a link gone dark) or whose lifeline closes (its process gone) cut off - the chief's own
connections to its task shut, so that TensorFlow's calls in flight to it fail and its coordinator
goes on with the workers left - and each worker's connections armed beforehand with the kernel's
own limits, which end them however busy the chief's threads are. Real sockets on loopback."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from edgetrain.rank import tf_ps
from edgetrain.shared.strategies import ParameterServerPeers


def task() -> tuple[socket.socket, socket.socket, str]:
    """A task's listening socket, this process's connection to it (as gRPC's would be), and its host:port."""
    listener = socket.create_server(("127.0.0.1", 0))
    address = f"127.0.0.1:{listener.getsockname()[1]}"
    return listener, socket.create_connection(("127.0.0.1", listener.getsockname()[1])), address


def still_open(conn: socket.socket) -> bool:
    """Nothing to read and no end: the connection is still there."""
    conn.settimeout(0.2)
    try:
        conn.recv(1)
        return False
    except socket.timeout:
        return True


def test_cut_off_shuts_this_process_s_connections_to_a_task_and_no_other():
    listener, conn, address = task()
    other_listener, other, _ = task()
    accepted, _ = listener.accept()
    try:
        assert tf_ps.cut_off(address) == 1
        accepted.settimeout(5)
        assert accepted.recv(1) == b""  # the task sees the connection end
        assert still_open(other)
    finally:
        for s in (listener, conn, other_listener, other, accepted):
            s.close()


def armed(conn: socket.socket) -> tuple[int, int, int]:
    return (conn.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE), conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE),
            conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT))


def test_arm_sets_the_kernels_limits_on_this_process_s_connections_to_a_task_and_no_other():
    listener, conn, address = task()
    other_listener, other, _ = task()
    try:
        before = armed(other)
        tf_ps.arm(address)
        assert armed(conn) == (1, tf_ps.KEEPALIVE_IDLE_S, int(tf_ps.SILENCE_S * 1000))
        assert armed(other) == before and before[2] == 0
    finally:
        for s in (listener, conn, other_listener, other):
            s.close()


def test_a_worker_is_silent_only_if_its_lifeline_holds_nothing_once_the_silence_has_passed():
    chief_end, server_end = socket.socketpair()
    try:
        long_ago = time.monotonic() - 2 * tf_ps.SILENCE_S
        assert not tf_ps.silent(chief_end, time.monotonic())  # not long enough
        assert tf_ps.silent(chief_end, long_ago)
        # Beats that came while the chief's thread could not run (TensorFlow held the GIL): alive.
        server_end.sendall(b".")
        assert not tf_ps.silent(chief_end, long_ago)
    finally:
        chief_end.close()
        server_end.close()


OPEN: list[socket.socket] = []
LISTENING: list[socket.socket] = []  # each test's task, which a worker cut off goes on being cut off from
HEARD = threading.Event()  # set at the end: the chief's threads that go on cutting a worker off stop


@pytest.fixture(autouse=True)
def stop_cutting():
    HEARD.clear()
    yield
    HEARD.set()


def hear(monkeypatch, rank: int, then) -> tuple[str, float, socket.socket]:
    """The chief hearing one server of rank ``rank`` (layout: chief, one ps, two workers; rank 3's
    task is a real listener this process is connected to); ``then(lifeline)`` plays the server
    after it said its rank. What the chief printed, how long it took, and the task's end of the
    chief's connection."""
    monkeypatch.setattr(tf_ps, "SILENCE_S", 1.0)
    listener, conn, address = task()
    accepted, _ = listener.accept()
    layout = ParameterServerPeers(("127.0.0.1:1", "127.0.0.1:2", "127.0.0.1:3", address), 1, "127.0.0.1:4")
    chief_end, server_end = socket.socketpair()
    said: list[str] = []
    monkeypatch.setattr("builtins.print", lambda *a, **k: said.append(" ".join(map(str, a))))
    heard = threading.Thread(target=tf_ps._hear, args=(layout, chief_end, HEARD), daemon=True)
    started = time.monotonic()
    heard.start()
    server_end.sendall(f"{rank}\n".encode())
    then(server_end)
    while heard.is_alive() and not said and time.monotonic() - started < 30:
        time.sleep(0.1)  # a worker cut off goes on being cut off: its thread does not end
    LISTENING.append(listener)
    OPEN.append(conn)  # the chief's connection stays open unless cut off
    return "\n".join(said), time.monotonic() - started, accepted


def test_a_worker_silent_on_its_lifeline_is_cut_off(monkeypatch):
    def beat_then_go_dark(lifeline):
        for _ in range(3):  # beating: not silent, though each beat takes half the silence
            time.sleep(0.5)
            lifeline.sendall(b".")

    said, took, accepted = hear(monkeypatch, 3, beat_then_go_dark)
    assert armed(OPEN[-1])[2] == 1000  # armed while it beat
    assert "edgetrain: worker 1 (127.0.0.1:" in said and "silent for 1 s: 1 connection(s) to it shut" in said, said
    assert 2.0 <= took < 10, took
    accepted.settimeout(5)
    assert accepted.recv(1) == b""
    # A later connection to the lost worker (TensorFlow trying it again) is shut too, soon.
    again = socket.create_connection(("127.0.0.1", LISTENING[-1].getsockname()[1]))
    accepted, _ = LISTENING[-1].accept()
    accepted.settimeout(5)
    assert accepted.recv(1) == b""
    again.close()


def test_a_worker_whose_lifeline_closes_is_cut_off_and_a_parameter_server_is_not(monkeypatch):
    said, took, accepted = hear(monkeypatch, 3, lambda lifeline: lifeline.close())
    assert "its lifeline closed: 1 connection(s) to it shut" in said and took < 5, said
    said, took, accepted = hear(monkeypatch, 1, lambda lifeline: lifeline.close())
    assert said == "" and still_open(accepted)  # a parameter server's task is not cut off
