"""Checkpoint directories: atomic publication, manifests, verification."""

from __future__ import annotations

import pytest

from edgetrain.shared import checkpoints
from edgetrain.shared.errors import EdgetrainError


def save(content: bytes):
    def write(d):
        (d / "state.index").write_bytes(b"index")
        (d / "state.data").write_bytes(content)
    return write


def test_write_publishes_a_verified_checkpoint(tmp_path):
    ckpt = checkpoints.write(tmp_path, 3, "lenet", {"val_accuracy": 0.9}, save(b"weights"))
    assert ckpt.path.name == "epoch-0003" and ckpt.epoch == 3 and ckpt.job == "lenet"
    assert set(ckpt.manifest["files"]) == {"state.index", "state.data"}
    checkpoints.verify(checkpoints.read(ckpt.path))


def test_failed_save_leaves_nothing(tmp_path):
    def broken(d):
        (d / "half").write_bytes(b"x")
        raise OSError("disk full")
    with pytest.raises(OSError):
        checkpoints.write(tmp_path, 1, "lenet", {}, broken)
    assert list(tmp_path.iterdir()) == []


def test_latest_ignores_unpublished_directories(tmp_path):
    checkpoints.write(tmp_path, 1, "lenet", {}, save(b"a"))
    checkpoints.write(tmp_path, 2, "lenet", {}, save(b"b"))
    (tmp_path / ".epoch-0003.tmp").mkdir()
    (tmp_path / "epoch-0004").mkdir()  # no manifest: never finished
    assert checkpoints.latest(tmp_path).epoch == 2
    assert [c.epoch for c in checkpoints.all_in(tmp_path)] == [1, 2]


def test_tampering_is_detected(tmp_path):
    ckpt = checkpoints.write(tmp_path, 1, "lenet", {}, save(b"weights"))
    (ckpt.path / "state.data").write_bytes(b"weightz")
    with pytest.raises(EdgetrainError, match="does not match its manifest"):
        checkpoints.verify(ckpt)
    (ckpt.path / "state.data").unlink()
    with pytest.raises(EdgetrainError, match="missing state.data"):
        checkpoints.verify(ckpt)
