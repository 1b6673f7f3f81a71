"""Every bad input ends in one clear line on stderr, a non-zero exit, and nothing lost on disk."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

from edgetrain import checkpoints, datasets

from .conftest import edgetrain, snapshot


def assert_one_line_error(result, *fragments: str, code: int = 1) -> str:
    assert result.returncode == code, (result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("edgetrain: error: "), result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


@pytest.fixture
def existing_runs(tmp_path):
    """A runs directory already holding a finished run, which no failed command may touch."""
    root = tmp_path / "runs"
    run = root / "20260101-000000-lenet-abcd"
    (run / "checkpoints").mkdir(parents=True)
    (run / "run.json").write_text('{"id": "20260101-000000-lenet-abcd", "job": "lenet", "status": "completed"}\n')
    (run / "metrics.jsonl").write_text('{"epoch": 1, "loss": 0.1}\n')
    checkpoints.write(run / "checkpoints", 1, "lenet", {"val_accuracy": 0.98}, lambda d: (d / "state.index").write_bytes(b"w"))
    return root


def test_unknown_job(existing_runs):
    before = snapshot(existing_runs)
    r = edgetrain("run", "resnet", "--runs-dir", str(existing_runs))
    assert_one_line_error(r, "unknown job 'resnet'", "lenet, fashion", code=2)
    assert snapshot(existing_runs) == before


def test_np_zero(existing_runs):
    before = snapshot(existing_runs)
    assert_one_line_error(edgetrain("run", "lenet", "--np", "0", "--runs-dir", str(existing_runs)), "--np 0", code=2)
    assert snapshot(existing_runs) == before


def test_option_of_another_job(existing_runs):
    assert_one_line_error(edgetrain("run", "lenet", "--depth", "3", "--runs-dir", str(existing_runs)), "no option --depth", code=2)


def test_accuracy_given_as_percent(existing_runs):
    assert_one_line_error(edgetrain("run", "lenet", "--target-accuracy", "97", "--runs-dir", str(existing_runs)), "fraction", code=2)


def test_corrupt_dataset(existing_runs, tmp_path):
    data = tmp_path / "data" / "mnist"
    data.mkdir(parents=True)
    hub = datasets.search_path("mnist")[-1].path / "mnist.pkl.gz"
    blob = bytearray(hub.read_bytes())
    blob[1000] ^= 0xFF
    (data / "mnist.pkl.gz").write_bytes(bytes(blob))
    before = snapshot(existing_runs)
    r = edgetrain("run", "lenet", "--data-dir", str(tmp_path / "data"), "--runs-dir", str(existing_runs))
    assert_one_line_error(r, "mnist.pkl.gz is corrupt", "edgetrain data fetch mnist")
    assert snapshot(existing_runs) == before
    assert (data / "mnist.pkl.gz").read_bytes() == bytes(blob), "the bad file is the user's to inspect: left as it was"


def test_unwritable_runs_dir(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("keep me")
    r = edgetrain("run", "lenet", "--runs-dir", str(blocker / "runs"))
    assert_one_line_error(r, f"cannot write run directory {blocker / 'runs'}", "--runs-dir")
    assert blocker.read_text() == "keep me"


def test_no_mpirun_on_path(existing_runs):
    before = snapshot(existing_runs)
    r = edgetrain("run", "lenet", "--runs-dir", str(existing_runs), env={"PATH": str(Path(sys.executable).parent)})
    assert shutil.which("mpirun", path=str(Path(sys.executable).parent)) is None
    assert_one_line_error(r, "mpirun is not on PATH", "install MPICH")
    assert snapshot(existing_runs) == before


def test_resume_of_unknown_run(existing_runs):
    before = snapshot(existing_runs)
    assert_one_line_error(edgetrain("run", "lenet", "--resume", "2099", "--runs-dir", str(existing_runs)), "no run '2099'", "edgetrain runs list")
    assert snapshot(existing_runs) == before


def test_resume_with_another_job(existing_runs):
    before = snapshot(existing_runs)
    r = edgetrain("run", "fashion", "--resume", "20260101", "--runs-dir", str(existing_runs))
    assert_one_line_error(r, "holds a lenet checkpoint, not fashion", "edgetrain run lenet --resume 20260101-000000-lenet-abcd")
    assert snapshot(existing_runs) == before


def test_resume_of_a_finished_run(existing_runs):
    r = edgetrain("run", "lenet", "--resume", "20260101", "--epochs", "1", "--runs-dir", str(existing_runs))
    assert_one_line_error(r, "already finished epoch 1", "--epochs 2", code=2)


def test_resume_with_a_damaged_checkpoint(existing_runs):
    ckpt = existing_runs / "20260101-000000-lenet-abcd" / "checkpoints" / "epoch-0001"
    (ckpt / "state.index").write_bytes(b"x")
    before = snapshot(existing_runs)
    r = edgetrain("run", "lenet", "--resume", "20260101", "--epochs", "2", "--runs-dir", str(existing_runs))
    assert_one_line_error(r, "does not match its manifest")
    assert snapshot(existing_runs) == before


def test_collect_unknown_run(existing_runs, tmp_path):
    assert_one_line_error(edgetrain("collect", "nope", "--dest", str(tmp_path / "d"), "--runs-dir", str(existing_runs)), "no run 'nope'")


def test_data_import_of_a_stranger(tmp_path):
    (tmp_path / "x.gz").write_bytes(b"not a dataset")
    assert_one_line_error(edgetrain("data", "import", str(tmp_path / "x.gz")), "not a known dataset file")


def test_runs_list_and_show(existing_runs):
    r = edgetrain("runs", "list", "--runs-dir", str(existing_runs))
    assert r.returncode == 0 and "20260101-000000-lenet-abcd" in r.stdout and "epoch 1" in r.stdout


def test_missing_argument_is_a_usage_error():
    r = edgetrain("run")
    assert r.returncode == 2 and "Missing argument" in r.stderr and "Traceback" not in r.stderr
