"""The emulation's thread split (comm_core.py) against the truth: the threads ``hvd.init()`` made.

Two ranks under mpirun on loopback, in a cpu group of the test's own: each rank lists the
threads that appeared in its process during ``hvd.init()``, while the mover, from outside, picks
threads by what is on their stacks. With Gloo it must move exactly those (Horovod's background
loop and Gloo's event loops) - every one of them, and none of TensorFlow's, nor MPI's, nor the main
thread. With MPI carrying the collectives, Horovod's background loop polls without end, in a
throttled group, so it is never blocked where its stack pointer can be read: it must move still,
and it alone of each rank's threads (UCX's own threads, also made during ``hvd.init()``, stay).
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
import time
from pathlib import Path

import pytest

from .comm_core import comm_group, comm_cores, moving
from .cpugroup import CpuGroup

ROOT = Path(__file__).resolve().parents[2]

RANK = """
import json, os, sys, time
from edgetrain import pmi, rendezvous
rendezvous.set_up()
import tensorflow as tf
import horovod.tensorflow as hvd
before = set(os.listdir("/proc/self/task"))
hvd.init()
made = sorted(int(t) for t in set(os.listdir("/proc/self/task")) - before)
x = tf.random.normal([128, 128])
stop = sys.argv[1]
print(json.dumps({"rank": hvd.rank(), "pid": os.getpid(), "made": made}), flush=True)
while not os.path.exists(stop):  # TensorFlow computes, Horovod communicates, until told to stop
    tf.matmul(x, x)
    hvd.allreduce(tf.ones([50_000]), name="grad")
    time.sleep(0.05)
hvd.allreduce(tf.constant(0.0), name="barrier")
sys.stdout.flush()
# MPI_Finalize can hang with MPICH 4.0.2 ch4:ucx: end as edgetrain.worker does, telling Hydra the
# end is meant (else it may take this rank for dead and end the other with status 1).
pmi.finalize()
os._exit(0)
"""


def moved_threads(tmp_path: Path, controller: str) -> tuple[list[dict], set[int]]:
    """Each rank's report, and the threads the mover put in the comm group."""
    script, stop = tmp_path / "rank.py", tmp_path / "stop"
    script.write_text(RANK)
    group = CpuGroup(f"edgetrain-test-{secrets.token_hex(3)}")
    group.create()
    env = dict(os.environ, HOROVOD_CONTROLLER=controller, HOROVOD_CPU_OPERATIONS=controller, HOROVOD_GLOO_IFACE="lo",
               HOROVOD_CYCLE_TIME="5" if controller == "gloo" else "0", UCX_TLS="tcp,self", PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    if controller == "mpi":
        group.limit(20_000, 100_000)  # a fifth of a core: the polling threads wait runnable, as on a throttled node
    enter = " && ".join(f"echo $$ > {group.path(c)}/cgroup.procs" for c in ("cpu", "cpuacct"))
    proc = None
    try:
        with moving([group]):
            proc = subprocess.Popen(["sh", "-c", f'{enter} && exec "$@"', "sh", "mpirun", "-n", "2", sys.executable, str(script), str(stop)],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
            ranks = [json.loads(proc.stdout.readline()) for _ in range(2)]
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
            assert proc.wait(timeout=120) == 0
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        group.remove()
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


def test_a_pi_core_is_a_fraction_of_a_core_by_the_published_copy_rate():
    assert comm_cores(44_530.0) == pytest.approx(5527.0 / 44_530.0)
    assert comm_cores(2_000.0) == 1.0  # a machine slower than a Pi gives the whole core, not more
