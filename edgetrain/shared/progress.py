"""Progress events: rank 0 emits ``@edgetrain:TOKEN {json}`` lines, the controller renders them.

TOKEN is new for each attempt (the launcher makes it, the worker hands it to rank 0's program), so
a line a program prints - an old log replayed, a test fixture, another rank's echo - is never taken
for one of the run's own events; and every event is checked against its kind's fields before
anything reads it: what does not fit is the program's text."""

from __future__ import annotations

import json
import os
import re
import secrets
import sys
import time
from typing import TYPE_CHECKING, Any, TextIO

from edgetrain.shared import terminal, untrusted
from edgetrain.shared.untrusted import NUMBER, ListOf, MapOf, Obj

if TYPE_CHECKING:  # rich is imported where a console is drawn, not by every reader of events
    from rich.console import Console
    from rich.progress import TaskID

EVENT_PREFIX = "@edgetrain"
TOKEN_ENV = "EDGETRAIN_EVENTS_TOKEN"
# Keras' progress bar between its steps ("12/30 [===>....] - ETA: 4s - loss: ..."), redrawn with
# carriage returns; the line that ends an epoch has no ETA and is kept as output.
KERAS_UPDATE = re.compile(r"^\s*(\d+)/(\d+) \[[=>.]*\] - ETA: \S+( - (.*))?$")
# How often rank 0 reports its steps (edgetrain.callbacks), and so how often the console redraws at most.
REPORT_S = 0.5

MAYBE_NUMBER = (int, float, type(None))
# The longest event read: a rank's error message fits in it, and anything longer is the program's text.
EVENT_CHARS = 64 * 1024
# Each kind of event a rank may send: the fields it must have, then fields it may have - every
# field the controller reads (ConsoleProgress, the launcher, bench). Other fields (a script's own
# metrics) travel along unread.
SCHEMA: dict[str, Obj] = {
    "start": Obj({"job": (str,), "ranks": (int,), "epochs": (int,), "initial_epoch": (int,), "steps": (int,)},
                 {"versions": MapOf((str,)), "batches": ListOf((int,))}),
    "step": Obj({"epoch": (int,), "step": (int,), "steps": (int,), "loss": NUMBER}, {"images_per_sec": MAYBE_NUMBER}),
    "epoch": Obj({"epoch": (int,), "elapsed": NUMBER},
                 {k: NUMBER for k in ("loss", "accuracy", "val_loss", "val_accuracy", "images_per_sec")}),
    "eval": Obj({"epoch": (int,), "step": (int,), "seconds": NUMBER, "val_accuracy": NUMBER, "eval_seconds": NUMBER},
                {"reached": (bool,), "target_accuracy": NUMBER}),
    "finished": Obj(),
    "failed": Obj({"rank": (int,), "host": (str,), "error": (str,)}, {"fix": (str, type(None)), "kind": (str,)}),
    "lost": Obj({"host": (str,), "ranks": (list,), "why": (str,)}),  # edgetrain.rank.hostjobs': a job the run goes on without
    "rank": Obj({"rank": (int,), "host": (str,)}),  # every rank's worker, as it starts: the launcher counts them
    "allreduce": Obj({k: NUMBER for k in ("ranks", "bytes", "iters", "seconds", "cpu_seconds", "latency_seconds", "cycle_seconds",
                                          "idle_cpu_per_second")},
                     {"fp16": (bool,), "transport": (str,)}),
}


def new_token() -> str:
    return secrets.token_hex(8)


def _marker(token: str) -> str:
    return f"{EVENT_PREFIX}:{token} "


def checked(text: str) -> dict[str, Any] | None:
    """The event ``text`` holds, or None where it is not one of SCHEMA's kinds with its fields, or
    is longer or deeper than an event is (EVENT_CHARS, untrusted.MAX_DEPTH)."""
    if len(text) > EVENT_CHARS:
        return None
    try:
        event = untrusted.loads(text)
    except ValueError:
        return None
    if not isinstance(event, dict) or event.get("event") not in SCHEMA:
        return None
    return event if untrusted.problem(event, SCHEMA[event["event"]]) is None else None


class Events:
    """Writes events on a stream, marked with the attempt's token; on ranks other than 0 it stays silent."""

    def __init__(self, stream: TextIO, enabled: bool, token: str = "") -> None:
        if enabled and not token:
            raise ValueError("events need the attempt's token")
        self.stream, self.enabled, self.marker = stream, enabled, _marker(token)

    def emit(self, event: str, **fields: Any) -> None:
        if self.enabled:
            self.stream.write(self.marker + json.dumps({"event": event, **fields}) + "\n")
            self.stream.flush()


