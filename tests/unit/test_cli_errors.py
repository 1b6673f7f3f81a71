"""Every bad input ends in one clear line on stderr, a non-zero exit, and nothing lost on disk."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from edgetrain.controller import program as programs
from edgetrain.shared import checkpoints, datasets
from edgetrain.shared.job_options import JobOptions
from tests.conftest import assert_one_line_error, edgetrain, project_script, snapshot


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
    assert_one_line_error(edgetrain("run", "lenet", "-o", "depth=3", "--runs-dir", str(existing_runs)), "job lenet has no option depth", code=2)
    assert_one_line_error(edgetrain("run", "fashion", "-o", "width=wide", "--runs-dir", str(existing_runs)), "width takes a whole number", code=2)
    assert_one_line_error(edgetrain("run", "fashion", "-o", "width=0", "--runs-dir", str(existing_runs)), "-o width=0 must be at least 1", code=2)
    assert_one_line_error(edgetrain("run", "fashion", "-o", "width", "--runs-dir", str(existing_runs)), "is not NAME=VALUE", code=2)


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


def test_shell_completion_is_installable():
    r = edgetrain("--help", env={"COLUMNS": "200"})
    assert r.returncode == 0 and "--install-completion" in r.stdout and "--show-completion" in r.stdout


def test_missing_argument_is_a_usage_error():
    r = edgetrain("run")
    assert r.returncode == 2 and "Missing argument" in r.stderr and "Traceback" not in r.stderr


@pytest.fixture
def two_epochs(tmp_path):
    """A lenet run on 2 ranks with checkpoints for epochs 1 and 2, as the job writes them."""
    root = tmp_path / "runs"
    run = root / "20260102-000000-lenet-beef"
    (run / "checkpoints").mkdir(parents=True)
    (run / "run.json").write_text('{"id": "20260102-000000-lenet-beef", "job": "lenet", "status": "failed", '
                                  '"attempts": [{"command": ["edgetrain", "run", "lenet", "--np", "2"], "np": 2, '
                                  '"started": "2026-01-02T00:00:00Z", "mpirun": ["mpirun", "-n", "2"]}]}\n')
    for epoch in (1, 2):
        checkpoints.write(run / "checkpoints", epoch, "lenet", {"ranks": 2, "val_accuracy": 0.9},
                          lambda d: (d / "state.index").write_bytes(b"w"), extra={"options": {"batch_size": 64}})
    return root, run


def test_resume_takes_another_number_of_ranks_but_refuses_other_options(two_epochs):
    root, _ = two_epochs
    before = snapshot(root)
    # --epochs 2 stops the resume at the check after the one on ranks, before anything trains.
    r = edgetrain("run", "lenet", "--resume", "20260102", "--np", "1", "--epochs", "2", "--runs-dir", str(root))
    said = " ".join(r.stdout.split())
    assert "resuming on 1 ranks from epoch 2, trained on 2: the learning rate, its warmup and the data shards follow 1 ranks" in said
    assert_one_line_error(r, "already finished epoch 2", code=2)
    r = edgetrain("run", "lenet", "--resume", "20260102", "--np", "2", "--epochs", "3", "--batch-size", "32", "--runs-dir", str(root))
    assert_one_line_error(r, "was trained with --batch-size 64 (asked 32)", code=2)
    assert snapshot(root) == before


def test_a_damaged_newest_checkpoint_falls_back_to_the_one_before(two_epochs):
    root, run = two_epochs
    (run / "checkpoints" / "epoch-0002" / "state.index").write_bytes(b"bit rot")
    # --epochs 1 makes the resume stop at the check after the fallback, before anything trains.
    r = edgetrain("run", "lenet", "--resume", "20260102", "--np", "2", "--epochs", "1", "--runs-dir", str(root))
    assert "passed over damaged checkpoint(s) epoch-0002 (state.index does not match its manifest); resuming from epoch-0001" in r.stdout.replace("\n", " ")
    assert_one_line_error(r, "already finished epoch 1", code=2)
    (run / "checkpoints" / "epoch-0002" / "manifest.json").write_text("{not json")
    (run / "checkpoints" / "epoch-0001" / "state.index").write_bytes(b"rot too")
    r = edgetrain("run", "lenet", "--resume", "20260102", "--np", "2", "--epochs", "3", "--runs-dir", str(root))
    assert_one_line_error(r, "has no intact checkpoint", "epoch-0002 (its manifest is damaged: ", "epoch-0001 (state.index does not match")


@pytest.mark.parametrize("args, fragment", [
    (("runs", "show", "**"), "'**' is not a run id"),
    (("collect", "/etc/", "--dest", "DEST"), "'/etc/' is not a run id"),
    (("run", "lenet", "--resume", "../x"), "'../x' is not a run id"),
])
def test_a_run_id_is_never_a_path_or_a_pattern(existing_runs, tmp_path, args, fragment):
    before = snapshot(existing_runs)
    args = tuple(str(tmp_path / "dest") if a == "DEST" else a for a in args)
    assert_one_line_error(edgetrain(*args, "--runs-dir", str(existing_runs)), fragment, "edgetrain runs list", code=2)
    assert snapshot(existing_runs) == before and not (tmp_path / "dest").exists()


def test_runs_list_names_damage_and_still_lists_every_run(existing_runs, two_epochs):
    root, run = two_epochs  # the same runs directory as existing_runs
    (run / "metrics.jsonl").write_text('{"epoch": 1, "loss": 0.5}\n{"epoch": 2, "lo')
    (run / "checkpoints" / "epoch-0002" / "manifest.json").write_text("{")
    r = edgetrain("runs", "list", "--runs-dir", str(root), env={"COLUMNS": "200"})
    assert r.returncode == 0, r.stderr
    assert "20260101-000000-lenet-abcd" in r.stdout and "20260102-000000-lenet-beef" in r.stdout
    assert "epoch 1" in r.stdout.split("20260102-000000-lenet-beef")[1]  # the newest readable checkpoint
    warnings = r.stderr.strip().splitlines()
    assert warnings[0] == "edgetrain: warning: run 20260102-000000-lenet-beef: metrics.jsonl line 2 is damaged (not JSON; left out)"
    assert warnings[1].startswith(f"edgetrain: warning: run 20260102-000000-lenet-beef: checkpoint {run / 'checkpoints' / 'epoch-0002'} "
                                  "has no readable manifest (") and len(warnings) == 2


def test_a_batch_larger_than_a_ranks_shard_is_refused_before_anything_starts(existing_runs):
    before = snapshot(existing_runs)
    r = edgetrain("run", "lenet", "--np", "2", "--batch-size", "40000", "--runs-dir", str(existing_runs))
    assert_one_line_error(r, "--batch-size 40000 is larger than each rank's shard of mnist (30000 examples on 2 ranks)",
                          "--batch-size 30000 or less", code=2)
    assert snapshot(existing_runs) == before


def test_the_shard_a_batch_must_fit_is_what_the_holdout_leaves(existing_runs):
    before = snapshot(existing_runs)
    r = edgetrain("run", "lenet", "--np", "2", "--batch-size", "28000", "--holdout", "6000", "--runs-dir", str(existing_runs))
    assert_one_line_error(r, "--batch-size 28000 is larger than each rank's shard of mnist less --holdout 6000 (27000 examples on 2 ranks)",
                          "--batch-size 27000 or less", code=2)
    assert snapshot(existing_runs) == before


@pytest.fixture
def small_disk(tmp_path):
    """A 256 KiB file system of the test's own (tmpfs), unmounted afterwards."""
    if os.geteuid() != 0:
        pytest.skip("mounting a tmpfs needs root")
    where = tmp_path / "small"
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=256k", "tmpfs", str(where)], check=True)
    yield where
    subprocess.run(["umount", str(where)], check=True)


