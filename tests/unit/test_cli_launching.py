"""run, submit and bench take their own arguments from click, not from sys.argv, and end on SIGTERM
or SIGHUP as after Ctrl-C (handlers set in one place, as they start)."""

from __future__ import annotations

import signal

from typer.testing import CliRunner

from edgetrain.controller import cli, scheduler


def test_submit_hands_its_batch_job_exactly_its_own_arguments(tmp_path, monkeypatch):
    # In this process sys.argv is pytest's: no "submit" in it to slice at.
    handed: list[list[str]] = []
    monkeypatch.setattr(scheduler, "submit", lambda config, inv, run_id, argv: handed.append(argv) or "42")
    args = ["lenet", "--np", "1", "--runs-dir", str(tmp_path), "--epochs", "2"]
    kept = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGHUP)}
    try:
        r = CliRunner().invoke(cli.app, ["submit", *args])
        assert [signal.getsignal(sig) for sig in kept] == [cli._interrupt, cli._interrupt]
    finally:
        for sig, handler in kept.items():
            signal.signal(sig, handler)
    assert r.exit_code == 0, r.output
    assert handed == [args]
    assert "Slurm job 42" in r.output
