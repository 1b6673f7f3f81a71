"""Shipping a script's folder: what is listed, the size limit, the content-addressed store, the working copy."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from edgetrain.controller import shipping
from edgetrain.shared import workdir
from edgetrain.shared.errors import EdgetrainError, UsageError
from edgetrain.controller.inventory import Host
from edgetrain.controller.remote import Nodes
from tests.conftest import assert_one_line_error, edgetrain


LOCAL = Host(name="localhost", address="localhost", arch="x86_64", slots=2, runtime="host", connection="local")


@pytest.fixture
def project(tmp_path) -> Path:
    root = tmp_path / "project"
    for rel, text in {
        "train.py": "print('hi')\n",
        "lib/model.py": "X = 1\n",
        "data/big.ckpt": "weights\n",
        "data/keep.ckpt": "kept\n",
        ".git/config": "[core]\n",
        "lib/__pycache__/model.cpython-311.pyc": "bytecode",
        "notes/todo.txt": "later\n",
    }.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "train.py").chmod(0o755)
    return root


def test_scan_honours_the_ignore_file_and_always_skips_vcs_and_caches(project):
    (project / ".edgetrainignore").write_text("# not needed\n*.ckpt\n!keep.ckpt\nnotes/\n")
    m = workdir.scan(project)
    assert [e.path for e in m.entries] == [".edgetrainignore", "train.py", "data/keep.ckpt", "lib/model.py"]
    assert m.ignore_file == ".edgetrainignore"
    assert next(e for e in m.entries if e.path == "train.py").mode == 0o755


def test_dockerignore_is_read_when_there_is_no_edgetrainignore(project):
    (project / ".dockerignore").write_text("data\n")
    assert "data/keep.ckpt" not in [e.path for e in workdir.scan(project).entries]


def test_a_folder_over_the_limit_is_refused_before_anything_is_hashed(project):
    (project / "dataset.bin").write_bytes(b"\0" * 4096)
    with pytest.raises(UsageError) as err:
        workdir.scan(project, max_bytes=2048)
    assert "more than 0 MiB" in str(err.value) and ".edgetrainignore" in str(err.value) and "--max-workdir-mb" in str(err.value)


def test_ship_sends_only_what_the_store_lacks_and_the_copy_is_exact(project, tmp_path):
    store = tmp_path / "store"
    m = workdir.scan(project)
    with Nodes() as nodes:
        first = shipping.ship(nodes, LOCAL, str(store), m)
        again = shipping.ship(nodes, LOCAL, str(store), m)
        (project / "lib/model.py").write_text("X = 2\n")
        changed = shipping.ship(nodes, LOCAL, str(store), workdir.scan(project))
    assert (first.files, first.bytes) == (len({e.sha256 for e in m.entries}), sum(e.size for e in m.entries))
    assert (again.files, again.bytes) == (0, 0)
    assert (changed.files, changed.bytes) == (1, len("X = 2\n"))
    dest = tmp_path / "work"
    workdir.materialize(workdir.scan(project), store, dest)
    # The working copy keeps only the owner's bits: the login user's alone.
    assert (dest / "lib/model.py").read_text() == "X = 2\n" and os.stat(dest / "train.py").st_mode & 0o777 == 0o700


def test_a_file_damaged_on_the_way_never_enters_the_store(project, tmp_path):
    store = tmp_path / "store"
    m = workdir.scan(project)
    (project / "train.py").write_text("print('changed after it was hashed')\n")  # what arrives no longer matches
    with Nodes() as nodes, pytest.raises(EdgetrainError, match="shipping the working directory to localhost failed"):
        shipping.ship(nodes, LOCAL, str(store), m)
    assert sorted(p.name for p in store.iterdir()) == []


def test_materialize_keeps_what_the_script_wrote_and_refuses_a_damaged_store(project, tmp_path):
    store, dest = tmp_path / "store", tmp_path / "work"
    m = workdir.scan(project)
    with Nodes() as nodes:
        shipping.ship(nodes, LOCAL, str(store), m)
    workdir.materialize(m, store, dest)
    (dest / "checkpoint-1.h5").write_text("model")
    (dest / "train.py").write_text("edited on the node")
    workdir.materialize(m, store, dest)  # a resumed run
    assert (dest / "checkpoint-1.h5").read_text() == "model" and (dest / "train.py").read_text() == "print('hi')\n"
    assert workdir.changed(m, dest) == {"checkpoint-1.h5": workdir.sha256_file(dest / "checkpoint-1.h5")}
    blob = store / next(e.sha256 for e in m.entries if e.path == "lib/model.py")
    blob.chmod(0o644)
    blob.write_text("rot")
    (dest / "lib/model.py").unlink()
    with pytest.raises(EdgetrainError, match="file store is damaged"):
        workdir.materialize(m, store, dest)


def test_a_node_can_send_only_what_was_asked_for(tmp_path):
    """A node's run directory holding a link among its rank logs and a run.json of its own."""
    node = tmp_path / "node-run"
    node.mkdir()
    (node / "rank.0.log").write_text("rank 0\n")
    (node / "rank.1.log").symlink_to("/etc/passwd")
    (node / "run.json").write_text('{"status": "completed"}')
    dest = tmp_path / "controller-run"
    dest.mkdir()
    (dest / "run.json").write_text('{"status": "failed"}')
    with Nodes() as nodes:
        refused = nodes.fetch(LOCAL, str(node), ["rank.*.log", "run.json"], dest)
    assert (dest / "rank.0.log").read_text() == "rank 0\n"
    assert not (dest / "rank.1.log").exists() and (dest / "run.json").read_text() == '{"status": "failed"}'
    assert sorted(refused) == ["rank.1.log (a link or special file)", "run.json (not asked for)"]


