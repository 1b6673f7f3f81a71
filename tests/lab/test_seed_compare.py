"""The seed's own script against edgetrain: the ratio of their times split into factors
(lab/seed_compare.py), on rows written here."""

import math

import yaml

from lab import seed_compare


def edge(seconds: float | None = 250.0, ips: float = 600.0) -> dict:
    return {"who": "edgetrain", "nodes": 3, "images_per_sec": ips, "seconds_to_target": seconds}


def own(fine: float | None, coarse: float | None, ips: float = 300.0) -> dict:
    return {"who": "seed's own script", "nodes": 3, "images_per_sec": ips,
            "seconds_to_target_fine": fine, "seconds_to_target_epoch_end": coarse}


def test_the_factors_multiply_to_the_seeds_time_over_edgetrains():
    out = seed_compare.split(edge(250, 600), own(600, 800, 300), {"images_per_sec": 150.0})
    assert out["recipe_img_s"] == 2.0 and out["horovod_settings_img_s"] == 2.0
    assert out["cadence"] == round(800 / 600, 3) and out["schedule_and_rest"] == round(600 / 250 / 2, 3)
    assert out["total_same_settings"] == 3.2
    assert math.isclose(out["recipe_img_s"] * out["cadence"] * out["schedule_and_rest"], out["total_same_settings"], rel_tol=1e-3)
    assert out["total_derived"] == 6.4  # at the seed's own Horovod settings, derived from its img/s there


def test_a_target_the_seed_missed_leaves_the_factors_it_needs_unset():
    never = seed_compare.split(edge(), own(None, None), None)
    assert never == {"nodes": 3, "recipe_img_s": 2.0}
    only_fine = seed_compare.split(edge(), own(500, None), None)
    assert only_fine["cadence"] is None and "total_same_settings" not in only_fine and only_fine["schedule_and_rest"] == 1.0
    edge_missed = seed_compare.split(edge(None), own(500, 700), None)
    assert edge_missed["schedule_and_rest"] is None and "total_same_settings" not in edge_missed


def test_the_seeds_own_script_is_judged_on_edgetrains_grid_for_as_many_images_at_most(monkeypatch):
    seen = {}

    def fake_run(inv, n, runs_dir, args):
        seen["args"] = args
        judged = [{"event": "judged", "images": 13_440 * k, "epoch_end": False, "held_out_accuracy": 0.98 + 0.004 * k,
                   "seconds_from_first_step": 30.0 * k} for k in (1, 2, 3)]
        judged.append({"event": "judged", "images": 48_000, "epoch_end": True, "held_out_accuracy": 0.991, "seconds_from_first_step": 110.0})
        return [*judged, {"event": "epoch", "images_per_sec": 400.0}]
    monkeypatch.setattr(seed_compare, "_seed_run", fake_run)
    row = seed_compare.own("inv", 3, 0.99, 4, "runs", 6000)
    args = seen["args"]
    assert args[args.index("--batch") + 1] == "32" and args[args.index("--rank-steps") + 1] == "500"
    assert args[args.index("--judge-every") + 1] == str(54_000 // 4 // 96)  # a quarter of edgetrain's epoch at 3 ranks
    assert args[args.index("--epochs") + 1] == "5"  # 4 x 54,000 images in epochs of 48,000
    assert row["seconds_to_target_fine"] == 90.0 and row["images_to_target_fine"] == 40_320
    assert row["seconds_to_target_epoch_end"] == 110.0 and row["images_per_sec"] == 400.0


def test_every_host_gets_one_slot_so_n_ranks_land_on_n_nodes(tmp_path):
    inv = tmp_path / "docker.yml"
    inv.write_text("all:\n  children:\n    cluster:\n      vars: {edgetrain_slots: 1}\n      children:\n        head:\n"
                   "          hosts:\n            node1: &h {ansible_host: 198.18.0.11, edgetrain_slots: 2}\n"
                   "        rpi:\n          hosts:\n            node1: *h\n            node2: {ansible_host: 198.18.0.12}\n")
    out = yaml.safe_load(open(seed_compare.one_slot(str(inv))))
    hosts = out["all"]["children"]["cluster"]["children"]
    assert hosts["head"]["hosts"]["node1"] == {"ansible_host": "198.18.0.11", "edgetrain_slots": 1}
    assert hosts["rpi"]["hosts"]["node1"]["edgetrain_slots"] == 1 and "edgetrain_slots" not in hosts["rpi"]["hosts"]["node2"]
