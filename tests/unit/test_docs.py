"""The docs' own checks: the generated options reference is current and complete, README stays short."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from edgetrain.controller.cli import app
from lab import reference

ROOT = Path(__file__).resolve().parents[2]


def test_the_options_reference_is_current():
    written = reference.OUT.read_text() if reference.OUT.exists() else ""
    assert written == reference.render(app), (
        f"{reference.OUT.relative_to(ROOT)} is stale: regenerate it with `{reference.COMMAND}` in the checkout's root")


def test_every_command_argument_and_option_has_a_help_text():
    assert reference.undocumented(app) == [], "give each a help text in edgetrain/controller/cli.py"


def test_a_missing_help_text_is_found():
    small = typer.Typer(help="A small app.")

    @small.command()
    def told(run: Annotated[str, typer.Argument(metavar="RUN")],
             out: Annotated[Optional[Path], typer.Option(help="Where to write.")] = None,
             quiet: bool = False) -> None:
        """A command with help."""

    @small.command()
    def untold() -> None:
        pass

    assert reference.undocumented(small) == ["edgetrain told RUN", "edgetrain told --quiet / --no-quiet", "edgetrain untold"]


def test_readme_is_at_most_250_lines():
    lines = len((ROOT / "README.md").read_text().splitlines())
    assert lines <= 250, f"README.md has {lines} lines: it is the front door, details go in docs/"
