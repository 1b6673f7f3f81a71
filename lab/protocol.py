"""The benchmark protocol docs/scaling.md follows, where more than one bench needs it: the seeds
that tuning may see, which no reported figure uses on the split kept for reporting."""

TUNING_SEEDS = range(10, 20)