def test_collect_onto_a_full_disk_is_one_line_and_leaves_no_partial_file(existing_runs, small_disk):
    ckpt = existing_runs / "20260101-000000-lenet-abcd" / "checkpoints"
    checkpoints.write(ckpt, 2, "lenet", {"val_accuracy": 0.99}, lambda d: (d / "state.data").write_bytes(os.urandom(1024 * 1024)))
    r = edgetrain("collect", "20260101", "--dest", str(small_disk), "--runs-dir", str(existing_runs))
    assert_one_line_error(r, "No space left on device", "collect again to finish")
    leftovers = [p.name for p in small_disk.rglob("*") if p.name.startswith(".")]
    assert leftovers == []


@pytest.mark.parametrize("args, fragment", [
    (("--hang-timeout", "nan"), "--hang-timeout nan must be a positive number of seconds"),
    (("--hang-timeout", "inf"), "--hang-timeout inf must be a positive number of seconds"),
    (("--warmup-epochs", "nan"), "--warmup-epochs nan must be a number of epochs"),
    (("--lr-scaling", "2"), "--lr-scaling 2.0 must be a power between 0 and 1"),
    (("--lr-scaling", "nan"), "--lr-scaling nan must be a power between 0 and 1"),
    (("--seed", "-1"), "--seed -1 must be 0 or more"),
])
def test_numbers_that_are_not_numbers(existing_runs, args, fragment):
    before = snapshot(existing_runs)
    assert_one_line_error(edgetrain("run", "lenet", *args, "--runs-dir", str(existing_runs)), fragment, code=2)
    assert snapshot(existing_runs) == before


