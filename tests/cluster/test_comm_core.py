"""The emulation's thread split (comm_core.py) against the truth: the threads ``hvd.init()`` made.

Two ranks under mpirun on loopback, in a cpu group of the test's own: each rank lists the
threads that appeared in its process during ``hvd.init()``, while the mover, from outside, picks
threads by what is on their stacks. With Gloo it must move exactly those (Horovod's background
loop and Gloo's event loops) - every one of them, and none of TensorFlow's, nor MPI's, nor the main
thread. With MPI carrying the collectives, Horovod's background loop polls without end, in a
throttled group, so it is never blocked where its stack pointer can be read: it must move still,
and it alone of each rank's threads (UCX's own threads, also made during ``hvd.init()``, stay).
A process that ends while the mover has one of its threads stopped for a read must still end,
and a signal that comes while the thread is stopped must still reach it.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import platform
import secrets
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lab import comm_core
from lab.comm_core import comm_group, comm_cores, moving
from lab.cpugroup import CpuGroup

ROOT = Path(__file__).resolve().parents[2]

RANK = """
import json, os, sys, time
from edgetrain.rank import pmi, rendezvous
rendezvous.set_up()
import tensorflow as tf
import horovod.tensorflow as hvd
before = set(os.listdir("/proc/self/task"))
hvd.init()
made = sorted(int(t) for t in set(os.listdir("/proc/self/task")) - before)
x = tf.random.normal([128, 128])
report, stop = sys.argv[1:]
# A file each, not stdout: Hydra may forward two ranks' lines to mpirun's stdout interleaved.
with open(f"{report}.tmp{hvd.rank()}", "w") as f:
    json.dump({"rank": hvd.rank(), "pid": os.getpid(), "made": made}, f)
os.replace(f"{report}.tmp{hvd.rank()}", f"{report}{hvd.rank()}.json")
# TensorFlow computes, Horovod communicates, until told to stop. The ranks decide together: one
# that left the loop alone would wait in its next collective for one the other never makes.
while True:
    tf.matmul(x, x)
    hvd.allreduce(tf.ones([50_000]), name="grad")
    if hvd.allreduce(tf.constant(float(os.path.exists(stop))), name="stop", op=hvd.Max) > 0:
        break
    time.sleep(0.05)
# MPI_Finalize can hang with MPICH 4.0.2 ch4:ucx: end as edgetrain.rank.worker does, telling Hydra the
# end is meant (else it may take this rank for dead and end the other with status 1).
if not pmi.finalize():
    print(f"rank {hvd.rank()}: no finalize_ack from Hydra", file=sys.stderr, flush=True)