def test_a_folder_of_too_many_files_is_refused_before_anything_ships(tmp_path):
    """20,000 empty files: under the size limit, but each costs the nodes a store entry, a link per
    run and a copy per rank."""
    proj = tmp_path / "proj"
    (proj / "frames").mkdir(parents=True)
    (proj / "train.py").write_text("print('hi')\n")
    for i in range(20_000):
        (proj / "frames" / f"{i:05d}").touch()
    root = tmp_path / "runs"
    r = edgetrain("run", str(proj / "train.py"), "--np", "1", "--runs-dir", str(root))
    assert_one_line_error(r, "holds more than 10000 files to ship", ".edgetrainignore",
                          "--max-workdir-files", code=2)
    assert not root.exists() or not list(root.iterdir())


def test_the_file_limit_counts_what_ships(tmp_path):
    proj = tmp_path / "proj"
    proj.mkdir()
    for name in ("a.py", "b.py", "c.py", ".env"):
        (proj / name).write_text(name)
    assert len(workdir.scan(proj, max_files=3).entries) == 3  # .env stays home, so it is not counted
    (proj / "d.py").write_text("d")
    with pytest.raises(UsageError, match="holds more than 3 files to ship .at d.py.") as err:
        workdir.scan(proj, max_files=3)
    assert "--max-workdir-files" in err.value.fix


def test_a_link_to_a_folder_ships_the_folders_files_and_one_to_a_folder_it_is_in_is_named(tmp_path):
    shared = tmp_path / "shared" / "lib"
    (shared / "sub").mkdir(parents=True)
    (shared / "model.py").write_text("X = 1\n")
    (shared / "sub" / "layers.py").write_text("Y = 2\n")
    (shared / "sub" / "up").symlink_to("..")  # followed, it would never end
    proj = tmp_path / "proj"
    proj.mkdir()
    (proj / "train.py").write_text("import lib.model\n")
    (proj / "lib").symlink_to(shared)
    (proj / "self").symlink_to(".")
    m = workdir.scan(proj)
    assert [e.path for e in m.entries] == ["train.py", "lib/model.py", "lib/sub/layers.py"]
    assert sorted(m.looped) == ["lib/sub/up", "self"]
    assert any("lib/sub/up, self" in note or "self, lib/sub/up" in note for note in m.notes)
    store, dest = tmp_path / "store", tmp_path / "work"
    with Nodes() as nodes:
        shipping.ship(nodes, LOCAL, str(store), m)
    workdir.materialize(m, store, dest)
    assert (dest / "lib/sub/layers.py").read_text() == "Y = 2\n" and not (dest / "lib").is_symlink()
