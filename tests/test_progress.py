"""How the controller reads a line of mpirun's output: rank 0's events, Keras' progress bar and the
program's own text, as they arrive when Keras redraws its bar in place."""

from __future__ import annotations

import json

from edgetrain.progress import EVENT_PREFIX, parse

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
