"""Names that rank 0's node wrote - in outputs.json and in checkpoint manifests - stay inside the
run directory when a run is collected; a manifest of the wrong shape is one warning, not a crash."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from edgetrain.controller import collect
from edgetrain.shared import checkpoints, runs
from edgetrain.shared.datasets import sha256_file
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.layout import RunLayout


def save(d: Path) -> None:
    (d / "state").write_bytes(b"weights")


@pytest.fixture
def run(tmp_path) -> runs.Run:
    run = runs.Run(tmp_path / "runs" / "r1")
    run.checkpoints.mkdir(parents=True)
    checkpoints.write(run.checkpoints, 1, "lenet", {}, save)
    return run


def test_outputs_json_naming_files_outside_the_run_is_refused(tmp_path, run):
    bait = tmp_path / "runs" / "bait.txt"  # outside the run directory, beside it
    bait.write_text("someone else's\n")
    (run.path / "work").mkdir()
    (run.path / "work" / "model.txt").write_text("mine\n")
    digest = sha256_file(bait)
    (run.path / RunLayout.OUTPUTS_LIST).write_text(json.dumps({"work": {"model.txt": sha256_file(run.path / "work" / "model.txt"),
                                                              "../../bait.txt": digest, str(bait): digest},
                                                     "outputs": {}}))
    dest = tmp_path / "dest"
    result = collect.collect_local(run, dest)
    assert result.outputs == ["work/model.txt"]
    assert not (dest / "bait.txt").exists() and sorted(p.name for p in dest.iterdir()) == ["r1"]
    assert len(result.warnings) == 2 and all("outside the run directory: not collected" in w for w in result.warnings)


def test_a_checkpoint_manifest_naming_files_outside_it_is_left_out(tmp_path, run):
    bait = tmp_path / "runs" / "bait.bin"
    bait.write_bytes(b"someone else's")
    forged = checkpoints.write(run.checkpoints, 2, "lenet", {}, save)
    manifest = {**forged.manifest, "files": {"state": forged.manifest["files"]["state"], "../../../bait.bin": sha256_file(bait)}}
    (forged.path / checkpoints.MANIFEST).write_text(json.dumps(manifest))
    result = collect.collect_local(run, tmp_path / "dest")
    assert result.checkpoints == [1] and not (tmp_path / "dest" / "bait.bin").exists()
    assert len(result.warnings) == 1 and "names files outside the checkpoint: '../../../bait.bin'" in result.warnings[0]


@pytest.mark.parametrize("manifest", [[], {"job": "lenet", "epoch": "two", "files": {}},
                                      {"job": "lenet", "epoch": 2, "files": ["state"]},
                                      {"job": ["lenet"], "epoch": 2, "files": {}}])
def test_a_manifest_of_the_wrong_shape_is_one_warning(tmp_path, run, manifest):
    damaged = run.checkpoints / "epoch-0002"
    damaged.mkdir()
    (damaged / checkpoints.MANIFEST).write_text(json.dumps(manifest))
    result = collect.collect_local(run, tmp_path / "dest")
    assert result.checkpoints == [1] and len(result.warnings) == 1 and "epoch-0002" in result.warnings[0]
    with pytest.raises(EdgetrainError, match="has no readable manifest"):
        checkpoints.read(damaged)
    assert runs.summarize(run).checkpoint == 1


@pytest.mark.parametrize("name", ["a/../../b", "/etc/passwd", "..", "", "a//b", "./a", "a\\..\\b", "a\nb"])
def test_only_plain_relative_names_are_confined(name):
    assert not checkpoints.confined(name)
    assert checkpoints.confined("tb/train/events.out") and checkpoints.confined("state.data-00000-of-00001")
