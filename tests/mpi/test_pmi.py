"""edgetrain.rank.pmi against MPICH's Hydra: a rank that ends with os._exit must not take its node's other ranks with it.

Two ranks on this machine share one Hydra proxy. Rank 1 ends right after a barrier; rank 0 works on
for two seconds and then writes a file. Without PMI's finalize, the proxy takes rank 1's closed PMI
socket for a death and kills rank 0 before it writes; with it, rank 0 finishes.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from edgetrain.rank import pmi

pytestmark = pytest.mark.mpi
ROOT = Path(__file__).resolve().parents[2]

RANKS = """
import os, sys, time
from mpi4py import MPI
from edgetrain.rank import pmi
comm = MPI.COMM_WORLD
comm.Barrier()
if comm.rank == 1:
    if sys.argv[1] == "finalize":
        assert pmi.finalize(), "Hydra did not acknowledge the finalize"
    os._exit(0)
time.sleep(2)
open(sys.argv[2], "w").write("done")
pmi.finalize()
os._exit(0)
"""


def _run(tmp_path: Path, mode: str) -> tuple[int, bool]:
    script, done = tmp_path / "ranks.py", tmp_path / f"{mode}.done"
    script.write_text(RANKS)
    proc = subprocess.run(["mpirun", "-n", "2", sys.executable, str(script), mode, str(done)], cwd=ROOT,
                          env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True, timeout=120)
    return proc.returncode, done.exists()


def test_a_rank_that_finalizes_lets_the_others_finish(tmp_path):
    assert _run(tmp_path, "finalize") == (0, True)


def test_without_finalize_hydra_kills_the_other_rank(tmp_path):
    """What edgetrain's ranks did before: the reason pmi.finalize exists (if MPICH stops doing this,
    the module can go)."""
    _, finished = _run(tmp_path, "bare")
    assert not finished


def test_finalize_without_hydra_does_nothing(monkeypatch):
    monkeypatch.delenv("PMI_FD", raising=False)
    assert pmi.finalize() is False