def parse(line: str, token: str | None) -> list[str | dict[str, Any]]:
    """What a line of mpirun's output holds, in order: the program's own text (a str) and events
    (dicts) - rank 0's ``@edgetrain`` events marked with this attempt's ``token``, and Keras'
    progress-bar updates (rank 0's, from a script that does not use edgetrain.callbacks) as
    ``keras`` events. An event that does not fit SCHEMA is text, and so is every event where
    ``token`` is None (a program outside edgetrain).

    Keras redraws its bar in place without ending the line (backspaces, then a carriage return,
    which ends a line here), so an event written just after an update shares its line: events are
    looked for anywhere on a line, and the backspaces are nobody's output."""
    line = line.rstrip("\n")
    if not line:
        return [""]
    text, prefix, rest = line.partition(_marker(token)) if token is not None else (line, "", "")
    event = checked(rest) if prefix else None
    if prefix and event is None:
        text = line
    pieces: list[str | dict[str, Any]] = []
    shown = text.replace("\b", "")
    m = KERAS_UPDATE.match(shown.rstrip())
    if m:
        pieces.append({"event": "keras", "step": int(m.group(1)), "steps": int(m.group(2)), "text": m.group(4) or ""})
    elif shown:
        pieces.append(shown)
    if event is not None:
        pieces.append(event)
    return pieces


class ConsoleProgress:
    """Renders rank 0's events: a live bar per epoch, one line per finished epoch and per
    evaluation within an epoch, and the moment the target accuracy is reached."""

    def __init__(self, console: Console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.bar = Progress(
            # What a rank reports is shown as text, never read as rich's markup.
            TextColumn("{task.description}", markup=False),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[detail]}", markup=False),
            TimeElapsedColumn(),
            console=console,
            transient=True,
            # Redrawn as rank 0 reports, at most every REPORT_S (see _show), not by rich's own thread:
            # its 10 redraws a second cost 4 ms of CPU a second, a few percent of a Pi-sized node.
            auto_refresh=False,
        )
        self.task: TaskID | None = None
        self.label = ""
        self.drawn = 0.0
        self.epochs = 0
        self.shown_epoch = 0

    def __enter__(self) -> ConsoleProgress:
        self.bar.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.bar.__exit__(*exc)

    def _drop(self) -> None:
        if self.task is not None:
            self.bar.remove_task(self.task)
            self.bar.refresh()
            self.task = None

    def _show(self, label: str, step: int, steps: int, detail: str) -> None:
        if label != self.label or self.task is None:
            self._drop()
            self.task = self.bar.add_task(label, total=steps, detail="")
            self.label = label
            self.drawn = 0.0
        # Keras' own bar, read from a user's script, may report twenty times a second.
        now = time.monotonic()
        redraw = now - self.drawn >= REPORT_S or step == steps
        self.bar.update(self.task, completed=step, total=steps, detail=detail, refresh=redraw)
        if redraw:
            self.drawn = now

    def event(self, e: dict[str, Any]) -> None:
        kind = e["event"]
        if kind == "start":
            self.epochs = e["epochs"]
            resumed = f", resuming after epoch {e['initial_epoch']}" if e["initial_epoch"] else ""
            batches = f", batches {'/'.join(map(str, e['batches']))} by speed" if e.get("batches") else ""
            self.console.print(terminal.shown(f"training {e['job']} on {e['ranks']} ranks{batches}, {e['steps']} steps per epoch{resumed}"),
                               highlight=False)
        elif kind == "step":
            ips = f"  {e['images_per_sec']:,.0f} img/s" if e.get("images_per_sec") else ""
            self._show(f"epoch {e['epoch']}/{self.epochs}", e["step"], e["steps"], f"loss {e['loss']:.4f}{ips}")
        elif kind == "keras":
            # A new bar starts when the step count goes back (the next epoch).
            if self.task is not None and e["step"] < self.bar.tasks[-1].completed:
                self._drop()  # the step count went back: the next epoch
            self._show("rank 0", e["step"], e["steps"], terminal.shown(e["text"]).plain[:80])
        elif kind == "epoch":
            self._drop()
            figures = [f"{k} {e[k]:.4f}" for k in ("loss", "accuracy", "val_loss", "val_accuracy") if k in e]
            ips = f"  {e['images_per_sec']:,.0f} img/s" if e.get("images_per_sec") else ""
            self.console.print(f"epoch {e['epoch']}/{self.epochs}: {'  '.join(figures)}{ips}  ({e['elapsed']:.0f} s)", markup=False, highlight=False)
            self.shown_epoch = e["epoch"]
        elif kind == "eval":
            at = f"epoch {e['epoch']} step {e['step']}, {e['seconds']:.1f} s from the first step"
            # The epoch's own validation is already on the epoch's line.
            if e["epoch"] != self.shown_epoch:
                self.console.print(f"  evaluation at {at}: val_accuracy {e['val_accuracy']:.4f}  ({e['eval_seconds']:.1f} s)", markup=False, highlight=False)
            if e.get("reached"):
                self.console.print(f"target val_accuracy {e['target_accuracy']:g} reached at {at}", markup=False, highlight=False)


def rank0_events(rank: int) -> Events:
    """Rank 0's progress events, on the stream the launcher reads (``EDGETRAIN_EVENTS_FD`` and the
    attempt's token, which the worker sets); silent on the other ranks and outside edgetrain."""
    fd, token = os.environ.get("EDGETRAIN_EVENTS_FD"), os.environ.get(TOKEN_ENV)
    if rank != 0 or fd is None or not token:
        return Events(sys.stdout, enabled=False)
    return Events(os.fdopen(int(fd), "w", buffering=1, closefd=False), enabled=True, token=token)
