"""Sampled and scored runs kept for later commands: the run store ([`RunStore`]) that benchmark, evaluate and tune
resume from, keyed by what decides a run's samples ([`RunKey`]), its scores ([`ScoreKey`]) and a tuning-bank run's
scores ([`BankRunKey`])."""

from .bank_run import BankRun
from .store import RUN_SETTINGS, BankRunKey, RunKey, RunStore, ScoreKey, StoredSamples, StoreScoring, open_store


__all__ = [
    "RUN_SETTINGS",
    "BankRun",
    "BankRunKey",
    "RunKey",
    "RunStore",
    "ScoreKey",
    "StoreScoring",
    "StoredSamples",
    "open_store",
]
