"""What a program prints reaches the user's terminal as text: the filter keeps its text and colours
and drops every other control sequence, and rich never reads it as markup (through the real CLI:
tests/mpi/test_output_security.py)."""

from __future__ import annotations

import pytest

from edgetrain.shared.terminal import printable, shown


@pytest.mark.parametrize("text, kept", [
    ("a\x1b]0;pwned\x07b", "ab"),  # OSC to BEL
    ("a\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\b", "alinkb"),  # OSC 8 hyperlinks, to ST
    ("a\x1b]0;never ended", "a"),
    ("a\x1bP$q\x1b\\b", "ab"),  # DCS
    ("a\x1b[2Jb\x1b[?25l\x1b[10;1Hc", "abc"),  # screen clear, cursor
    ("a\x9b2Jb\x9d0;t\x9cc", "abc"),  # the 8-bit C1 forms
    ("a\x00b\x07c\x08d\x7fe\rf\x1b(Bg\x1b", "abcdefg"),
    ("\x1b[1;38;5;208mcolour\x1b[0m\tand tab", "\x1b[1;38;5;208mcolour\x1b[0m\tand tab"),
    ("acc[/top5] é 中", "acc[/top5] é 中"),
])
def test_printable_keeps_text_and_colours_and_drops_every_other_control(text, kept):
    assert printable(text) == kept


def test_shown_is_text_in_the_programs_colours_never_markup():
    text = shown("[bold]x[/bold] \x1b[31mred\x1b[0m [/top5]")
    assert text.plain == "[bold]x[/bold] red [/top5]"
    assert [(s.start, s.end, str(s.style)) for s in text.spans] == [(15, 18, "color(1)")]
