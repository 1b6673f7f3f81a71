"""Temp directories of a process killed outright go with the next one made (edgetrain.shared.tempdirs)."""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path

from edgetrain.shared import tempdirs


def test_a_killed_processs_directory_goes_when_the_next_one_is_made(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    ended = subprocess.Popen(["true"])
    ended.wait()  # a pid no process has now: a rank or a controller killed outright
    dead_rank = tmp_path / f"edgetrain-rank1-pid{ended.pid}-x1"
    dead_ssh = tmp_path / f"edgetrain-ssh-pid{ended.pid}-x2"
    alive = tmp_path / f"edgetrain-rank0-pid{os.getpid()}-x3"  # still running
    unnamed = tmp_path / "edgetrain-rank2-x4"  # no pid in its name: not for this sweep to judge
    for d in (dead_rank, dead_ssh, alive, unnamed):
        d.mkdir()
        (d / "__autograph_generated_file.py").write_text("")
    new = Path(tempdirs.make("rank0"))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([alive.name, unnamed.name, new.name])
    assert new.name.startswith(f"edgetrain-rank0-pid{os.getpid()}-") and not any(new.iterdir())
