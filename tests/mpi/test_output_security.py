"""What a program prints, and what a run's files say, is data on the user's terminal: never rich's
markup, never a control sequence that rewrites the terminal (only its colours come through), and
never the controller's own record. Driven through the real CLI, one rank on this machine (the
filter itself: tests/unit/test_output_security.py)."""

from __future__ import annotations

import json
import platform

import pytest

from edgetrain import __version__
from edgetrain.shared import runs
from tests.conftest import edgetrain, project_script


# As Keras prints its bar, with a metric whose name rich would read as a closing tag (issue 63).
KERAS_PRINT = 'for i in range(3):\n    print(f" {i}/10 [=>.] - ETA: 1s - loss: 0.5 - acc[/top5]: 0.9", flush=True)\n'
# The console as a terminal's: rich draws its bar and colours (a pipe gets neither).
TERMINAL = {"TTY_COMPATIBLE": "1", "TERM": "xterm-256color", "COLUMNS": "200"}
# Raw control sequences a program may print: a window title (OSC), a screen clear, NUL, an 8-bit
# CSI, DEL; and a colour, which stays.
HOSTILE = "title\x1b]0;pwned\x07 clear\x1b[2J nul\x00 c1\x9b2J del\x7f \x1b[31mred\x1b[0m end"
RAW = ("\x1b]", "pwned", "\x1b[2J", "\x00", "\x9b", "\x7f")


def only_run(root) -> runs.Run:
    [run] = runs.all_runs(root)
    return run


def events_script(tmp_path, *lines: str):
    """A script that prints each of ``lines`` after the attempt's event marker, as rank 0's events are sent."""
    return project_script(tmp_path, "import os\nmarker = '@edgetrain:' + os.environ['EDGETRAIN_EVENTS_TOKEN'] + ' '\n"
                          + "".join(f"print(marker + {line!r}, flush=True)\n" for line in lines))


def start_event(**fields) -> str:
    return json.dumps({"event": "start", "job": "mine", "ranks": 1, "epochs": 1, "initial_epoch": 0, "steps": 3, **fields})


@pytest.mark.mpi
def test_a_keras_style_print_with_brackets_trains_to_the_end_and_is_shown_as_printed(tmp_path):
    script = project_script(tmp_path, KERAS_PRINT)
    r = edgetrain("run", str(script), "--np", "1", "--runs-dir", str(tmp_path / "runs"), env=TERMINAL, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "MarkupError" not in r.stdout + r.stderr
    assert "loss: 0.5 - acc[/top5]: 0.9" in r.stdout  # the bar's detail, drawn as the program wrote it
    assert only_run(tmp_path / "runs").record().status == "completed"


@pytest.mark.mpi
def test_what_a_program_reports_and_its_run_records_is_never_markup(tmp_path):
    script = events_script(tmp_path, start_event(job="[/job] [bold]mine", versions={"mylib": "[/v]1.2"}))
    root = tmp_path / "runs"
    r = edgetrain("run", str(script), "--np", "1", "--runs-dir", str(root), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "training [/job] [bold]mine on 1 ranks, 3 steps per epoch" in r.stdout
    run = only_run(root)
    # A script's own metric, named as Keras names it, is a column of runs show.
    run.metrics_file.write_text(json.dumps({"epoch": 1, "loss": 0.5, "acc[/top5]": 0.9}) + "\n")
    show = edgetrain("runs", "show", run.id, "--runs-dir", str(root), env={"COLUMNS": "200"})
    assert show.returncode == 0, show.stdout + show.stderr
    assert "mylib [/v]1.2" in show.stdout and "acc[/top5]" in show.stdout
    listed = edgetrain("runs", "list", "--runs-dir", str(root), env={"COLUMNS": "200"})
    assert listed.returncode == 0 and run.id in listed.stdout, listed.stdout + listed.stderr


@pytest.mark.mpi
def test_a_programs_start_event_adds_versions_and_never_overwrites_the_controllers(tmp_path):
    script = events_script(tmp_path, start_event(versions={"edgetrain": "9.9.9", "python": "0.0", "mylib": "1.2"}))
    root = tmp_path / "runs"
    r = edgetrain("run", str(script), "--np", "1", "--runs-dir", str(root), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    versions = only_run(root).record().versions
    assert versions["edgetrain"] == __version__ and versions["python"] == platform.python_version()
    assert versions["mylib"] == "1.2"


@pytest.mark.mpi
def test_an_event_too_deep_or_too_long_is_the_programs_text_not_a_crash(tmp_path):
    deep = "[" * 5000 + "]" * 5000
    script = events_script(tmp_path, deep, '{"event": "finished", "x": ' + deep + "}",
                           json.dumps({"event": "finished", "x": "y" * (1024 * 1024)}))
    root = tmp_path / "runs"
    r = edgetrain("run", str(script), "--np", "1", "--runs-dir", str(root), timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "RecursionError" not in r.stdout + r.stderr and "Traceback" not in r.stdout + r.stderr
    assert r.stdout.count(deep) == 2, r.stdout[-2000:]  # shown as the program's text
    assert only_run(root).record().status == "completed"


@pytest.mark.mpi
def test_control_sequences_never_reach_the_terminal_and_colours_and_redrawn_bars_do(tmp_path):
    bar = "".join(f"\\r{p:3d}%|{'#' * (p // 10):10s}|" for p in (10, 50, 100))
    script = project_script(tmp_path, f"import sys\nhostile = {HOSTILE!r}\nprint(hostile, flush=True)\n"
                                      f"sys.stdout.write('{bar}\\n')\nsys.stdout.flush()\nraise ValueError(hostile)\n")
    r = edgetrain("run", str(script), "--np", "1", "--runs-dir", str(tmp_path / "runs"), env=TERMINAL, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    for raw in RAW:
        assert raw not in r.stdout and raw not in r.stderr, raw
    assert "\x1b[31mred\x1b[0m end" in r.stdout  # the program's colour, drawn by the console
    assert " 50%|#####     |" in r.stdout and "100%|##########|" in r.stdout  # each redraw of the bar
    cleaned = "title clear nul c1 del \x1b[31mred\x1b[0m end"
    assert f"  | ValueError: {cleaned}" in r.stderr  # the failure's tail, from rank 0's log
    [error] = [line for line in r.stderr.splitlines() if line.startswith("edgetrain: error: ")]
    assert f"failed: ValueError: {cleaned} - logs in" in error
