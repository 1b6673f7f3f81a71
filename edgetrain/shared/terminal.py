"""Text that came from a program, a node or a run's files, made safe to show on the user's terminal.

A program's output is data: its colours (SGR, ``ESC[...m``) are kept as rich styles, and every
other control sequence or character - a window title (OSC), a screen clear (``ESC[2J``), cursor
moves, NUL, the 8-bit C1 controls - is dropped, so that nothing a rank prints can rewrite the
terminal, and rich never reads it as markup. Carriage returns end a line before this (the
launcher reads mpirun's output with universal newlines), so a bar redrawn with them is shown as
its redraws, and Keras' bar as edgetrain's own (progress.parse)."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from rich.text import Text

# ECMA-48's control sequences, longest first: a string (OSC, DCS, SOS, PM, APC) up to its
# terminator (BEL or ST) or the end of the text, a CSI sequence (7-bit or C1), any other escape
# sequence, and a lone control character (tab and newline are text).
CONTROL = re.compile(
    r"(?:\x1b[\]PX^_]|[\x90\x98\x9d\x9e\x9f]).*?(?:\x07|\x1b\\|\x9c|\Z)"
    r"|(?:\x1b\[|\x9b)[0-?]*[ -/]*[@-~]?"
    r"|\x1b[ -/]*[0-~]?"
    r"|[\x00-\x08\x0b-\x1f\x7f-\x9f]",
    re.DOTALL,
)
COLOUR = re.compile(r"\x1b\[[0-9;:]*m")


def printable(text: str) -> str:
    """``text`` with its colour sequences and without any other control sequence or character."""
    return CONTROL.sub(lambda m: m.group() if COLOUR.fullmatch(m.group()) else "", text)


def shown(text: str) -> Text:
    """``text`` as rich prints it: plain text in the program's colours, never markup."""
    # Imported here: ranks import this module (through progress) without rich.
    from rich.text import Text

    return Text.from_ansi(printable(text))
