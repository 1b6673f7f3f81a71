"""Every reader of a run's files survives wrong types and depth: `runs list` lists every other run
and names the damage in one line, `runs show` shows what is intact, `collect` of a run it cannot
read is one error line, and a damaged failure record is named while the failure report still
prints. Links a rank left in its run directory are never followed by the controller."""

from __future__ import annotations

import json
import os
import time

import pytest

from edgetrain.shared import checkpoints, runs, untrusted
from edgetrain.shared.datasets import sha256_file
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.layout import RunLayout
from tests.conftest import assert_one_line_error, edgetrain, project_script


GOOD, BAD = "20260101-000000-lenet-abcd", "20260102-000000-lenet-beef"
DEEP = "[" * 3000 + "]" * 3000
RUN_JSON = {"id": BAD, "job": "lenet", "status": "completed",
            "placement": {"np": 1, "runtime": "host", "strategy": "horovod", "inventory": "embedded", "hosts": [{"host": "vm", "ranks": 1}]},
            "attempts": [{"started": "2026-01-02T00:00:00Z", "command": ["edgetrain", "run", "lenet"], "np": 1, "mpirun": ["mpirun"]}]}


def make_run(root, run_id: str, record: dict | None = None):
    path = root / run_id
    (path / "checkpoints").mkdir(parents=True)
    (path / "run.json").write_text(json.dumps({**RUN_JSON, "id": run_id, **(record or {})}))
    (path / "metrics.jsonl").write_text('{"epoch": 1, "loss": 0.1, "val_accuracy": 0.9}\n')
    checkpoints.write(path / "checkpoints", 1, "lenet", {"ranks": 1}, lambda d: (d / "state").write_bytes(b"w"))
    return path


@pytest.fixture
def root(tmp_path):
    root = tmp_path / "runs"
    make_run(root, GOOD)
    make_run(root, BAD)
    return root


def listed(root) -> tuple[str, list[str]]:
    r = edgetrain("runs", "list", "--runs-dir", str(root), env={"COLUMNS": "200"})
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    assert GOOD in r.stdout and BAD in r.stdout
    return r.stdout, r.stderr.strip().splitlines()


@pytest.mark.parametrize("line, said", [
    ('{"epoch": [1], "loss": 0.5}', "epoch is a list, not a whole number"),
    ('{"epoch": 2, "val_accuracy": "high"}', "val_accuracy is a string, not a number"),
    ('{"kind": "eval", "epoch": 2, "val_accuracy": 0.5, "seconds": "soon"}', "seconds is a string, not a number"),
    ('{"kind": ["eval"], "epoch": 2}', "kind is a list, not a string"),
    ('{"epoch": 2, "x": ' + DEEP + "}", f"it nests deeper than {untrusted.MAX_DEPTH} levels"),
])
def test_a_metrics_line_of_the_wrong_type_is_named_and_the_rest_shown(root, line, said):
    with open(root / BAD / "metrics.jsonl", "a") as f:
        f.write(line + "\n")
    out, warnings = listed(root)
    assert "0.9000" in out.split(BAD)[1]  # the intact epoch's figures
    assert warnings == [f"edgetrain: warning: run {BAD}: metrics.jsonl line 2 is damaged ({said}; left out)"]
    shown = edgetrain("runs", "show", BAD, "--runs-dir", str(root), env={"COLUMNS": "200"})
    assert shown.returncode == 0 and "Traceback" not in shown.stderr, shown.stderr
    assert shown.stderr.strip().splitlines() == warnings
    as_json = json.loads(edgetrain("runs", "show", BAD, "--json", "--runs-dir", str(root)).stdout)
    assert [m["epoch"] for m in as_json["metrics"]] == [1] and said in as_json["problems"][0]


@pytest.mark.parametrize("change, said", [
    ({"attempts": [1]}, "attempts[0] is a whole number, not an object"),
    ({"placement": {**RUN_JSON["placement"], "hosts": "abc"}}, "placement.hosts is a string, not a list"),
    ({"placement": {**RUN_JSON["placement"], "nodes": {"vm": {"runs_dir": 7}}}}, "placement.nodes['vm'].runs_dir is a whole number, not a string"),
])
def test_a_run_json_of_the_wrong_type_is_marked_listed_and_one_error_line(root, tmp_path, change, said):
    (root / BAD / "run.json").write_text(json.dumps({**RUN_JSON, **change}))
    out, warnings = listed(root)
    assert "damaged" in out.split(BAD)[1] and "completed" in out.split(BAD)[0]
    assert warnings == [f"edgetrain: warning: run {BAD}'s run.json is damaged ({said}) - restore it from a copy "
                        "(edgetrain collect keeps one), or remove the run"]
    for args in (("runs", "show", BAD), ("collect", BAD, "--dest", str(tmp_path / "dest"))):
        assert_one_line_error(edgetrain(*args, "--runs-dir", str(root)), f"run.json is damaged ({said})", "restore it from a copy")


