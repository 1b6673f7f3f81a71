"""The ``edgetrain`` command line. Commands stay thin: the work happens in the modules they call."""

from __future__ import annotations

import sys

import typer
from rich.console import Console

from .errors import EdgetrainError

app = typer.Typer(no_args_is_help=True, add_completion=False, help="Data-parallel training on edge clusters.")
console = Console()
err_console = Console(stderr=True)


def main() -> None:
    try:
        app(standalone_mode=False)
    except EdgetrainError as exc:
        err_console.print(f"edgetrain: error: {exc}", markup=False, highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        err_console.print("edgetrain: interrupted", markup=False)
        sys.exit(130)
    except (typer.Exit, SystemExit) as exc:
        code = getattr(exc, "exit_code", getattr(exc, "code", 0))
        sys.exit(code)
    except Exception as exc:  # click usage errors carry their own formatting
        import click

        if isinstance(exc, click.exceptions.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        if isinstance(exc, click.exceptions.Abort):
            sys.exit(130)
        raise
