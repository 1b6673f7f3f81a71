"""Write docs/reference.md: every command and option of ``edgetrain``, from the help texts in
edgetrain/controller/cli.py, so that each is documented once, in the code. Run in the checkout's
root: ``.venv/bin/python -m lab.reference``.

It walks the command tree typer builds and reads only what the code declared (names, metavars,
defaults, help, the parameters' Python types): nothing depends on typer's help layout, on rich or
on the terminal's width, and commands and options come in the order ``--help`` lists them.
"""

from __future__ import annotations

import inspect
import sys
import typing
from enum import Enum
from pathlib import Path

import typer

from edgetrain.controller.cli import app

OUT = Path(__file__).resolve().parent.parent / "docs" / "reference.md"
COMMAND = ".venv/bin/python -m lab.reference"
TYPES = {int: "INTEGER", float: "NUMBER", str: "TEXT", Path: "PATH"}


def commands(typer_app: typer.Typer) -> list[tuple[str, typing.Any]]:
    """Every command, its full name first (``edgetrain runs show``), groups before their commands."""
    found = []

    def walk(name: str, command) -> None:
        found.append((name, command))
        for sub, child in getattr(command, "commands", {}).items():  # typer keeps them in their order
            if not child.hidden:
                walk(f"{name} {sub}", child)

    walk("edgetrain", typer.main.get_command(typer_app))
    return found


def undocumented(typer_app: typer.Typer) -> list[str]:
    """The commands, arguments and options without a help text."""
    missing = []
    for name, command in commands(typer_app):
        if not (command.help or "").strip():
            missing.append(name)
        missing += [f"{name} {_shown(p)}" for p in _params(command) if not (p.help or "").strip()]
    return missing


def render(typer_app: typer.Typer) -> str:
    listed = commands(typer_app)
    out = ["<!-- Generated from edgetrain/controller/cli.py by `" + COMMAND + "`: edit the help texts there, then rerun it. -->",
           "", "# Command reference", "",
           "Every command of `edgetrain` and every option, as `edgetrain COMMAND --help` prints them (`-h` too for "
           + ", ".join(f"`{n.removeprefix('edgetrain ')}`" for n, c in listed if "-h" in c.context_settings.get("help_option_names", ()))
           + "). What the commands do around their options, and why: [cli.md](cli.md)."]
    for name, command in listed:
        params = _params(command)
        arguments = [p for p in params if p.param_type_name == "argument"]
        usage = " ".join([name, "[OPTIONS]", *(_usage(p) for p in arguments)]
                         + (["COMMAND [ARGS]..."] if hasattr(command, "commands") else []))
        out += ["", f"## {name}", "", _text(command.help or ""), "", f"Usage: `{usage}`"]
        subs = [n for n, _ in listed if n.rsplit(" ", 1)[0] == name and n != name]
        if subs:
            out += ["", "Commands: " + ", ".join(f"[{n.rsplit(' ', 1)[1]}](#{n.replace(' ', '-')})" for n in subs) + "."]
        types = _types(command)
        for title, group in (("Arguments", arguments), ("Options", [p for p in params if p not in arguments])):
            if group:
                out += ["", f"{title}:", ""] + [_item(p, types.get(p.name)) for p in group]
    return "\n".join(out) + "\n"


def _params(command) -> list:
    return [p for p in command.params if not p.hidden]


def _shown(param) -> str:
    if param.param_type_name == "argument":
        return param.metavar or param.name.upper()
    return ", ".join(param.opts) + "".join(f" / {o}" for o in param.secondary_opts)


def _usage(argument) -> str:
    shown = _shown(argument) + ("..." if argument.nargs == -1 and "..." not in _shown(argument) else "")
    return shown if argument.required or shown.startswith("[") else f"[{shown}]"


def _types(command) -> dict:
    """Each parameter's Python type, from the command's signature: the same under any typer version."""
    if command.callback is None:
        return {}
    return {name: p.annotation for name, p in inspect.signature(command.callback, eval_str=True).parameters.items()}


def _type_name(annotation) -> str | None:
    while typing.get_origin(annotation) in (typing.Annotated, typing.Union, list):
        annotation = next(a for a in typing.get_args(annotation) if a is not type(None))
    if isinstance(annotation, type) and issubclass(annotation, Enum):
        return "|".join(str(m.value) for m in annotation)
    return TYPES.get(annotation)


def _item(param, annotation) -> str:
    shown = _shown(param)
    if param.param_type_name == "option" and not param.is_flag:
        shown += " " + (param.metavar or _type_name(annotation) or "VALUE")
    notes = ["required"] if param.required else []
    default = getattr(param.default, "value", param.default)
    if not (param.required or default is None or default is False or default == ()):
        notes.append(f"default `{default}`")
    if param.multiple:
        notes.append("repeatable")
    if param.envvar:
        notes.append(f"env `{param.envvar}`")
    return f"- `{shown}`" + (f" ({', '.join(notes)})" if notes else "") + f": {_text(param.help or '')}"


def _text(help_text: str) -> str:
    """A help text as one markdown line: click's form feed ends it; ``*`` and ``<`` stay literal
    outside code spans (``*.pem``, ``runs/<id>/``)."""
    parts = " ".join(help_text.split("\f")[0].split()).split("`")
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("\\", "\\\\").replace("*", "\\*").replace("<", "\\<")
    return "`".join(parts)


def main() -> None:
    missing = undocumented(app)
    if missing:
        sys.exit("no help text: " + "; ".join(missing))
    OUT.write_text(render(app))
    print(OUT)


if __name__ == "__main__":
    main()