def test_a_run_json_nested_too_deep_is_marked_and_listed(root):
    (root / BAD / "run.json").write_text('{"id": "x", "job": "lenet", "status": "completed", "deep": ' + DEEP + "}")
    out, warnings = listed(root)
    assert warnings == [f"edgetrain: warning: run {BAD} has no readable run.json (it nests deeper than {untrusted.MAX_DEPTH} levels)"]
    assert_one_line_error(edgetrain("runs", "show", BAD, "--runs-dir", str(root)), "no readable run.json")


def test_a_checkpoint_manifest_nested_too_deep_is_left_out(root, tmp_path):
    ckpt = checkpoints.write(root / BAD / "checkpoints", 2, "lenet", {}, lambda d: (d / "state").write_bytes(b"w2"))
    (ckpt.path / checkpoints.MANIFEST).write_text('{"job": "lenet", "epoch": 2, "files": {}, "metrics": ' + DEEP + "}")
    out, warnings = listed(root)
    assert "epoch 1" in out.split(BAD)[1]
    assert len(warnings) == 1 and "epoch-0002 has no readable manifest (it nests deeper than" in warnings[0]
    got = edgetrain("collect", BAD, "--dest", str(tmp_path / "dest"), "--runs-dir", str(root))
    assert got.returncode == 0 and "checkpoints 1 verified" in got.stdout, got.stderr
    assert "epoch-0002 has no readable manifest" in got.stderr and not (tmp_path / "dest" / BAD / "checkpoints" / "epoch-0002").exists()


@pytest.mark.parametrize("digest, said", [
    ("0" * 63 + "\n" + "0" * 64, "files['state'] is not a sha256 (64 lowercase hex characters)"),
    ("A" * 64, "files['state'] is not a sha256"),
    (7, "files['state'] is not a sha256"),
])
def test_a_checkpoint_digest_that_is_not_a_sha256_makes_the_manifest_damaged(root, digest, said):
    manifest = root / BAD / "checkpoints" / "epoch-0001" / checkpoints.MANIFEST
    manifest.write_text(json.dumps({**json.loads(manifest.read_text()), "files": {"state": digest}}))
    with pytest.raises(EdgetrainError, match="has no readable manifest"):
        checkpoints.read(manifest.parent)
    with pytest.raises(ValueError, match=said.replace("[", r"\[").replace("(", r"\(").replace(")", r"\)")):
        checkpoints.parse(manifest.read_text())


def test_a_resume_passes_over_a_manifest_whose_digest_would_add_lines_to_the_check(root):
    # A digest with a newline: sha256sum -c reads a line that checks another file, then a line it
    # cannot parse in place of the damaged file's, and passes the checkpoint.
    ckpt = root / BAD / "checkpoints" / "epoch-0001"
    (ckpt / "other").write_bytes(b"o")
    (ckpt / "state").write_bytes(b"bit rot")
    manifest = json.loads((ckpt / checkpoints.MANIFEST).read_text())
    manifest["files"] = {"state": f"{sha256_file(ckpt / 'other')}  other\n#"}
    (ckpt / checkpoints.MANIFEST).write_text(json.dumps(manifest))
    r = edgetrain("run", "lenet", "--resume", BAD, "--epochs", "1", "--runs-dir", str(root))
    assert_one_line_error(r, "has no intact checkpoint", "epoch-0001 (its manifest is damaged: files['state'] is not a sha256")


