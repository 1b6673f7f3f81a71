"""The Slurm burst's draw and its check that no node held two runs at once (lab/slurm_burst.py)."""

from __future__ import annotations

from lab.slurm_burst import draw, held, overlaps


def record(run: str, attempts: list[tuple[str, dict]], ended: str, hosts: list[str]) -> dict:
    return {"id": run, "ended": ended, "placement": {"hosts": [{"host": h, "ranks": 1} for h in hosts]},
            "attempts": [{"started": f"2026-12-05T10:{t}Z", "excluded": excluded} for t, excluded in attempts]}


def test_the_draw_is_the_seeds_four_jobs_a_user_and_a_multi_node_victim():
    plan = draw(7)
    assert plan == draw(7) and plan != draw(8)
    assert sorted(p.user for p in plan.jobs) == [0] * 4 + [1] * 4 + [2] * 4
    assert {p.nodes for p in plan.jobs} <= {1, 2, 3} and plan.jobs[plan.victim].nodes > 1


def test_a_restarted_run_held_the_node_it_lost_only_until_its_restart():
    rec = record("a", [("00:00", {}), ("01:00", {"node3": "Slurm took it"})], "2026-12-05T10:02:00Z", ["node1", "node2"])
    spans = {(h.node, h.start.minute, h.end.minute) for h in held(rec)}
    assert spans == {("node1", 0, 1), ("node2", 0, 1), ("node3", 0, 1), ("node1", 1, 2), ("node2", 1, 2)}


def test_runs_one_after_the_other_on_a_node_do_not_overlap_and_two_at_once_do():
    first = held(record("a", [("00:00", {})], "2026-12-05T10:01:00Z", ["node1", "node2"]))
    after = held(record("b", [("01:00", {})], "2026-12-05T10:02:00Z", ["node2"]))  # starts as a ends
    elsewhere = held(record("c", [("00:30", {})], "2026-12-05T10:00:40Z", ["node3"]))
    assert overlaps(first + after + elsewhere) == []
    # Inside a longer run's span, past a shorter one that ended first: still found.
    inside = held(record("d", [("00:50", {})], "2026-12-05T10:00:55Z", ["node1"]))
    short = held(record("e", [("00:10", {})], "2026-12-05T10:00:20Z", ["node1"]))
    found = overlaps(first + short + inside + after)
    assert {(a.run, b.run, a.node) for a, b in found} == {("a", "e", "node1"), ("a", "d", "node1")}


def test_the_node_a_run_lost_is_free_for_another_run_once_it_restarted():
    lost = held(record("a", [("00:00", {}), ("01:00", {"node3": "down"})], "2026-12-05T10:03:00Z", ["node1", "node2"]))
    took = held(record("b", [("01:00", {})], "2026-12-05T10:02:00Z", ["node3"]))
    assert overlaps(lost + took) == []
    early = held(record("c", [("00:59", {})], "2026-12-05T10:02:00Z", ["node3"]))
    assert [(a.run, b.run) for a, b in overlaps(lost + early)] == [("a", "c")]