os._exit(0)
"""


def moved_threads(tmp_path: Path, controller: str) -> tuple[list[dict], set[int]]:
    """Each rank's report, and the threads the mover put in the comm group."""
    script, report, stop = tmp_path / "rank.py", tmp_path / "rank", tmp_path / "stop"
    script.write_text(RANK)
    group = CpuGroup.mine(f"edgetrain-test-{secrets.token_hex(3)}")
    group.create()
    env = dict(os.environ, HOROVOD_CONTROLLER=controller, HOROVOD_CPU_OPERATIONS=controller, HOROVOD_GLOO_IFACE="lo",
               HOROVOD_CYCLE_TIME="5" if controller == "gloo" else "0", UCX_TLS="tcp,self", PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    if controller == "mpi":
        group.limit(50_000, 100_000)  # half a core for two ranks that poll: they wait runnable, as on a throttled node
    log = tmp_path / "mpirun.log"
    with contextlib.ExitStack() as stack:
        stack.callback(group.remove)
        stack.enter_context(moving([group]))
        out = stack.enter_context(log.open("wb"))
        proc = subprocess.Popen(group.command(["mpirun", "-n", "2", sys.executable, str(script), str(report), str(stop)]),
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        # Whatever is left ends before the mover stops and the groups go: a rank's thread keeps them busy.
        stack.callback(proc.wait)
        stack.callback(group.kill)
        reports = [tmp_path / f"rank{r}.json" for r in range(2)]
        # Two ranks import TensorFlow in half a core: a minute on some machines, seconds on others.
        group.wait_while_working(lambda: all(p.exists() for p in reports), "report from both ranks",
                                 alive=lambda: proc.poll() is None)
        ranks = [json.loads(p.read_text()) for p in reports]
        expected = {tid for r in ranks for tid in r["made"]} if controller == "gloo" else None
        tasks = comm_group(group).path() / "tasks"
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            now = {int(t) for t in tasks.read_text().split()}
            if now == expected or (expected is None and len(now) >= 2):
                break
            time.sleep(0.5)
        time.sleep(3)  # a few more scans: nothing else may follow
        moved = {int(t) for t in tasks.read_text().split()}
        stop.touch()
        group.wait_while_working(lambda: proc.poll() is not None, "end of mpirun")
        assert proc.returncode == 0, log.read_text(errors="replace")[-4000:]
    return ranks, moved


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups and /proc/PID/mem of other processes need root")
def test_the_mover_takes_exactly_the_threads_hvd_init_made(tmp_path):
    ranks, moved = moved_threads(tmp_path, "gloo")
    made = {tid for r in ranks for tid in r["made"]}
    # Horovod's background loop and at least one Gloo event loop per rank.
    assert all(len(r["made"]) >= 2 for r in ranks), ranks
    assert moved == made, f"moved {sorted(moved)}, hvd.init() made {sorted(made)}"
    assert not moved & {r["pid"] for r in ranks}


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups, /proc/PID/mem and ptrace of other processes need root")
def test_the_mover_takes_mpis_polling_loop_though_it_never_blocks(tmp_path):
    ranks, moved = moved_threads(tmp_path, "mpi")
    for r in ranks:
        assert len(moved & set(r["made"])) == 1, f"rank {r['rank']}: moved {sorted(moved)}, hvd.init() made {r['made']}"
    assert moved <= {tid for r in ranks for tid in r["made"]}, moved


# What both tests read: a thread that never blocks, in a process that counts the signals it got.
CHILD = """
import os, signal, sys, threading
r, w = os.pipe()
os.set_blocking(r, False)
os.set_blocking(w, False)
signal.signal(signal.SIGRTMIN, lambda *a: None)
signal.set_wakeup_fd(w, warn_on_full_buffer=False)  # one byte a signal, as the C handler gets it
def spin():
    print(threading.get_native_id(), flush=True)
    while True:
        pass
threading.Thread(target=spin, daemon=True).start()
sys.stdin.readline()
got = 0
try:
    while True:
        got += len(os.read(r, 4096))
except BlockingIOError:
    print(got, flush=True)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="ptrace of another process needs root")
def test_a_process_that_ends_while_a_thread_of_it_is_read_ends(monkeypatch):
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    done = threading.Event()
    reader = None
    try:
        tid = int(child.stdout.readline())
        read_stack = comm_core._stack

        def ending_while_read(pid: int, sp: int, maps: list) -> bytes | None:
            child.kill()  # as the ranks' os._exit at the end of a run kills their threads
            time.sleep(0.2)
            return read_stack(pid, sp, maps)

        monkeypatch.setattr(comm_core, "_stack", ending_while_read)

        def read() -> None:
            comm_core._stack_of_runnable(child.pid, tid, comm_core._maps(child.pid))
            done.wait()  # a tracer that ends lets its tracees go: stay, as the mover does between scans

        reader = threading.Thread(target=read)
        reader.start()
        assert child.wait(timeout=10) == -9
    finally:
        done.set()
        if reader is not None:
            reader.join()
        if child.poll() is None:
            child.kill()
            child.wait()


SYS_TGKILL = 234  # x86_64


@pytest.mark.skipif(os.geteuid() != 0 or platform.machine() != "x86_64", reason="ptrace of another process needs root; x86_64's registers")
def test_signals_that_come_while_a_thread_is_read_all_reach_it():
    child = subprocess.Popen([sys.executable, "-c", CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    stop = threading.Event()
    reads = []

    def read() -> None:
        maps = comm_core._maps(child.pid)
        while not stop.is_set():
            reads.append(comm_core._stack_of_runnable(child.pid, tid, maps))

    try:
        tid = int(child.stdout.readline())
        reader = threading.Thread(target=read)
        reader.start()
        libc, sent = ctypes.CDLL(None, use_errno=True), 2000  # real-time signals queue: none merge
        try:
            for i in range(sent):
                assert libc.syscall(SYS_TGKILL, child.pid, tid, int(signal.SIGRTMIN)) == 0, ctypes.get_errno()
                if i % 50 == 0:
                    time.sleep(0.01)
        finally:
            stop.set()
            reader.join()
        time.sleep(0.5)  # the last ones handled
        child.stdin.write("\n")
        child.stdin.flush()
        assert int(child.stdout.readline()) == sent
        assert sum(r is not None for r in reads) > 100, "the thread was hardly ever read"
    finally:
        child.kill()
        child.wait()


def test_a_pi_core_is_a_fraction_of_a_core_by_the_published_copy_rate():
    assert comm_cores(44_530.0) == pytest.approx(5527.0 / 44_530.0)
    assert comm_cores(2_000.0) == 1.0  # a machine slower than a Pi gives the whole core, not more
