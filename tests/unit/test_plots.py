"""The figures (edgetrain.controller.plots): what a bench figure and a run figure carry, drawn from
the records bench and runs write, and `edgetrain runs plot`'s bad input as one line each. A real
bench's and real runs' figures are drawn in tests/unit/test_bench.py."""

from __future__ import annotations

import json
import xml.etree.ElementTree as ET

import pytest

from edgetrain.controller import plots
from edgetrain.controller.bench import record
from edgetrain.shared import runs
from tests.conftest import assert_one_line_error, edgetrain, project_script


def _trials(n: int, rates: list[float], seconds: list[float | None]) -> list[dict]:
    return [{"nodes": n, "run": f"r{n}{k}", "images_per_sec": r, "seconds_to_target": s, "images_to_target": None, "status": "completed"}
            for k, (r, s) in enumerate(zip(rates, seconds))]


def _bench(scale: float) -> dict:
    """A three-node bench as bench.json holds it: medians per N over three tries, a prediction."""
    tries = {1: [100, 96, 104], 2: [190, 180, 196], 3: [270, 262, 285]}
    seconds = {1: [300.0, 310.0, 290.0], 2: [170.0, 160.0, 175.0], 3: [None, 130.0, 120.0]}
    points = []
    for n, rates in tries.items():
        rates = [r * scale for r in rates]
        reached = [s for s in seconds[n] if s is not None]
        points.append({"nodes": n, "images_per_sec": sorted(rates)[1], "efficiency": sorted(rates)[1] / (n * 100 * scale), "comm_share": None,
                       "seconds_to_target": sorted(reached)[len(reached) // 2], "predicted_efficiency": None,
                       "trials": _trials(n, rates, seconds[n]), "predicted_range": None})
    return {"points": points, "target_accuracy": 0.985, "predicted_efficiency": {"2": 0.95, "3": 0.9},
            "predicted_range": {"2": [0.9, 0.98], "3": [0.82, 0.95]}}


def _read(body: dict) -> record.BenchRecord:
    """The figure draws what bench.json reads back as."""
    return record.BenchRecord.from_json(body)


def test_a_bench_figure_sets_benches_side_by_side_with_their_tries_spread(tmp_path):
    fig = plots.bench_figure([("optimistic", _read(_bench(1.0))), ("pessimistic", _read(_bench(0.8)))])
    rate, eff, target = fig.axes
    for i, scale in enumerate((1.0, 0.8)):
        bars = rate.containers[i]
        assert bars.lines[0].get_xydata().tolist() == [[1, 100 * scale], [2, 190 * scale], [3, 270 * scale]]
        # Each bar spans that N's slowest to fastest try.
        spans = [y for seg in bars.lines[2][0].get_segments() for y in sorted(seg[:, 1].tolist())]
        assert spans == pytest.approx([v * scale for v in (96, 104, 180, 196, 262, 285)])
        # Time to target: N = 3's median of the two tries that reached it, its bar over those two.
        reached = target.containers[i]
        assert reached.lines[0].get_xydata()[:, 1].tolist() == [300.0, 170.0, 130.0]
    predicted = [line for line in eff.lines if line.get_label() == "pessimistic: predicted"]
    assert predicted[0].get_xydata().tolist() == [[2, 0.95], [3, 0.9]]
    assert len(eff.collections) == 2  # each bench's predicted band
    legend = [t.get_text() for t in rate.get_legend().get_texts()]
    assert "optimistic" in legend and "pessimistic" in legend
    assert target.get_title() == "seconds to 98.5% val accuracy"
    text = plots.save(fig, tmp_path / "bench.svg").read_text()
    assert "pessimistic: predicted" in text


def test_the_ideal_line_is_n_times_the_one_node_rate_e_n_divides_by():
    alone, concurrent = _bench(1.0), _bench(1.0)
    for p, one in zip(concurrent["points"], (100, 90, 85)):  # bench --reference concurrent: each N's own
        p["reference"] = one
    rate = plots.bench_figure([("alone", _read(alone)), ("concurrent", _read(concurrent))]).axes[0]
    ideal = {line.get_label(): line.get_xydata().tolist() for line in rate.lines if line.get_label().endswith("N x one node")}
    assert ideal == {"alone: N x one node": [[1, 100], [2, 200], [3, 300]], "concurrent: N x one node": [[1, 100], [2, 180], [3, 255]]}


def test_each_sync_every_candidate_bench_measured_is_a_series_of_its_own():
    body = _bench(1.0)
    body["points"][2]["reference"] = 90  # --reference concurrent at N = 3
    body["sync_candidates"] = [
        {"sync_every": 1, "sync_mode": "grads", "nodes": 2, "predicted": 0.9, "images_per_sec": 190},  # the N-loop's own
        {"sync_every": 2, "sync_mode": "grads", "nodes": 3, "predicted": 0.93, "images_per_sec": 243, "seconds_to_target": 110.0},
        {"sync_every": 2, "sync_mode": "grads", "nodes": 2, "predicted": 0.96, "images_per_sec": 196, "seconds_to_target": None},
        {"sync_every": 2, "sync_mode": "weights", "nodes": 2, "predicted": 0.97, "images_per_sec": None},  # predicted, not tried
        {"sync_every": 4, "sync_mode": "weights", "nodes": 2, "predicted": 0.98, "images_per_sec": 150, "seconds_to_target": 200.0},
    ]
    for c in body["sync_candidates"]:
        c["predicted_range"] = [c["predicted"] - 0.1, c["predicted"] + 0.01]
    rate, eff, target = plots.bench_figure([("pi", _read(body))]).axes
    series = {ax: {line.get_label(): line.get_xydata().tolist() for line in ax.lines} for ax in (rate, eff, target)}
    assert series[rate]["pi: --sync-every 2 grads"] == [[2, 196], [3, 243]]
    assert series[rate]["pi: --sync-every 4 weights"] == [[2, 150]]
    assert series[target]["pi: --sync-every 2 grads"] == [[3, 110.0]]  # N = 2's try missed the target
    # E(N) divides by each N's own one-node rate: N = 3's concurrent reference, N = 2's the run alone.
    assert [v for xy in series[eff]["pi: --sync-every 2 grads: measured"] for v in xy] == pytest.approx([2, 0.98, 3, 0.9])
    assert series[eff]["pi: --sync-every 2 grads: predicted"] == [[2, 0.96], [3, 0.93]]
    # The N-loop's series named by its own setting, not drawn again; a candidate only predicted not drawn.
    assert series[eff]["pi: --sync-every 1 grads: measured"][0] == [1, 1.0]
    assert not [name for ax in series.values() for name in ax if "2 weights" in name]
    assert [line.get_label() for line in rate.lines if "--sync-every 1 " in line.get_label()] == ["pi: --sync-every 1 grads: N x one node"]
    colours = {line.get_color() for line in rate.lines if line.get_label() in ("pi: --sync-every 2 grads", "pi: --sync-every 4 weights")}
    assert len(colours) == 2 and rate.containers[0].lines[0].get_color() not in colours


def test_a_damaged_sync_candidate_is_refused_before_it_is_drawn():
    body = _bench(1.0)
    body["sync_candidates"] = [{"sync_every": 2, "sync_mode": "sideways", "nodes": 2, "predicted": 0.9, "predicted_range": [0.8, 0.95]}]
    with pytest.raises(ValueError, match=r"sync_candidates\[0\]\.sync_mode is not a --sync-mode"):
        _read(body)


def test_a_run_figure_shows_accuracy_and_img_s_over_time(tmp_path):
    run = runs.create(tmp_path, "lenet")
    (run.path / "run.json").write_text("{}")
    records = [{"kind": "eval", "epoch": 1, "step": 10, "seconds": 5.0, "val_accuracy": 0.9},
               {"epoch": 1, "accuracy": 0.85, "val_accuracy": 0.93, "images_per_sec": 200.0, "elapsed": 9.0, "ranks": 2},
               {"epoch": 2, "accuracy": 0.95, "val_accuracy": 0.97, "images_per_sec": 260.0, "elapsed": 15.0, "ranks": 2}]
    run.metrics_file.write_text("".join(json.dumps(r) + "\n" for r in records))
    fig = plots.run_figure([run], ["mine"])
    acc, rate = fig.axes
    lines = {line.get_label(): line.get_xydata().tolist() for line in acc.lines}
    assert lines["mine: evaluations"] == [[5.0, 0.9]]
    assert lines["mine: val_accuracy per epoch"] == [[9.0, 0.93], [15.0, 0.97]]
    assert rate.lines[0].get_xydata().tolist() == [[9.0, 200.0], [15.0, 260.0]]
    path = plots.save(fig, tmp_path / "run.svg")
    assert "mine: val_accuracy per epoch" in path.read_text()
    ET.parse(path)  # a whole SVG document


def test_a_plot_is_written_in_the_format_its_file_name_says(tmp_path):
    root, _, bench = _runs_dir(tmp_path)
    for name, magic in (("b.png", b"\x89PNG"), ("b.pdf", b"%PDF"), ("b.svg", b"<?xml")):
        r = edgetrain("runs", "plot", bench.name, "--out", str(tmp_path / name), "--runs-dir", str(root))
        assert r.returncode == 0, r.stderr
        assert (tmp_path / name).read_bytes().startswith(magic), name


def _runs_dir(tmp_path):
    root = tmp_path / "runs"
    run = runs.create(root, "lenet")
    (run.path / "run.json").write_text("{}")
    bench = root / runs.new_id("bench-lenet")
    bench.mkdir()
    (bench / "bench.json").write_text(json.dumps(_bench(1.0)))
    return root, run, bench


def test_runs_plot_draws_benches_on_one_figure_under_their_labels(tmp_path):
    root, _, bench = _runs_dir(tmp_path)
    other = root / runs.new_id("bench-lenet-x")
    other.mkdir()
    (other / "bench.json").write_text(json.dumps(_bench(0.8)))
    out = tmp_path / "both.svg"
    r = edgetrain("runs", "plot", bench.name, other.name, "--label", "comm core", "--label", "shared", "--out", str(out), "--runs-dir", str(root))
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == f"plot: {out}"
    text = out.read_text()
    assert "comm core" in text and "shared" in text and "seconds to 98.5% val accuracy" in text


@pytest.mark.parametrize(("args", "error", "code"), [
    (["{run}", "{bench}", "--out", "x.svg"], "a figure is of runs or of benches, not both", 2),
    (["{bench}", "{bench}"], "several ids make one figure: say where it goes", 2),
    (["{bench}", "--label", "a", "--label", "b"], "2 --label for 1 ids", 2),
    (["no-such-run"], "no run 'no-such-run' in", 1),
    (["{bench}", "--out", "b.jpg"], "b.jpg: a plot is written as .svg, .png, .pdf", 2),
    (["{run}"], "no epoch or evaluation records to plot", 1),
])
def test_runs_plot_bad_input_is_one_line(tmp_path, args, error, code):
    root, run, bench = _runs_dir(tmp_path)
    argv = [a.format(run=run.id, bench=bench.name) for a in args]
    assert_one_line_error(edgetrain("runs", "plot", *argv, "--runs-dir", str(root)), error, code=code)
    assert not list(tmp_path.rglob("*.svg"))


DAMAGED_BENCHES = {
    "points of numbers": ({"points": [1]}, "points[0] is a whole number, not an object"),
    "a rate in words": ({"points": [{"nodes": 2, "images_per_sec": "fast", "trials": []}]}, "points[0].images_per_sec is a string"),
    "a range of three": ({**_bench(1.0), "predicted_range": {"2": [0.9, 0.95, 0.98]}}, "predicted_range['2'] holds 3 items, not 2"),
    "a node count in words": ({**_bench(1.0), "predicted_efficiency": {"two": 0.9}}, "predicted_efficiency key 'two' is not a number of nodes"),
    "nested deep": ("[" * 3000 + "]" * 3000, "nests deeper than"),
}


@pytest.mark.parametrize("case", DAMAGED_BENCHES, ids=list(DAMAGED_BENCHES))
def test_a_damaged_bench_json_is_one_line_naming_the_field_and_run_passes_over_it(tmp_path, case):
    """A bench directory is a run directory: its bench.json is read back by `runs plot` and by every
    `edgetrain run` of the same program (for its advice), and either crashed on a damaged one."""
    body, why = DAMAGED_BENCHES[case]
    root = tmp_path / "runs"
    bench = root / runs.new_id("bench-train")
    bench.mkdir(parents=True)
    (bench / "bench.json").write_text(body if isinstance(body, str) else json.dumps(body))
    line = assert_one_line_error(edgetrain("runs", "plot", bench.name, "--runs-dir", str(root)), "bench.json cannot be read", why)
    assert str(bench / "bench.json") in line
    script = project_script(tmp_path, "print('trained', flush=True)\n")
    trained = edgetrain("run", str(script), "--np", "1", "--runs-dir", str(root))
    assert trained.returncode == 0, trained.stderr
    assert "trained" in trained.stdout and "Traceback" not in trained.stderr
