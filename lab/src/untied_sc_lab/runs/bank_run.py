"""A tuning-bank run's scores: what every tuning decision reads, and what the run store keeps of a scored bank run."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from ..evaluation.curves import RunSamples


@dataclass
class BankRun:
    """One run on the bank: pooled GenPPL, mean entropy and the per-sample records the bootstrap resamples."""

    gen_ppl: float
    entropy: float | None
    nll_sum: list[float]
    num_tokens: list[float]
    entropies: list[float | None] | None = None

    @property
    def nlls(self) -> list[float]:
        """Per-sample per-token NLLs (NaN where a sample has no token)."""
        return [s / t if t else math.nan for s, t in zip(self.nll_sum, self.num_tokens, strict=True)]

    def samples(self) -> RunSamples:
        return RunSamples(self.nll_sum, self.num_tokens, self.entropies, self.entropy)

    def scores(self) -> dict:
        return {"gen_ppl": self.gen_ppl, "entropy": self.entropy}

    @classmethod
    def from_evaluation(cls, result: Mapping) -> BankRun:
        """From [`evaluate_samples`]' result."""
        per_sample = result["per_sample"]
        return cls(
            float(result["gen_ppl"]),
            result["entropy"],
            [float(r["nll_sum"]) for r in per_sample],
            [float(r["num_tokens"]) for r in per_sample],
            [r.get("entropy") for r in per_sample],
        )

    def to_json(self) -> dict:
        return {
            "gen_ppl": self.gen_ppl,
            "entropy": self.entropy,
            "nll_sum": self.nll_sum,
            "num_tokens": self.num_tokens,
            "entropies": self.entropies,
        }

    @classmethod
    def from_json(cls, record: Mapping) -> BankRun:
        return cls(**{key: record[key] for key in ("gen_ppl", "entropy", "nll_sum", "num_tokens", "entropies")})
