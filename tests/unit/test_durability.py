"""What survives a power cut: run.json's rewrite is synced, directory included, and a checkpoint
epoch written again replaces its older copy only once the new one is in place."""

from __future__ import annotations

import json
import subprocess
import sys


from edgetrain.shared import checkpoints, runs


def test_a_write_syncs_the_file_and_then_the_directory_holding_its_new_name(tmp_path):
    run_dir = tmp_path / "r1"
    run_dir.mkdir()
    code = f"from pathlib import Path; from edgetrain.shared import runs; runs.Run(Path({str(run_dir)!r})).write(None, job='lenet', status='failed')"
    traced = subprocess.run(["strace", "-f", "-y", "-e", "trace=fsync,fdatasync,rename,renameat,renameat2", sys.executable, "-c", code],
                            capture_output=True, text=True, check=True)
    calls = [line for line in traced.stderr.splitlines() if "fsync(" in line or "rename" in line]
    renamed = next(i for i, c in enumerate(calls) if f'"{run_dir}/run.json"' in c)
    assert any(f"<{run_dir}/run.json.tmp>" in c for c in calls[:renamed])  # the content, before its name
    assert any("sync(" in c and f"<{run_dir}>" in c for c in calls[renamed + 1:])  # the name itself
    assert runs.Run(run_dir).record().status == "failed"


WATCH = """
import json, sys
from pathlib import Path
from edgetrain.shared import checkpoints
final = Path(sys.argv[1]) / "epoch-0002"
seen = []
def hook(event, args):
    if event == "shutil.rmtree":
        manifest = final / checkpoints.MANIFEST
        seen.append(json.loads(manifest.read_text())["metrics"] if manifest.is_file() else None)
sys.addaudithook(hook)
checkpoints.write(final.parent, 2, "lenet", {"copy": "new"}, lambda d: (d / "state").write_bytes(b"new"))
print(json.dumps(seen))
"""


def test_a_checkpoint_written_again_removes_its_older_copy_only_once_the_new_one_is_in_place(tmp_path):
    """A resume re-doing epoch 2: whenever anything is removed, epoch-0002 already holds the new copy."""
    checkpoints.write(tmp_path, 2, "lenet", {"copy": "old"}, lambda d: (d / "state").write_bytes(b"old"))
    watched = subprocess.run([sys.executable, "-c", WATCH, str(tmp_path)], capture_output=True, text=True, check=True)
    assert json.loads(watched.stdout) == [{"copy": "new"}]
    ckpt = checkpoints.read(tmp_path / "epoch-0002")
    checkpoints.verify(ckpt)
    assert ckpt.manifest["metrics"] == {"copy": "new"} and sorted(p.name for p in tmp_path.iterdir()) == ["epoch-0002"]
