"""Progress events: rank 0 emits ``@edgetrain {json}`` lines, the controller renders them."""

from __future__ import annotations

import json
from typing import TextIO

EVENT_PREFIX = "@edgetrain "


class Events:
    """Writes events on a stream; on ranks other than 0 it stays silent."""

    def __init__(self, stream: TextIO, enabled: bool) -> None:
        self.stream, self.enabled = stream, enabled

    def emit(self, event: str, **fields) -> None:
        if self.enabled:
            self.stream.write(EVENT_PREFIX + json.dumps({"event": event, **fields}) + "\n")
            self.stream.flush()


def parse(line: str) -> dict | None:
    """The event on a line of mpirun's output, or None for any other line."""
    if not line.startswith(EVENT_PREFIX):
        return None
    try:
        return json.loads(line[len(EVENT_PREFIX):])
    except ValueError:
        return None


class ConsoleProgress:
    """Renders rank 0's events: a live bar per epoch and one line per finished epoch."""

    def __init__(self, console) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self.console = console
        self.bar = Progress(
            TextColumn("epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("loss {task.fields[loss]:.4f}  {task.fields[ips]:,.0f} img/s"),
            TimeElapsedColumn(),
            console=console,
            transient=True,
        )
        self.task = None
        self.label = ""
        self.epochs = 0

    def __enter__(self) -> "ConsoleProgress":
        self.bar.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.bar.__exit__(*exc)

    def event(self, e: dict) -> None:
        kind = e["event"]
        if kind == "start":
            self.epochs = e["epochs"]
            resumed = f", resuming after epoch {e['initial_epoch']}" if e["initial_epoch"] else ""
            self.console.print(f"training {e['job']} on {e['ranks']} ranks, {e['steps']} steps per epoch{resumed}")
        elif kind == "step":
            label = f"{e['epoch']}/{self.epochs}"
            if label != self.label:
                if self.task is not None:
                    self.bar.remove_task(self.task)
                self.task = self.bar.add_task("", total=e["steps"], epoch=label, loss=0.0, ips=0.0)
                self.label = label
            self.bar.update(self.task, completed=e["step"], loss=e["loss"], ips=e["images_per_sec"])
        elif kind == "epoch":
            self.console.print(
                f"epoch {e['epoch']}/{self.epochs}: loss {e['loss']:.4f}  accuracy {e['accuracy']:.4f}  "
                f"val_accuracy {e['val_accuracy']:.4f}  {e['images_per_sec']:,.0f} img/s  ({e['elapsed']:.0f} s)"
            )
