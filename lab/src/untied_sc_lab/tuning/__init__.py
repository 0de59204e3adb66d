"""Tuning: the coefficient search of `untied-sc tune` and the baselines' knob tuning, one rule and budget for every
sampler (docs/algorithm.md §6)."""
