"""The headline of README.md and docs/scaling.md against the kept benches (lab/headline.py): each
table as `python -m lab.headline` writes it, each figure of the sentences around it recomputed."""

import pytest

from lab import headline


def test_the_headline_says_what_the_kept_benches_give():
    problems = headline.check()
    assert not problems, "\n".join(problems)


def _edited(old: str, new: str):
    """The files as they are, but with ``old`` replaced wherever it stands (an edit that no longer
    applies leaves them agreeing with the benches, and the test below fails)."""
    return lambda path: path.read_text().replace(old, new)


@pytest.mark.parametrize("old, new, said", [
    # A cell edited by hand, and a one-seed cell made bold.
    ("2.56x (1.84-3.57; 3 seeds)", "2.60x (1.84-3.57; 3 seeds)", "the headline table is not what the benches give"),
    ("3.29x (1 seed, no interval)", "**3.29x**", "the headline table is not what the benches give"),
    # A sentence's figure: the allreduce's time, the model's prediction.
    ("67.6-108.4 ms", "52-89 ms", "LeNet's 6.5 MB allreduce takes 67.6-108.4 ms"),
    ("1.20x / 1.56x", "1.26x / 1.63x", "N x E(N) 1.20x / 1.56x"),
])
def test_a_figure_edited_by_hand_is_named(old, new, said):
    problems = headline.check(_edited(old, new))
    assert len(problems) >= 1 and all(said in p for p in problems[:1]), "\n".join(problems)


def test_a_one_seed_cell_has_no_interval_and_every_cell_names_its_seeds():
    one, three = headline.cell(headline.ONE_GBIT, headline.SYNC_2, 4), headline.cell(headline.ONE_GBIT, headline.SYNC_2, 3)
    assert one == "3.29x (1 seed, no interval)" and three == "2.56x (1.84-3.57; 3 seeds)"
    assert "**" not in headline.readme_table() + headline.scaling_table()


def test_tuning_seeds_on_the_reported_split_are_refused():
    refusal = headline.tuning_refusal(["--holdout", "6000", "--seed", "8", "--repeat", "3"])
    assert refusal is not None and refusal.startswith("seed 10 is a tuning seed (10-19) and split 2 is kept for reported")
    assert headline.tuning_refusal(["--holdout", "6000", "--holdout-split", "1", "--seed", "10", "--repeat", "1"]) is None
    assert headline.tuning_refusal(["--holdout", "6000", "--seed", "55", "--repeat", "1"]) is None
    assert headline.tuning_refusal(["--epochs", "4"]) is None  # no held-out split: nothing for tuning to see
