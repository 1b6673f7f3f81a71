"""Restart options that could not take effect are one line before anything starts: --min-nodes
only limits the restarts --max-restarts asks for (--rejoin, and --min-nodes above the placement's
nodes with restarts asked for, are in test_cli_errors)."""

from __future__ import annotations

import pytest

from tests.conftest import assert_one_line_error, edgetrain, project_script


@pytest.mark.parametrize("program, args", [
    ("lenet", ("--np", "2", "--min-nodes", "5")),  # more nodes than the placement has, and no restart asked for
    ("script", ("--np", "1", "--min-nodes", "2")),
], ids=["job-above-the-nodes", "script"])
def test_min_nodes_without_max_restarts_is_one_line_and_nothing_runs(tmp_path, program, args):
    target = "lenet" if program == "lenet" else str(project_script(tmp_path, "print('trained', flush=True)\n"))
    root = tmp_path / "runs"
    r = edgetrain("run", target, *args, "--runs-dir", str(root))
    assert_one_line_error(r, f"--min-nodes {args[-1]} limits restarts, and no restart was asked for", "add --max-restarts K",
                          code=2)
    assert not root.exists() or not any(root.iterdir())
