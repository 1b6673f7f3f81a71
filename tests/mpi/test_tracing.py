"""edgetrain.tracing: the LeNet job's first step traced twice, not four times, and no Horovod code
through AutoGraph - with the same ops (the same output bias after 16 steps as Keras and Horovod's own way).
One process: Horovod at size 1, its MPI started without mpirun."""

import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.mpi


def test_the_first_step_is_traced_twice_without_converting_horovod_and_trains_the_same():
    out = subprocess.run([sys.executable, "-m", "lab.first_step"], cwd=ROOT, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    ours, theirs = (json.loads(line) for line in out.splitlines() if line.startswith("{"))
    assert (ours["edgetrain"], theirs["edgetrain"]) == (True, False)
    # Theirs shows what is being measured: the metrics' retrace, and Horovod's Python converted.
    assert theirs["traces"] == 4 and theirs["converted"].get("horovod", 0) > 0
    assert ours["traces"] == 2 and "horovod" not in ours["converted"]
    assert ours["weights"] == theirs["weights"]