def test_a_non_blocking_terminal_left_by_a_killed_ssh_does_not_matter(existing_runs):
    read, write = os.pipe()
    os.set_blocking(read, False)  # as a killed ssh leaves a shared terminal
    try:
        r = subprocess.run([sys.executable, "-m", "edgetrain", "run", "lenet", "--np", "0", "--runs-dir", str(existing_runs)],
                           stdin=read, capture_output=True, text=True, timeout=120)
    finally:
        os.close(read)
        os.close(write)
    # The inventory was read (Ansible needs blocking IO); the error is the one about --np.
    assert_one_line_error(r, "--np 0", code=2)


@pytest.mark.parametrize("args, fragment", [
    (("--eval-every", "0"), "--eval-every 0 must be at least 1"),
    (("--eval-every", "-5"), "--eval-every -5 must be at least 1"),
    (("--eval-examples", "0"), "--eval-examples 0 must be at least 1"),
    (("--holdout", "60000"), "--holdout 60000 must be between 1 and 59,999 examples"),
    (("--sync-every", "0"), "--sync-every 0 must be at least 1"),
    (("--sync-every", "-2"), "--sync-every -2 must be at least 1"),
    (("--sync-mode", "weights", "--outer-momentum", "1"), "--outer-momentum 1.0 must be in [0, 1)"),
    (("--outer-lr", "0.7"), "--outer-lr and --outer-momentum are for --sync-mode weights"),
    (("--sync-mode", "weights", "--fp16-allreduce"), "--fp16-allreduce compresses gradients; --sync-mode weights averages"),
    (("--steps-per-execution", "0"), "--steps-per-execution 0 must be at least 1"),
    (("--tf-threads", "0"), "--tf-threads 0 must be at least 1"),
])
def test_evaluation_and_tuning_counts_below_one(existing_runs, args, fragment):
    before = snapshot(existing_runs)
    assert_one_line_error(edgetrain("run", "lenet", *args, "--runs-dir", str(existing_runs)), fragment, code=2)
    assert snapshot(existing_runs) == before


@pytest.mark.parametrize("flag", ["--eval-every", "--eval-examples", "--sync-every"])
def test_evaluation_and_tuning_counts_that_are_not_numbers(existing_runs, flag):
    before = snapshot(existing_runs)
    r = edgetrain("run", "lenet", flag, "nan", "--runs-dir", str(existing_runs))
    # The command line's own type check, as for every whole-number option.
    assert r.returncode == 2 and f"Invalid value for '{flag}'" in r.stderr and "Traceback" not in r.stderr
    assert snapshot(existing_runs) == before


