"""The docs' own checks: the generated options reference is current and complete, README and the docs a
newcomer reads stay short."""

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


# The docs a newcomer reads: README and docs/*.md, less the round-by-round history and the generated reference.
WORDS_COMMAND = "wc -w README.md $(ls docs/*.md | grep -v -e scaling-history.md -e reference.md)"
BEYOND_THE_LIMIT = ("scaling-history.md", "reference.md")


def newcomers_docs(root: Path) -> list[Path]:
    return [root / "README.md"] + sorted(p for p in (root / "docs").glob("*.md") if p.name not in BEYOND_THE_LIMIT)


def words(path: Path) -> int:
    return len(path.read_bytes().split())  # as wc -w counts them: runs of bytes between ASCII whitespace


def test_the_docs_a_newcomer_reads_are_at_most_22000_words():
    total = sum(words(p) for p in newcomers_docs(ROOT))
    assert total <= 22_000, (
        f"README.md and docs/ hold {total:,} words (`{WORDS_COMMAND}`), over 22,000: cut repetition, say an "
        "option once in its help text (docs/reference.md), move measurements to docs/scaling-history.md")


def test_the_word_count_is_wc_s_and_leaves_out_the_history_and_the_reference(tmp_path):
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("one two\tthree\n")
    (tmp_path / "docs" / "cli.md").write_text("four\n\nfive-six `seven`\n")
    for name in BEYOND_THE_LIMIT:
        (tmp_path / "docs" / name).write_text("not counted " * 50)
    assert [p.name for p in newcomers_docs(tmp_path)] == ["README.md", "cli.md"]
    assert sum(words(p) for p in newcomers_docs(tmp_path)) == 6
