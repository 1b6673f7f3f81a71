"""An attempt's recorder, the one writer of run.json: it holds the run's record, writes each
change whole, and keeps the first write this machine could not make."""

from __future__ import annotations

import pytest

from edgetrain.controller.recorder import Recorder
from edgetrain.shared import record, runs
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.record import Status


def started(tmp_path) -> tuple[runs.Run, Recorder]:
    run = runs.create(tmp_path, "lenet")
    recorder = Recorder(run, None)
    attempt = record.Attempt(started=record.now(), command=["edgetrain", "run", "lenet"], np=3, mpirun=["mpirun", "-n", "3"])
    recorder.update(job="lenet", status=Status.STARTING, attempts=[attempt], versions={"edgetrain": "0.1.0"},
                    placement=record.Where(3, "docker", "horovod", "inv", [{"host": "node1", "ranks": 3}]))
    recorder.update(status=Status.RUNNING)
    return run, recorder


def test_what_the_attempt_saw_is_recorded_in_the_record_it_holds(tmp_path):
    run, recorder = started(tmp_path)
    recorder.program_started({"tensorflow": "2.15.0", "edgetrain": "9.9"}, [32, 16, 16])
    recorder.ended(Status.COMPLETED, 0, 4.24, {"node3": "container gone"})
    back = run.record()
    assert back == recorder.held
    assert back.versions == {"tensorflow": "2.15.0", "edgetrain": "0.1.0"}  # what edgetrain recorded of itself stands
    assert back.placement.batches == [32, 16, 16] and back.status is Status.COMPLETED and back.returncode == 0 and back.ended
    assert back.attempts[-1].first_step_s == 4.2 and back.attempts[-1].went_on_without == {"node3": "container gone"}
    # The record held is the one on disk: written again as read back, not a byte changes.
    written = run.info_file.read_bytes()
    run.write(run.record())
    assert run.info_file.read_bytes() == written


def test_a_write_that_fails_leaves_run_json_and_the_record_held_as_they_were_and_the_first_failure_is_kept(tmp_path):
    run, recorder = started(tmp_path)
    blocker = run.path / "run.json.tmp"  # in the way of the atomic write, as a full disk would be
    blocker.mkdir()
    with pytest.raises(EdgetrainError, match="cannot write .*run.json") as first:
        recorder.program_started({"tensorflow": "2.15.0"}, None)
    with pytest.raises(EdgetrainError):
        recorder.ended(Status.FAILED, 1, None, {})
    assert recorder.error is first.value
    assert run.record() == recorder.held and recorder.held.status is Status.RUNNING and "tensorflow" not in recorder.held.versions
    blocker.rmdir()
    recorder.ended(Status.FAILED, 1, None, {})
    assert run.record().status is Status.FAILED and "tensorflow" not in run.record().versions and recorder.error is first.value
