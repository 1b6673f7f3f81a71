"""Batches by speed on 2 real ranks (mpirun -n 2), batches 3 and 1: after K steps a model without
batch statistics holds the weights one process gets training on the union of the ranks' batches,
under Horovod (edgetrain.callbacks' plan, Keras) and torch DDP on Gloo (edgetrain.ddp's plan and
sampler) - and, without the loss weight, it does not."""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys

import pytest

from edgetrain.shared.batches import SPEEDS_ENV
from tests.conftest import ROOT

pytestmark = pytest.mark.mpi

SCRIPTS = ROOT / "tests" / "scripts" / "batches"
STEPS = 5
RESULT = re.compile(r"^batches 3/1 weighted (\S+) unweighted (\S+)$", re.M)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("script", ["keras_exact.py", "torch_exact.py"])
def test_uneven_batches_train_as_one_process_on_their_union(script):
    env = {**os.environ, "PYTHONPATH": str(ROOT), SPEEDS_ENV: "3,1", "MASTER_PORT": str(free_port())}
    proc = subprocess.run(["mpirun", "-n", "2", sys.executable, str(SCRIPTS / script), str(STEPS)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    found = RESULT.search(proc.stdout)
    assert found, proc.stdout[-3000:]
    weighted, unweighted = float(found[1]), float(found[2])
    assert weighted < 1e-5, found[0]  # float tolerance: the union's update, step for step
    assert unweighted > 1e-2, found[0]  # the weight is what makes it so