def test_resume_refuses_other_tuning_options(two_epochs):
    root, _ = two_epochs
    before = snapshot(root)
    r = edgetrain("run", "lenet", "--resume", "20260102", "--np", "2", "--epochs", "3", "--sync-every", "2",
                  "--runs-dir", str(root))
    assert_one_line_error(r, "was trained with --sync-every None (asked 2)", code=2)
    r = edgetrain("run", "lenet", "--resume", "20260102", "--np", "2", "--epochs", "3", "--fp16-allreduce", "--runs-dir", str(root))
    assert_one_line_error(r, "--fp16-allreduce None (asked True)", code=2)
    assert snapshot(root) == before


EVAL = {"kind": "eval", "epoch": 1, "eval_seconds": 1.5, "examples": 10000, "ranks": 2, "target_accuracy": 0.985}


def test_runs_show_says_when_the_target_was_reached_and_old_runs_still_read(existing_runs):
    run = existing_runs / "20260101-000000-lenet-abcd"
    old = edgetrain("runs", "show", "20260101", "--runs-dir", str(existing_runs), env={"COLUMNS": "300"})
    assert old.returncode == 0 and "val accuracy" not in old.stdout, old.stderr
    lines = [
        {"epoch": 1, "loss": 0.1, "val_accuracy": 0.97},
        {**EVAL, "step": 176, "seconds": 61.31, "images": 22528, "val_accuracy": 0.975, "reached": False},
        {**EVAL, "step": 352, "seconds": 123.44, "images": 45056, "val_accuracy": 0.9851, "reached": True},
        {"kind": "a-later-kind", "what": "ignored"},
    ]
    (run / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines) + '{"kind": "eval", "ep')
    shown = edgetrain("runs", "show", "20260101", "--runs-dir", str(existing_runs), env={"COLUMNS": "300"})
    assert shown.returncode == 0, shown.stderr
    assert ("reached 98.5% val accuracy at 123.4 s from the first step, 45,056 images, epoch 1 step 352 "
            "(2 evaluations took 3.0 s of it)") in shown.stdout
    listed = edgetrain("runs", "list", "--runs-dir", str(existing_runs), env={"COLUMNS": "300"})
    assert listed.returncode == 0 and "0.9700" in listed.stdout
    assert listed.stderr.strip() == "edgetrain: warning: run 20260101-000000-lenet-abcd: metrics.jsonl line 5 is damaged (not JSON; left out)"
    (run / "metrics.jsonl").write_text(json.dumps({**EVAL, "step": 176, "seconds": 61.31, "images": 22528, "val_accuracy": 0.975,
                                                   "reached": False}) + "\n")
    shown = edgetrain("runs", "show", "20260101", "--runs-dir", str(existing_runs), env={"COLUMNS": "300"})
    assert ("98.5% val accuracy not reached in 1 evaluation; best 97.50% at 61.3 s from the first step, 22,528 images, "
            "epoch 1 step 176") in shown.stdout


def test_runs_as_json_carry_every_status_and_what_is_damaged(existing_runs):
    """`runs list --json` and `runs show --json`: what scripts and the cluster tests read, never the console's table."""
    abandoned = existing_runs / "20260103-000000-lenet-0001"  # its edgetrain died while it ran: nobody holds it
    abandoned.mkdir()
    (abandoned / "run.json").write_text('{"id": "20260103-000000-lenet-0001", "job": "lenet", "status": "running"}\n')
    damaged = existing_runs / "20260104-000000-lenet-0002"
    damaged.mkdir()
    (damaged / "run.json").write_text('{"id": "20260104-')
    listed = edgetrain("runs", "list", "--json", "--runs-dir", str(existing_runs))
    assert listed.returncode == 0, listed.stderr
    out = json.loads(listed.stdout)
    assert out["schema"] == 1
    by_id = {r["id"]: r for r in out["runs"]}
    assert {i: r["status"] for i, r in by_id.items()} == {"20260101-000000-lenet-abcd": "completed",
                                                         "20260103-000000-lenet-0001": "abandoned",
                                                         "20260104-000000-lenet-0002": "damaged"}
    assert by_id["20260101-000000-lenet-abcd"]["checkpoint"] == 1 and by_id["20260101-000000-lenet-abcd"]["epochs"] == 1
    assert "no readable run.json" in by_id["20260104-000000-lenet-0002"]["problems"][0]
    shown = edgetrain("runs", "show", "20260101", "--json", "--runs-dir", str(existing_runs))
    assert shown.returncode == 0, shown.stderr
    run = json.loads(shown.stdout)
    assert (run["schema"], run["id"], run["status"]) == (1, "20260101-000000-lenet-abcd", "completed")
    assert run["record"]["job"] == "lenet" and run["metrics"] == [{"epoch": 1, "loss": 0.1}]