def test_an_outputs_json_nested_too_deep_is_named_by_show_and_refused_by_collect(root, tmp_path):
    (root / BAD / RunLayout.OUTPUTS_LIST).write_text('{"work": {}, "outputs": ' + DEEP + "}")
    shown = edgetrain("runs", "show", BAD, "--runs-dir", str(root), env={"COLUMNS": "200"})
    assert shown.returncode == 0 and "program: lenet" in shown.stdout, shown.stderr
    assert shown.stderr.strip().splitlines() == [f"edgetrain: warning: {root / BAD / RunLayout.OUTPUTS_LIST} is damaged (it nests deeper than "
                                                 f"{untrusted.MAX_DEPTH} levels) - collect again after a resume, or copy the run "
                                                 "directory by hand"]
    assert_one_line_error(edgetrain("collect", BAD, "--dest", str(tmp_path / "dest"), "--runs-dir", str(root)),
                          f"{RunLayout.OUTPUTS_LIST} is damaged (it nests deeper than")
    (root / BAD / RunLayout.OUTPUTS_LIST).write_text('{"work": {"a": "x"}, "outputs": {}}')
    assert_one_line_error(edgetrain("collect", BAD, "--dest", str(tmp_path / "dest"), "--runs-dir", str(root)),
                          f"{RunLayout.OUTPUTS_LIST} is damaged (work['a'] is not a sha256")


PLANTS_A_BAD_RECORD = """
import json, os, pathlib, time
run = pathlib.Path(os.environ["EDGETRAIN_RUN_DIR"])
record = {"rank": 5, "host": "nowhere", "pid": 1, "error": "planted", "time": time.time(), "elapsed": "early"}
(run / "rank.5.failure.json").write_text(json.dumps(record))
raise ValueError("the real failure")
"""


def test_a_damaged_failure_record_is_named_and_the_failure_report_still_prints(tmp_path):
    root = tmp_path / "runs"
    r = edgetrain("run", str(project_script(tmp_path, PLANTS_A_BAD_RECORD)), "--np", "1", "--runs-dir", str(root), timeout=120)
    assert r.returncode == 1 and "Traceback (most recent call last):\n  File" not in r.stderr.split("  | ")[0], r.stderr
    (run,) = runs.all_runs(root)
    assert (f"edgetrain: warning: {run.path / 'rank.5.failure.json'} is damaged (elapsed is a string, not a number or null): "
            "left out of the failure report") in " ".join(r.stdout.split())
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"edgetrain: error: run {run.id}: rank 0 on ") and "ValueError: the real failure" in last
    assert "resume with: edgetrain run " in last and f"--resume {run.id}" in last


