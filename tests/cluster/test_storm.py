"""A short seeded storm on the testbed's container cluster (lab/storm.py): one run, two faults
drawn from the seed, each met as a user would, and every check but the comparison with an
undisturbed run. The 30-minute storm of ten faults is `python -m lab storm` (docs/cli.md)."""

from __future__ import annotations

import json

import pytest

from lab import storm

from .long_run import STEPS, fault_cluster

pytestmark = [pytest.mark.cluster, pytest.mark.docker, pytest.mark.slow]

# Seed 11 draws the rank-0 node's disk filled, then the controller killed: two resumes by the
# command edgetrain gives, one after the other, in one run.
SEED = 11


def test_a_seeded_storm_of_two_faults_loses_nothing(cluster, report):
    c = fault_cluster(cluster)
    said: list[str] = []
    outcome = storm.storm(c.bed, c.inventory, c.env, c.runs, f"{c.home}/runs", seed=SEED, minutes=3, faults=2, max_steps=STEPS,
                          log=said.append)
    assert not outcome.problems, "\n".join(outcome.problems + said)
    assert [f.planned.kind for f in outcome.injected] == [storm.Kind.DISK, storm.Kind.CONTROLLER], said
    assert all(f.back is not None for f in outcome.injected) and outcome.lines[-1] == "lost: nothing", said
    assert c.run_json(outcome.rid)["status"] == "completed"
    kept = json.loads(json.dumps(outcome.figures))  # what --out keeps, and the docs' table reads
    assert [f["kind"] for f in kept["faults"]] == ["disk", "controller"] and kept["checkpoints_verified"] > 0, kept
    assert "| rank-0 disk full (node1) |" in storm.docs_table(kept), kept
    report[f"storm seed {SEED}, 2 faults"] = "; ".join(
        f"{f.planned.kind.value}: training again {f.back - f.at:.0f} s after, {f.lost_s:.0f} s lost" for f in outcome.injected)
