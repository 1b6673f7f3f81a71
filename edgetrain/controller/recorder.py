"""The one writer of run.json while an attempt of its run is launched and trains.

An attempt's recorder holds the run's record (read once, where the attempt resumes a run) and
writes each change through ``runs.Run.write``; the monitor and the observers only say what they
saw. A write that fails (this machine's disk is full) leaves run.json and the record held as they
were, and the first such failure is kept (``error``) for the attempt's end to report.
"""

from __future__ import annotations

import contextlib
from collections.abc import Mapping
from dataclasses import replace
from typing import Any

from edgetrain.shared import record, runs
from edgetrain.shared.errors import EdgetrainError


class Recorder:
    def __init__(self, run: runs.Run, held: record.RunRecord | None) -> None:
        self.run, self.held = run, held
        self.error: EdgetrainError | None = None  # the first write this machine could not make

    def update(self, **changes: Any) -> None:
        """run.json with ``changes`` made to the record held; an EdgetrainError where it cannot be written."""
        try:
            self.held = self.run.write(self.held, **changes)
        except EdgetrainError as exc:
            self.error = self.error or exc
            raise

    def program_started(self, versions: Mapping[str, str], batches: list[int] | None) -> None:
        """Rank 0's program started: the versions it found beside what edgetrain recorded of itself
        and the runtime (which stand), and each rank's batch where the program sized them."""
        assert self.held is not None
        where = self.held.placement
        if batches and where is not None:
            where = replace(where, batches=batches)
        self.update(versions={**versions, **self.held.versions}, placement=where)

    def ended(self, status: record.Status, returncode: int | None, first_step: float | None, went_on_without: Mapping[str, str]) -> None:
        """The attempt's end: its status and mpirun's exit code, and on the attempt when its first
        step came (seconds from the launch) and the nodes it went on without."""
        assert self.held is not None
        attempts = list(self.held.attempts)
        if attempts:
            attempts[-1] = replace(attempts[-1], first_step_s=round(first_step, 1) if first_step is not None else None,
                                   went_on_without=dict(went_on_without))
        self.update(status=status, ended=record.now(), returncode=returncode, attempts=attempts)

    def ended_by(self, why: str) -> None:
        """What ended the attempt, once its run has judged it (a node lost, a rank's failure,
        success: the supervisor's words). Where run.json cannot be written it keeps its last whole
        version: the error that ends the run says so."""
        if self.held is None or not self.held.attempts:
            return
        attempts = list(self.held.attempts)
        attempts[-1] = replace(attempts[-1], ended_by=why)
        with contextlib.suppress(EdgetrainError):
            self.update(attempts=attempts)
