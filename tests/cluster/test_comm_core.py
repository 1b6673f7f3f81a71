"""The emulation's thread split (comm_core.py) against the truth: the threads ``hvd.init()`` made.

Two Gloo ranks under mpirun on loopback, in a cpu group of the test's own: each rank lists the
threads that appeared in its process during ``hvd.init()`` (Horovod's background loop and Gloo's
event loops), while the mover, from outside, picks threads by what is on their stacks. It must
move exactly those - every one of them, and none of TensorFlow's, nor MPI's, nor the main thread.
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
from edgetrain import rendezvous
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
os._exit(0)  # MPI_Finalize can hang with MPICH 4.0.2 ch4:ucx (edgetrain.worker does the same)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="cgroups and /proc/PID/mem of other processes need root")
def test_the_mover_takes_exactly_the_threads_hvd_init_made(tmp_path):
    script, stop = tmp_path / "rank.py", tmp_path / "stop"
    script.write_text(RANK)
    group = CpuGroup(f"edgetrain-test-{secrets.token_hex(3)}")
    group.create()
    env = dict(os.environ, HOROVOD_CONTROLLER="gloo", HOROVOD_CPU_OPERATIONS="gloo", HOROVOD_GLOO_IFACE="lo",
               HOROVOD_CYCLE_TIME="5", PYTHONPATH=str(ROOT), TF_CPP_MIN_LOG_LEVEL="2")
    enter = " && ".join(f"echo $$ > {group.path(c)}/cgroup.procs" for c in ("cpu", "cpuacct"))
    proc = None
    try:
        with moving([group]):
            proc = subprocess.Popen(["sh", "-c", f'{enter} && exec "$@"', "sh", "mpirun", "-n", "2", sys.executable, str(script), str(stop)],
                                    env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True)
            ranks = [json.loads(proc.stdout.readline()) for _ in range(2)]
            made = {tid for r in ranks for tid in r["made"]}
            tasks = comm_group(group).path() / "tasks"
            deadline = time.monotonic() + 30
            while {int(t) for t in tasks.read_text().split()} != made and time.monotonic() < deadline:
                time.sleep(0.5)
            time.sleep(3)  # a few more scans: nothing else may follow
            moved = {int(t) for t in tasks.read_text().split()}
            stop.touch()
            assert proc.wait(timeout=60) == 0
    finally:
        if proc is not None and proc.poll() is None:
            os.killpg(proc.pid, 9)
            proc.wait()
        group.remove()
    # Horovod's background loop and at least one Gloo event loop per rank.
    assert all(len(r["made"]) >= 2 for r in ranks), ranks
    assert moved == made, f"moved {sorted(moved)}, hvd.init() made {sorted(made)}"
    assert not moved & {r["pid"] for r in ranks}


def test_a_pi_core_is_a_fraction_of_a_core_by_the_published_copy_rate():
    assert comm_cores(44_530.0) == pytest.approx(5527.0 / 44_530.0)
    assert comm_cores(2_000.0) == 1.0  # a machine slower than a Pi gives the whole core, not more
