"""What the controller writes on a node never goes through a link a rank left there: the ranks can
write their run directory (on the host runtime it is this machine's, in a container it is mounted
read-write), so a resume, or a restart under --max-restarts, replaces what it finds rather than
writing to what it names; and ``clean --store`` prunes only the store's own directories. With
the real CLI on the host runtime, the real shell command a node runs, and the real store program."""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import shutil
import stat
import subprocess
import time
from pathlib import Path

import pytest

from edgetrain.controller import containers, node_store
from edgetrain.shared.layout import RunLayout
from tests.conftest import edgetrain, project_script


KEYS = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOriginalKeyOfTheNode pi@node\n"


def test_a_resume_replaces_a_rank_s_links_in_the_run_directory_and_writes_through_none(isolated):
    """The issue's case: the program links workdir.json to ~/.ssh/authorized_keys (a stand-in
    here), the machinefile to another file of the user's, and the dataset directory to another directory of the user's; the resume wrote the
    manifest over the keys and its dataset links into that directory."""
    keys = isolated / "home" / ".ssh" / "authorized_keys"
    keys.parent.mkdir(parents=True)
    keys.write_text(KEYS)
    elsewhere = isolated / "home" / "notes"
    elsewhere.mkdir()
    (elsewhere / "todo.txt").write_text("mine\n")
    machines = isolated / "home" / "hosts.txt"
    machines.write_text("my own list\n")
    script = project_script(isolated, f"""import os, shutil
run = os.environ["EDGETRAIN_RUN_DIR"]
os.unlink(os.path.join(run, "workdir.json"))
os.symlink(os.path.relpath({str(keys)!r}, run), os.path.join(run, "workdir.json"))
os.unlink(os.path.join(run, "machinefile"))
os.symlink({str(machines)!r}, os.path.join(run, "machinefile"))
data = os.environ["EDGETRAIN_DATA"]
print("datasets staged:", sorted(os.listdir(data)))
shutil.rmtree(data)
os.symlink({str(elsewhere)!r}, data)
""")
    first = edgetrain("run", str(script), "--np", "1")
    assert first.returncode == 0, first.stderr
    [staged] = [line for line in first.stdout.splitlines() if line.startswith("datasets staged: ['")]  # one to replace
    [run_dir] = [p for p in (isolated / "runs").iterdir() if not p.name.startswith(".")]
    assert (run_dir / RunLayout.WORKDIR_MANIFEST).is_symlink() and (run_dir / "data").is_symlink()

    resumed = edgetrain("run", str(script), "--np", "1", "--resume", run_dir.name)
    assert resumed.returncode == 0, resumed.stderr
    assert keys.read_text() == KEYS
    assert machines.read_text() == "my own list\n"  # the machinefile, written on the controller
    assert sorted(p.name for p in elsewhere.iterdir()) == ["todo.txt"]
    # The resumed rank had its working copy from the manifest and the datasets staged anew.
    assert staged in resumed.stdout.splitlines(), resumed.stdout


def write(path: Path, content: str) -> subprocess.CompletedProcess:
    return subprocess.run(["sh", "-c", containers.write_file(str(path))], input=content, capture_output=True, text=True)


def test_a_file_a_node_is_given_replaces_a_link_and_never_writes_through_it(tmp_path):
    """The command behind workdir.json and the container's lease, as a node runs it."""
    keys = tmp_path / "authorized_keys"
    keys.write_text(KEYS)
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    (run_dir / "workdir.json").symlink_to("../authorized_keys")
    done = write(run_dir / "workdir.json", '{"files": []}\n')
    assert done.returncode == 0, done.stderr
    assert keys.read_text() == KEYS
    written = run_dir / "workdir.json"
    assert not written.is_symlink() and written.read_text() == '{"files": []}\n'
    assert stat.S_IMODE(written.stat().st_mode) == 0o600
    assert os.listdir(run_dir) == ["workdir.json"]  # nothing left beside it


def test_a_directory_in_place_of_a_file_a_node_is_given_is_an_error_and_stays(tmp_path):
    (tmp_path / "workdir.json").mkdir()
    (tmp_path / "workdir.json" / "kept").write_text("x")
    done = write(tmp_path / "workdir.json", "{}\n")
    assert done.returncode != 0 and "cannot overwrite directory" in done.stderr, done.stderr
    assert os.listdir(tmp_path / "workdir.json") == ["kept"] and os.listdir(tmp_path) == ["workdir.json"]


def aged(path: Path) -> None:
    then = time.time() - node_store.GRACE_SECONDS - 60
    os.utime(path, (then, then), follow_symlinks=False)


@pytest.mark.parametrize("own", [node_store.VIEWS, node_store.STORE])
def test_clean_store_prunes_nothing_through_a_link_in_place_of_the_stores_directories(tmp_path, own):
    """Every entry over an hour old in the directory the link pointed to was removed."""
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "photos").mkdir(parents=True)
    (elsewhere / "thesis.tex").write_text("years of work\n")
    for p in (elsewhere / "photos", elsewhere / "thesis.tex"):
        aged(p)
    runs_dir = tmp_path / "runs"
    runs_dir.mkdir()
    (runs_dir / own).symlink_to(elsewhere)
    result = edgetrain("clean", "-i", "inventories/local", "--store", "--runs-dir", str(runs_dir))
    assert sorted(os.listdir(elsewhere)) == ["photos", "thesis.tex"]
    assert result.returncode != 0 and f"{runs_dir / own} is not a directory (a link?)" in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_pruning_removes_an_old_view_without_following_a_link_inside_it(tmp_path):
    """A view holding a link to a directory (never one edgetrain makes) loses the link, not what it names."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "kept.txt").write_text("mine\n")
    view = tmp_path / "runs" / node_store.VIEWS / "r-old"
    (view / "sub").mkdir(parents=True)
    (view / "sub" / "link").symlink_to(elsewhere)
    (view / "file").write_text("x")
    aged(view)
    assert node_store.prune(str(tmp_path / "runs"), set(), time.time()) == (0, 0, 1)
    assert not view.exists() and os.listdir(elsewhere) == ["kept.txt"]


def test_two_stagings_of_one_view_at_once_both_succeed(tmp_path):
    """Two inventory names for one machine stage the same view at the same time (tests/mpi's
    localhost and loopback once failed on it with EEXIST): each takes what the other linked first,
    and the view ends holding exactly the run's files, each the store's own."""
    store, view = tmp_path / "store", tmp_path / "views" / "r1"
    store.mkdir()
    digests = set()
    for k in range(200):
        data = f"file {k}\n".encode()
        digest = hashlib.sha256(data).hexdigest()
        (store / digest).write_bytes(data)
        digests.add(digest)
    ctx = multiprocessing.get_context("fork")
    for _ in range(5):
        with ctx.Pool(2) as pool:
            pool.starmap(node_store.view, [(str(store), str(view), digests)] * 2)
        assert set(os.listdir(view)) == digests
        assert all((view / d).stat().st_ino == (store / d).stat().st_ino for d in digests)
        shutil.rmtree(view)
