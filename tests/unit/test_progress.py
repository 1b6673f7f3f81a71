"""How the controller reads a line of mpirun's output (rank 0's events, Keras' progress bar and the
program's own text, as they arrive when Keras redraws its bar in place), and how it shows them."""

from __future__ import annotations

import io
import json
import time

from rich.console import Console

import pytest

from edgetrain.shared.progress import EVENT_CHARS, EVENT_PREFIX, ConsoleProgress, Events, checked, parse
from edgetrain.shared.untrusted import MAX_DEPTH

EPOCH = {"event": "epoch", "epoch": 2, "elapsed": 10.0, "images_per_sec": 3487.4}
# Keras' in-place redraw, as read with universal newlines: its carriage return ends the line.
UPDATE = " 58/60 [============================>.] - ETA: 0s - loss: 0.6200"


TOKEN = "0123456789abcdef"


def event_line(event: dict, token: str = TOKEN) -> str:
    out = io.StringIO()
    Events(out, enabled=True, token=token).emit(**event)
    return out.getvalue()


def parse_(line: str) -> list:
    return parse(line, TOKEN)


def test_an_event_after_a_keras_update_on_the_same_line_is_still_an_event():
    pieces = parse_(UPDATE + event_line(EPOCH))
    assert pieces == [{"event": "keras", "step": 58, "steps": 60, "text": "loss: 0.6200"}, EPOCH]


def test_an_event_after_the_programs_unfinished_line_keeps_that_text_as_output():
    assert parse_("saving model..." + event_line(EPOCH)) == ["saving model...", EPOCH]


def test_keras_backspaces_are_no_output_and_the_programs_lines_are_kept():
    assert parse_("\b" * 82 + "\n") == []
    assert parse_(UPDATE + "\b" * 40 + "\n") == [{"event": "keras", "step": 58, "steps": 60, "text": "loss: 0.6200"}]
    assert parse_("\n") == [""]
    assert parse_("60/60 [==============================] - 1s 20ms/step - loss: 0.6\n") == [
        "60/60 [==============================] - 1s 20ms/step - loss: 0.6"]
    assert parse_(event_line(EPOCH)) == [EPOCH]


def test_a_malformed_event_is_shown_as_the_programs_text():
    marker = f"{EVENT_PREFIX}:{TOKEN} "
    for body in ("{not json", "[]", "3", '"finished"', '{"event": "keras", "step": 1, "steps": 2, "text": ""}',
                 '{"event": "nonsense"}', '{"no": "kind"}'):
        assert parse_(marker + body + "\n") == [marker + body], body


@pytest.mark.parametrize("event", [
    {"event": "start", "job": "lenet", "ranks": "2", "epochs": 1, "initial_epoch": 0, "steps": 10},  # a count as text
    {"event": "start", "job": "lenet", "ranks": 2, "epochs": 1, "initial_epoch": 0},  # a field missing
    {"event": "step", "epoch": True, "step": 1, "steps": 10, "loss": 0.5},  # JSON's true is no count
    {"event": "step", "epoch": 1, "step": 1, "steps": 10, "loss": None},
    {"event": "epoch", "epoch": 1, "elapsed": 2.0, "loss": "low"},  # a field ConsoleProgress formats as a number
    {"event": "eval", "epoch": 1, "step": 3, "seconds": 1.0, "val_accuracy": 0.9, "eval_seconds": 0.1, "reached": 1},
    {"event": "failed", "rank": 0, "host": "n1"},
    {"event": "start", "job": "lenet", "ranks": 2, "epochs": 1, "initial_epoch": 0, "steps": 10, "batches": [96, "32"]},
])
def test_an_event_without_its_kinds_fields_is_text_and_never_reaches_a_reader(event):
    assert checked(json.dumps(event)) is None
    line = event_line(event)
    assert parse_(line) == [line.rstrip("\n")]


def test_only_this_attempts_token_makes_an_event():
    finished = {"event": "finished"}
    assert parse_(event_line(finished)) == [finished]
    # A log of an earlier attempt (another token), the prefix alone, or the token of no attempt.
    for line in (event_line(finished, token="fedcba9876543210"), f"{EVENT_PREFIX} " + json.dumps(finished) + "\n",
                 "replaying an old log: @edgetrain {\"event\": \"finished\"}\n"):
        assert parse_(line) == [line.rstrip("\n")]
    assert parse(event_line(finished), None) == [event_line(finished).rstrip("\n")]


def test_events_cannot_be_written_without_a_token():
    with pytest.raises(ValueError):
        Events(io.StringIO(), enabled=True, token="")


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


@pytest.mark.parametrize("body", [
    "[" * 5000 + "]" * 5000,  # deeper than Python's recursion: RecursionError before events were bounded
    '{"event": "finished", "x": ' + "[" * MAX_DEPTH + "]" * MAX_DEPTH + "}",  # within the object, one level too deep
    json.dumps({"event": "finished", "x": "y" * EVENT_CHARS}),
    json.dumps({"event": "start", "job": "j", "ranks": 1, "epochs": 1, "initial_epoch": 0, "steps": 1, "versions": {"x": [1]}}),
])
def test_an_event_too_deep_too_long_or_of_the_wrong_shape_is_the_programs_text(body):
    assert checked(body) is None
    line = f"{EVENT_PREFIX}:{TOKEN} {body}\n"
    assert parse_(line) == [line.rstrip("\n")]


def test_what_rank_0_reports_is_drawn_as_it_wrote_it_never_as_markup_or_control_sequences():
    out = io.StringIO()
    with ConsoleProgress(Console(file=out, force_terminal=True, width=200)) as bar:
        bar.event({"event": "start", "job": "[/job] [bold]mine", "ranks": 1, "epochs": 1, "initial_epoch": 0, "steps": 10})
        bar.event({"event": "keras", "step": 1, "steps": 10, "text": "loss: 0.5 - acc[/top5]: 0.9 \x1b]0;pwned\x07\x1b[2J"})
    shown = out.getvalue()
    assert "training [/job] [bold]mine on 1 ranks" in shown
    assert "loss: 0.5 - acc[/top5]: 0.9" in shown
    assert "pwned" not in shown and "\x1b[2J" not in shown and "\x1b]" not in shown


def test_the_start_line_names_each_ranks_batch_where_they_differ():
    out = io.StringIO()
    start = {"event": "start", "job": "lenet", "ranks": 2, "epochs": 1, "initial_epoch": 0, "steps": 10}
    with ConsoleProgress(Console(file=out, width=200)) as bar:
        bar.event(checked(json.dumps({**start, "batches": [96, 32]})))
        bar.event(start)
    assert out.getvalue().strip().splitlines() == ["training lenet on 2 ranks, batches 96/32 by speed, 10 steps per epoch",
                                           "training lenet on 2 ranks, 10 steps per epoch"]
