"""Horovod's Gloo under mpirun (edgetrain.rank.rendezvous): real MPICH, Horovod and Gloo on loopback.

Several CPU nodes get Gloo by default (placement); on one machine an inventory asks for it, which
is the same path through the worker."""

from __future__ import annotations

import json
import textwrap

import pytest

from edgetrain.rank import rendezvous
from edgetrain.shared import runs
from tests.conftest import edgetrain


pytestmark = pytest.mark.mpi

SCRIPT = """\
import json, os
import horovod.tensorflow as hvd
import tensorflow as tf

hvd.init()
total = hvd.allreduce(tf.constant([float(hvd.rank() + 1)] * 4), op=hvd.Sum)
print("RESULT " + json.dumps({"rank": hvd.rank(), "size": hvd.size(), "local_rank": hvd.local_rank(),
      "gloo": bool(hvd.gloo_enabled()), "mpi": bool(hvd.mpi_enabled()), "sum": total.numpy().tolist(),
      "rendezvous": os.environ.get("HOROVOD_GLOO_RENDEZVOUS_ADDR")}), flush=True)
"""


def inventory(tmp_path, mpi_env: dict[str, str]):
    env = "".join(f"\n        {k}: {v}" for k, v in mpi_env.items())
    path = tmp_path / "inventory" / "hosts.yml"
    path.parent.mkdir()
    path.write_text(textwrap.dedent("""\
        cluster:
          children:
            head:
              hosts:
                localhost: {ansible_connection: local}
          vars:
            edgetrain_runtime: host
            edgetrain_iface: lo
            edgetrain_mpi_env:""") + env + "\n")
    return path


def results(root) -> list[dict]:
    [run] = runs.all_runs(root)
    lines = [line for n in range(2) for line in (run.path / f"rank.{n}.log").read_text().splitlines()]
    return sorted((json.loads(line[len("RESULT "):]) for line in lines if line.startswith("RESULT ")), key=lambda r: r["rank"])


@pytest.mark.parametrize("transport", ["gloo", "mpi"])
def test_a_script_under_mpirun_uses_the_collectives_the_inventory_names(tmp_path, transport):
    script = tmp_path / "job" / "allreduce.py"
    script.parent.mkdir()
    script.write_text(SCRIPT)
    env = {"HOROVOD_CONTROLLER": transport, "HOROVOD_CPU_OPERATIONS": transport}
    if transport == "gloo":
        env["HOROVOD_GLOO_IFACE"] = "lo"
    root = tmp_path / "runs"
    result = edgetrain("run", str(script), "--np", "2", "-i", str(inventory(tmp_path, env)), "--runs-dir", str(root))
    assert result.returncode == 0, result.stdout + result.stderr
    ranks = results(root)
    assert [r["rank"] for r in ranks] == [0, 1]
    for r in ranks:
        assert r["size"] == 2 and r["local_rank"] == r["rank"] and r["sum"] == [3.0] * 4
        assert (r["gloo"], r["mpi"]) == (transport == "gloo", transport == "mpi")
        assert r["rendezvous"] == ("127.0.0.1" if transport == "gloo" else None)


def test_gloo_is_set_up_only_for_several_ranks_without_a_rendezvous():
    asked = {"HOROVOD_CONTROLLER": "gloo", "PMI_SIZE": "2"}
    assert rendezvous.wanted(asked)
    assert not rendezvous.wanted({**asked, "PMI_SIZE": "1"})
    assert not rendezvous.wanted({**asked, "HOROVOD_GLOO_RENDEZVOUS_ADDR": "198.18.0.1"})  # horovodrun's ranks
    assert not rendezvous.wanted({**asked, "HOROVOD_CONTROLLER": "mpi"})
    single = dict(asked, PMI_SIZE="1")
    assert rendezvous.set_up(single) is None and single == dict(asked, PMI_SIZE="1")
