"""How the controller reads a line of mpirun's output (rank 0's events, Keras' progress bar and the
program's own text, as they arrive when Keras redraws its bar in place), and how it shows them."""

from __future__ import annotations

import io
import json
import time

from rich.console import Console

from edgetrain.shared.progress import EVENT_PREFIX, ConsoleProgress, parse

EPOCH = {"event": "epoch", "epoch": 2, "images_per_sec": 3487.4}
# Keras' in-place redraw, as read with universal newlines: its carriage return ends the line.
UPDATE = " 58/60 [============================>.] - ETA: 0s - loss: 0.6200"


def event_line(event: dict) -> str:
    return EVENT_PREFIX + json.dumps(event) + "\n"


def test_an_event_after_a_keras_update_on_the_same_line_is_still_an_event():
    pieces = parse(UPDATE + event_line(EPOCH))
    assert pieces == [{"event": "keras", "step": 58, "steps": 60, "text": "loss: 0.6200"}, EPOCH]


def test_an_event_after_the_programs_unfinished_line_keeps_that_text_as_output():
    assert parse("saving model..." + event_line(EPOCH)) == ["saving model...", EPOCH]


def test_keras_backspaces_are_no_output_and_the_programs_lines_are_kept():
    assert parse("\b" * 82 + "\n") == []
    assert parse(UPDATE + "\b" * 40 + "\n") == [{"event": "keras", "step": 58, "steps": 60, "text": "loss: 0.6200"}]
    assert parse("\n") == [""]
    assert parse("60/60 [==============================] - 1s 20ms/step - loss: 0.6\n") == [
        "60/60 [==============================] - 1s 20ms/step - loss: 0.6"]
    assert parse(event_line(EPOCH)) == [EPOCH]


def test_a_malformed_event_is_shown_as_the_programs_text():
    assert parse(EVENT_PREFIX + "{not json\n") == [EVENT_PREFIX + "{not json"]


def test_the_bar_is_drawn_when_rank_0_reports_and_not_in_between():
    out = io.StringIO()
    console = Console(file=out, force_terminal=True, width=100)
    with ConsoleProgress(console) as bar:
        bar.event({"event": "start", "job": "lenet", "ranks": 2, "epochs": 1, "initial_epoch": 0, "steps": 100})
        bar.event({"event": "step", "epoch": 1, "step": 40, "steps": 100, "loss": 0.5, "images_per_sec": 1234.0})
        drawn = out.getvalue()
        assert " 40/100" in drawn and "1,234 img/s" in drawn
        time.sleep(0.5)  # a redraw thread (rich's default, 10 a second) would have written meanwhile
        assert out.getvalue() == drawn
        bar.event({**EPOCH, "epoch": 1, "loss": 0.25, "elapsed": 3.0})
    shown = out.getvalue()[len(drawn):]
    assert "epoch 1/1: loss 0.2500" in shown and " 40/100" not in shown  # the finished epoch's bar is gone


def test_reports_faster_than_a_redraw_are_drawn_at_the_next_redraw_or_the_epochs_last_step():
    out = io.StringIO()
    with ConsoleProgress(Console(file=out, force_terminal=True, width=100)) as bar:
        for step in (10, 11, 12, 60):
            bar.event({"event": "keras", "step": step, "steps": 60, "text": f"loss: 0.{step}"})
    shown = out.getvalue()
    assert "10/60" in shown and "60/60" in shown  # the first, and the epoch's end
    assert "11/60" not in shown and "12/60" not in shown