def test_a_link_in_work_or_outputs_is_not_collected_and_is_named(root, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's own\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "key").write_text("another\n")
    run = root / BAD
    for d in ("work", "outputs", "tensorboard"):
        (run / d).mkdir()
    (run / "work" / "model.txt").write_text("mine\n")
    (run / "work" / "link.txt").symlink_to(secret)
    (run / "outputs" / "dir").symlink_to(elsewhere)
    (run / "tensorboard" / "events").symlink_to(secret)
    digest = sha256_file(secret)
    (run / RunLayout.OUTPUTS_LIST).write_text(json.dumps({"work": {"model.txt": sha256_file(run / "work" / "model.txt"), "link.txt": digest},
                                                "outputs": {"dir/key": sha256_file(elsewhere / "key")}}))
    dest = tmp_path / "dest"
    got = edgetrain("collect", BAD, "--dest", str(dest), "--runs-dir", str(root))
    assert got.returncode == 0 and "1 outputs verified" in got.stdout, got.stderr
    assert (dest / BAD / "work" / "model.txt").read_text() == "mine\n"
    copied = [p for p in (dest / BAD).rglob("*") if p.is_file()]
    assert not any(p.read_bytes() in (b"the user's own\n", b"another\n") for p in copied)
    assert sorted(got.stderr.strip().splitlines()) == sorted([
        f"edgetrain: warning: output {run / 'outputs' / 'dir' / 'key'} is a link: not collected",
        f"edgetrain: warning: output {run / 'work' / 'link.txt'} is a link: not collected",
        f"edgetrain: warning: {run / 'tensorboard' / 'events'} is a link: not collected",
    ])


def test_a_checkpoint_holding_a_link_is_not_collected(root, tmp_path):
    secret = tmp_path / "secret.txt"
    secret.write_text("the user's own\n")
    ckpt = checkpoints.write(root / BAD / "checkpoints", 2, "lenet", {}, lambda d: (d / "state").write_bytes(b"w2"))
    (ckpt.path / "state").unlink()
    (ckpt.path / "state").symlink_to(secret)
    manifest = {**ckpt.manifest, "files": {"state": sha256_file(secret)}}
    (ckpt.path / checkpoints.MANIFEST).write_text(json.dumps(manifest))
    got = edgetrain("collect", BAD, "--dest", str(tmp_path / "dest"), "--runs-dir", str(root))
    assert got.returncode == 0 and "checkpoints 1 verified" in got.stdout, got.stderr
    assert got.stderr.strip() == f"edgetrain: warning: {ckpt.path / 'state'} is a link: checkpoint epoch-0002 not collected"
    assert not (tmp_path / "dest" / BAD / "checkpoints" / "epoch-0002").exists()


def test_a_lock_that_is_a_link_is_not_followed(root, tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    (root / BAD / ".lock").symlink_to(target)
    r = edgetrain("run", "lenet", "--resume", BAD, "--np", "1", "--epochs", "2", "--max-steps", "1", "--runs-dir", str(root), timeout=300)
    assert_one_line_error(r, f"cannot lock run {BAD}: {root / BAD / '.lock'} is a link, not edgetrain's lock", "remove it")
    assert target.read_text() == "keep me\n" and (root / BAD / ".lock").is_symlink()
    assert runs.Run(root / BAD).record().status == "completed" and not runs.Run(root / BAD).live()


def test_a_run_json_tmp_that_is_a_link_is_replaced_not_written_through(root, tmp_path):
    target = tmp_path / "precious"
    target.write_text("keep me\n")
    run = runs.Run(root / BAD)
    (run.path / "run.json.tmp").symlink_to(target)
    before = time.time()
    run.write(run.record(), status="failed", error="test")
    assert target.read_text() == "keep me\n"
    assert run.record().status == "failed" and not os.path.lexists(run.path / "run.json.tmp")
    assert run.info_file.stat().st_mtime >= before - 1 and not run.info_file.is_symlink()


def test_a_shipped_manifest_nested_too_deep_is_named_by_show_and_refused_by_collect(root, tmp_path):
    # Without outputs.json (rank 0 killed before it listed them), outputs are found against what was shipped.
    (root / BAD / "work").mkdir()
    (root / BAD / RunLayout.WORKDIR_MANIFEST).write_text('{"root": "/p", "files": ' + DEEP + "}")
    shown = edgetrain("runs", "show", BAD, "--runs-dir", str(root), env={"COLUMNS": "200"})
    assert shown.returncode == 0 and "program: lenet" in shown.stdout, shown.stderr
    assert shown.stderr.strip().splitlines() == [f"edgetrain: warning: {root / BAD / RunLayout.WORKDIR_MANIFEST} is damaged (it nests deeper than "
                                                 f"{untrusted.MAX_DEPTH} levels) - copy the run directory by hand"]
    assert_one_line_error(edgetrain("collect", BAD, "--dest", str(tmp_path / "dest"), "--runs-dir", str(root)),
                          f"{RunLayout.WORKDIR_MANIFEST} is damaged (it nests deeper than")


def test_the_runs_directorys_write_test_writes_through_no_link(tmp_path, monkeypatch):
    """Issue 80, item 6: a link at .write-test-<pid> (pids are predictable) to another file had it
    truncated to 0 bytes. The probe's name is no longer predictable, and a link there is refused."""
    victim = tmp_path / "victim"
    victim.write_text("someone's data\n")
    shared = tmp_path / "runs"
    shared.mkdir()
    (shared / f".write-test-{os.getpid()}").symlink_to(victim)
    assert runs.ensure_writable(shared) == shared
    assert victim.read_text() == "someone's data\n"
    monkeypatch.setattr(runs.secrets, "token_hex", lambda n: "0" * 2 * n)
    (shared / f".write-test-{os.getpid()}-00000000").symlink_to(victim)
    with pytest.raises(EdgetrainError, match="cannot write run directory .*: File exists"):
        runs.ensure_writable(shared)
    assert victim.read_text() == "someone's data\n"


def test_a_directory_whose_name_is_no_run_id_is_not_found_by_a_prefix(root):
    """Issue 80, item 3: the name reached sbatch's --export list through a prefix match."""
    make_run(root, "20261205-000000-lenet-aa,PYTHONPATH=runs,LD_PRELOAD=libevil.so")
    with pytest.raises(EdgetrainError, match="no run '20261205-000000-lenet-aa'"):
        runs.find(root, "20261205-000000-lenet-aa")
