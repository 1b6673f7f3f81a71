"""What comes back from the nodes: each node's own ranks' files only, names that are not a rank's
ignored, whole files or none, caps per copy, bounded memory, and the first failure by when it
happened rather than by a node's clock."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

import pytest

from edgetrain.controller import blame, launch, observers, placement, runtimes
from edgetrain.controller.inventory import Host, Inventory
from edgetrain.controller import remote
from edgetrain.controller.remote import Nodes
from edgetrain.shared import failures, runs
from edgetrain.shared.errors import EdgetrainError
from edgetrain.shared.layout import RunLayout

from .test_restarts import _driven

LOCAL = Host(name="localhost", address="localhost", arch="x86_64", slots=2, runtime="host", connection="local")


def host(name: str, groups=("rpi",)) -> Host:
    return Host(name=name, address=f"198.18.0.{len(name)}", arch="aarch64", slots=1, runtime="docker", user="pi",
                iface="eth0", groups=frozenset(groups))


def two_nodes() -> placement.Placement:
    return placement.plan(Inventory(Path("inv"), (host("head", groups=("head", "rpi")), host("worker1"))), 2)


def test_a_node_gives_back_only_its_own_ranks_files(tmp_path):
    """A worker (rank 1) forges rank 0's failure record and a log no rank has."""
    plan = two_nodes()
    node = tmp_path / "worker-run"
    node.mkdir()
    (node / "rank.0.failure.json").write_text(json.dumps({"rank": 0, "host": "head", "pid": 1, "error": "forged", "time": 0}))
    (node / "rank.1.log").write_text("rank 1/2 on worker1 (pid 7)\n")
    (node / "rank.x.log").write_text("?\n")
    (node / "metrics.jsonl").write_text('{"epoch": 1}\n')
    dest = tmp_path / "run"
    with Nodes() as nodes:
        nodes.fetch(LOCAL, str(node), runtimes.node_files(plan, plan.hosts[1]), dest)
    assert sorted(p.name for p in dest.iterdir()) == ["rank.1.log"]
    assert runtimes.node_files(plan, plan.head) == ["rank.0.log", "rank.0.failure.json", "rank.0.ended", "metrics.jsonl",
                                                    RunLayout.OUTPUTS_LIST]


def test_names_that_are_not_a_ranks_are_ignored_not_a_crash(tmp_path):
    for name in ("rank.x.log", "rank.-1.log", "rank..ended", "rank.1e3.ended", "rank.x.failure.json"):
        (tmp_path / name).write_text("{}")
    (tmp_path / "rank.1.log").write_text("rank 1/2 on worker1 (pid 7)\n")
    # A record under rank 1's name that speaks for rank 0.
    (tmp_path / "rank.1.failure.json").write_text(json.dumps({"rank": 0, "host": "head", "pid": 1, "error": "forged", "time": 0}))
    run = runs.Run(tmp_path)
    assert [p.name for p in run.logs()] == ["rank.1.log"]
    assert failures.ended(tmp_path) == [] and failures.read_all(tmp_path) == []
    found = blame.find(blame.Observed(run, two_nodes(), ["mpirun exited"]))
    assert found.error is None and found.log_tail == ("mpirun exited",)


@pytest.fixture
def cut_stream(tmp_path, monkeypatch) -> None:
    """The node's tar stream ends after 32 KiB, as a dropped link ends it."""
    real = shutil.which("tar")
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "tar").write_text(f'#!/bin/sh\n{real} "$@" | head -c 32768\n')
    (fake / "tar").chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}:{os.environ['PATH']}")


def test_an_interrupted_fetch_never_replaces_a_whole_file_with_part_of_it(tmp_path, cut_stream):
    node = tmp_path / "node"
    node.mkdir()
    (node / "metrics.jsonl").write_text('{"epoch": 2}\n')
    (node / "rank.0.log").write_bytes(os.urandom(100_000))
    here = tmp_path / "run"
    here.mkdir()
    (here / "rank.0.log").write_text("the whole log of the attempt before\n")
    with Nodes() as nodes, pytest.raises(EdgetrainError) as err:
        nodes.fetch(LOCAL, str(node), ["metrics.jsonl", "rank.*.log"], here)
    assert "cut short in rank.0.log" in str(err.value)
    assert (here / "rank.0.log").read_text() == "the whole log of the attempt before\n"
    assert (here / "metrics.jsonl").read_text() == '{"epoch": 2}\n'  # it came whole before the cut
    assert sorted(p.name for p in here.iterdir()) == ["metrics.jsonl", "rank.0.log"]  # no staging left


