"""Sampled and scored runs kept for later commands: the run store ([`RunStore`]) that benchmark, evaluate and tune
resume from, keyed by what decides a run's samples ([`RunKey`]) and its scores ([`ScoreKey`])."""

from .store import RUN_SETTINGS, RunKey, RunStore, ScoreKey, StoredSamples, StoreScoring, open_store


__all__ = ["RUN_SETTINGS", "RunKey", "RunStore", "ScoreKey", "StoreScoring", "StoredSamples", "open_store"]
