"""run.json as a typed record: written and read back whole, an older record read with defaults, a
newer or damaged one refused in one line (and listed as damaged, not a crash)."""

from __future__ import annotations

import json

import pytest

from edgetrain.shared import record, runs, untrusted
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.record import Attempt, ProgramKind, RunRecord, Status, Where

# A run.json as edgetrain wrote it before the record had a schema version (abridged from a real run).
UNVERSIONED = {
    "id": "20261120-101500-lenet-ab12", "job": "lenet", "kind": "job", "status": "completed",
    "program": {"args": []}, "workdir": None, "returncode": 0, "ended": "2026-11-20T10:16:00Z",
    "placement": {"np": 2, "oversubscribed": False, "inventory": "embedded", "runtime": "host",
                  "strategy": "horovod", "hosts": [{"host": "vm", "ranks": 2}]},
    "versions": {"edgetrain": "0.1.0", "mpich": "4.0.2"},
    "dataset": {"mnist": {"format": "npz", "files": {}}},
    "attempts": [{"started": "2026-11-20T10:15:00Z", "command": ["edgetrain", "run", "lenet"], "np": 2,
                  "resumed_from_epoch": None, "mpirun": ["mpirun", "-n", "2"], "shipped": [], "first_step_s": 4.2}],
}


def test_a_record_is_written_and_read_back_whole(tmp_path):
    run = runs.create(tmp_path, "lenet")
    attempt = Attempt(started=record.now(), command=["edgetrain", "run", "x.py"], np=3, mpirun=["mpirun"], resumed_from_epoch=2)
    held = run.write(None, job="x", status=Status.STARTING, kind=ProgramKind.SCRIPT, attempts=[attempt],
                     placement=Where(np=3, runtime="docker", strategy="torch", inventory="inv", hosts=[{"host": "n1", "ranks": 3}]))
    run.write(held, status=Status.FAILED, error="rank 1 on n1 failed")
    back = run.record()
    assert back == RunRecord(id=run.id, job="x", status=Status.FAILED, kind=ProgramKind.SCRIPT, attempts=[attempt],
                             placement=Where(np=3, runtime="docker", strategy="torch", inventory="inv", hosts=[{"host": "n1", "ranks": 3}]),
                             error="rank 1 on n1 failed")
    on_disk = json.loads(run.info_file.read_text())
    assert on_disk["schema"] == record.SCHEMA and on_disk["status"] == "failed" and on_disk["kind"] == "script"


def test_a_record_from_before_the_schema_is_read_with_its_fields(tmp_path):
    run = runs.create(tmp_path, "lenet")
    run.info_file.write_text(json.dumps({**UNVERSIONED, "a_field_of_a_later_edgetrain": 1}))
    rec = run.record()
    assert rec.status is Status.COMPLETED and rec.placement.hosts == [{"host": "vm", "ranks": 2}]
    assert rec.attempts[0].first_step_s == 4.2 and rec.command == ["edgetrain", "run", "lenet"]
    assert runs.summarize(run).job == "lenet"


@pytest.mark.parametrize("change, said", [
    ({"schema": record.SCHEMA + 1}, f"has schema {record.SCHEMA + 1}, this edgetrain reads up to {record.SCHEMA}"),
    ({"status": "paused"}, "run.json is damaged ('paused' is not a valid Status)"),
    ({"attempts": [{"np": 2}]}, "run.json is damaged (attempts[0].started is missing)"),
    ({"attempts": [1]}, "run.json is damaged (attempts[0] is a whole number, not an object)"),
    ({"placement": {**UNVERSIONED["placement"], "hosts": "abc"}}, "run.json is damaged (placement.hosts is a string, not a list)"),
    ({"placement": {**UNVERSIONED["placement"], "hosts": [{"host": "vm", "ranks": True}]}},
     "run.json is damaged (placement.hosts[0].ranks is true or false, not a whole number)"),
    ({"versions": "9.9.9"}, "run.json is damaged (versions is a string, not an object)"),
])
def test_a_record_this_version_cannot_read_is_one_line_and_listed_as_damaged(tmp_path, change, said):
    run = runs.create(tmp_path, "lenet")
    run.info_file.write_text(json.dumps({**UNVERSIONED, **change}))
    with pytest.raises(EdgetrainError) as exc:
        run.record()
    assert said in str(exc.value) and "\n" not in str(exc.value)
    assert run.status() is Status.DAMAGED
    summary = runs.summarize(run)
    assert summary.status is Status.DAMAGED and said in summary.problems[0]


def test_a_record_nested_too_deep_is_damaged_not_a_crash(tmp_path):
    run = runs.create(tmp_path, "lenet")
    run.info_file.write_text(json.dumps(UNVERSIONED)[:-1] + ', "deep": ' + "[" * 3000 + "]" * 3000 + "}")
    with pytest.raises(EdgetrainError, match=f"no readable run.json \\(it nests deeper than {untrusted.MAX_DEPTH} levels\\)"):
        run.record()
    assert runs.summarize(run).status is Status.DAMAGED


def test_a_status_goes_only_where_a_run_can_go(tmp_path):
    """Every write of a status is checked against record.NEXT: a run completes only after it ran, an
    ended run changes only by a new attempt, and a resume of one whose command died starts again."""
    run = runs.create(tmp_path, "lenet")
    for bad in (Status.RUNNING, Status.COMPLETED, Status.INTERRUPTED):
        with pytest.raises(ValueError, match=f"status none cannot become {bad.value}"):
            run.write(None, job="lenet", status=bad)
    assert not run.info_file.exists()  # a refused write leaves nothing
    held = run.write(None, job="lenet", status=Status.STARTING)
    with pytest.raises(ValueError, match="status starting cannot become completed"):
        run.write(held, status=Status.COMPLETED)
    held = run.write(held, status=Status.RUNNING)
    held = run.write(held, status="completed")  # as a string too
    for bad in (Status.RUNNING, Status.COMPLETED, Status.INTERRUPTED):
        with pytest.raises(ValueError, match=f"status completed cannot become {bad.value}"):
            run.write(held, status=bad)
    assert run.record().status is Status.COMPLETED
    held = run.write(held, status=Status.STARTING)  # a resume's new attempt
    held = run.write(held, status=Status.RUNNING)
    held = run.write(held, status=Status.STARTING)  # a resume of a run whose command died while it ran
    run.write(held, status=Status.FAILED)  # its containers would not start
    assert run.record().status is Status.FAILED