def test_a_fetch_takes_no_more_than_its_caps(tmp_path):
    node = tmp_path / "node"
    node.mkdir()
    for rank in range(3):
        (node / f"rank.{rank}.log").write_bytes(b"x" * 1000)
    with Nodes() as nodes:
        with pytest.raises(EdgetrainError, match="stopped at rank.2.log: more than 2 files"):
            nodes.fetch(LOCAL, str(node), ["rank.*.log"], tmp_path / "a", caps=remote.Caps(members=2))
        with pytest.raises(EdgetrainError, match="stopped at rank.1.log: more than 1500 bytes"):
            nodes.fetch(LOCAL, str(node), ["rank.*.log"], tmp_path / "b", caps=remote.Caps(bytes=1500))
    assert sorted(p.name for p in (tmp_path / "a").iterdir()) == ["rank.0.log", "rank.1.log"]
    assert sorted(p.name for p in (tmp_path / "b").iterdir()) == ["rank.0.log"]


def _read(command: str) -> list:
    """What the reader posts from ``command``'s output, to the end of its stream."""
    proc = subprocess.Popen([sys.executable, "-c", command], stdout=subprocess.PIPE, text=True)
    posted: list = []
    reader = observers.Reader(proc.stdout, "0" * 16, posted.append)
    reader.run()
    proc.wait()
    assert isinstance(posted.pop(), observers.StreamEnded)
    return posted


def test_mpiruns_output_is_kept_in_bounded_memory():
    lines = launch.OUTPUT_LINES * 3
    events, fake, _ = _driven()
    watched = launch.Watched(fake, observers.Observers(events, SimpleNamespace(), SimpleNamespace(interval=2.0)),
                             lambda event: None, lambda line: None)
    for event in _read(f"for i in range({lines}): print('line', i)"):
        watched.post(event)
    assert len(watched.output) == launch.OUTPUT_LINES and list(watched.output)[-1] == f"line {lines - 1}"


def test_a_line_without_end_is_read_in_bounded_pieces():
    chars = observers.LINE_CHARS * 40
    pieces = [event.text for event in _read(f"import sys; sys.stdout.write('x' * {chars}); sys.stdout.flush()")]
    assert sum(map(len, pieces)) == chars and max(map(len, pieces)) <= observers.LINE_CHARS


def test_a_rank_logs_tail_is_read_in_bounded_memory(tmp_path):
    """A rank that printed 48 MB, most of it without a newline."""
    run = runs.Run(tmp_path)
    with open(run.log(0), "w") as f:
        f.write("rank 0/1 on head (pid 42)\n")
        f.write("x" * (48 << 20) + "\n")
        f.write("Traceback: the end\n")
    observed = blame.Observed(run, two_nodes(), [])
    tracemalloc.start()
    try:
        tail, hosts = observed.tail(0), observed.rank_hosts
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert tail[-1] == "Traceback: the end" and hosts == {"42": [(0, "head")]}
    assert peak < 4 << 20


def test_the_first_failure_is_the_one_that_happened_first_not_the_earliest_node_clock(tmp_path):
    """Rank 2 failed first; rank 1's node then stepped its clock back an hour (NTP on a Pi without
    a real-time clock) before rank 1 failed."""
    plan = placement.plan(Inventory(Path("inv"), (host("node1", groups=("head", "rpi")), host("node2"), host("node3"))), 3)
    failures.write(tmp_path, 2, "node3", "ValueError: first", None)
    time.sleep(0.01)
    later = failures.write(tmp_path, 1, "node2", "ValueError: second", None)
    record = failures.path(tmp_path, 1)
    record.write_text(json.dumps({**json.loads(record.read_text()), "time": later.time - 3600}))
    assert [f.rank for f in failures.read_all(tmp_path)] == [2, 1]
    found = blame.find(blame.Observed(runs.Run(tmp_path), plan, []))
    assert (found.rank, found.error) == (2, "ValueError: first")


def test_a_hostile_archive_writes_nothing_outside_what_was_asked_for(tmp_path):
    """What a node's tar may hold besides the files asked for - a name climbing out, an absolute
    name, a link, a device - is refused member by member, without tarfile's extraction filters
    (Python 3.11.2, Debian bookworm's, has none)."""
    def member(name: str, kind=tarfile.REGTYPE, data: bytes = b"x") -> tuple[tarfile.TarInfo, bytes]:
        info = tarfile.TarInfo(name)
        info.type, info.size = kind, len(data) if kind == tarfile.REGTYPE else 0
        if kind == tarfile.SYMTYPE:
            info.linkname = "/etc/passwd"
        return info, data

    stream = io.BytesIO()
    with tarfile.open(fileobj=stream, mode="w") as tar:
        for info, data in (member("rank.0.log", data=b"whole\n"), member("../escape.log"), member("/tmp/absolute.log"),
                           member("rank.1.log", tarfile.SYMTYPE), member("rank.2.log", tarfile.CHRTYPE),
                           member("*/../../up.log")):
            tar.addfile(info, io.BytesIO(data) if info.isfile() else None)
    stream.seek(0)
    into = tmp_path / "into"
    into.mkdir()
    unpacking = remote._Unpacking(["rank.*.log", "*"], remote.Caps())
    unpacking.run(stream, into)
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["into", "rank.0.log"]
    assert (into / "rank.0.log").read_text() == "whole\n"
    assert len(unpacking.refused) == 5 and not Path("/tmp/absolute.log").exists()