@pytest.mark.parametrize("args, fragment", [
    (("--max-restarts", "-1"), "--max-restarts -1 is not a number of restarts"),
    (("--max-restarts", "1", "--min-nodes", "0"), "--min-nodes 0 is not a number of nodes"),
    (("--max-restarts", "1", "--min-nodes", "2"), "--min-nodes 2 is more than the 1 nodes --np 2 is placed on"),
    (("--rejoin",), "--rejoin takes back a node a restart left out, and no restart was asked for"),
    (("--ps", "1"), "--ps is for --strategy tf-ps"),
])
def test_bad_restart_options_are_one_line_before_anything_starts(tmp_path, args, fragment):
    root = tmp_path / "runs"
    r = edgetrain("run", "lenet", "--np", "2", *args, "--runs-dir", str(root))
    assert_one_line_error(r, fragment, code=2)
    assert not root.exists() or not any(root.iterdir())


def test_a_script_without_edgetrains_checkpoints_cannot_ask_for_restarts(tmp_path):
    plain = tmp_path / "plain" / "train.py"
    plain.parent.mkdir()
    plain.write_text("import horovod.tensorflow.keras as hvd\nhvd.init()\n")
    r = edgetrain("run", str(plain), "--np", "2", "--max-restarts", "1", "--runs-dir", str(tmp_path / "runs"))
    assert_one_line_error(r, "--max-restarts: train.py keeps no edgetrain checkpoints, so a restart could not resume it", code=2)
    helped = tmp_path / "helped" / "train.py"
    helped.parent.mkdir()
    helped.write_text("import sys\n")
    (helped.parent / "model.py").write_text("from edgetrain import callbacks\n")  # the helpers, from a module of its folder
    assert programs.resolve(str(helped), [], JobOptions()).keeps_checkpoints
    assert not programs.resolve(str(plain), [], JobOptions()).keeps_checkpoints


@pytest.mark.parametrize("np, ps", [("4", "0"), ("4", "3"), ("2", "1")])
def test_parameter_servers_that_leave_no_worker_are_one_line(tmp_path, np, ps):
    script = project_script(tmp_path, "import tensorflow as tf\n")
    r = edgetrain("run", str(script), "--strategy", "tf-ps", "--np", np, "--ps", ps, "--runs-dir", str(tmp_path / "runs"))
    assert_one_line_error(r, f"--ps {ps} with --np {np} leaves no worker", code=2)


def test_runs_show_names_the_nodes_an_attempt_went_on_without(existing_runs):
    run = existing_runs / "20260101-000000-lenet-abcd"
    attempt = {"started": "2026-01-01T00:00:00Z", "command": ["edgetrain", "run"], "np": 4, "mpirun": ["mpirun"],
               "went_on_without": {"node3": "container gone (No such container)"}}
    (run / "run.json").write_text(json.dumps({"id": run.name, "job": "lenet", "status": "completed", "attempts": [attempt]}))
    shown = edgetrain("runs", "show", "20260101", "--runs-dir", str(existing_runs), env={"COLUMNS": "300"})
    assert shown.returncode == 0, shown.stderr
    assert "attempt 1 (2026-01-01T00:00:00Z): 4 ranks; went on without node3 (container gone (No such container))" in shown.stdout
