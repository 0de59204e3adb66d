"""Task metrics of the conditional ELF checkpoints: BLEU (translation) and ROUGE (summarisation), as the official code
computes them (`github.com/lillian039/ELF@pytorch_elf` `src/utils/metrics_utils.py`, lines 18-49).

- BLEU: sacreBLEU's corpus BLEU with one reference per hypothesis, `lowercase=True, use_effective_order=True`
  (`compute_bleu`, line 27), on the 0-100 scale.
- ROUGE-1/2/L: `rouge-score`'s F-measures with the Porter stemmer (`RougeScorer(["rouge1", "rouge2", "rougeL"],
  use_stemmer=True)`, line 32), scored as `score(reference, hypothesis)`, ×100 and averaged over the pairs, with the
  population standard deviation and its standard error (`_mean_std_sem`, lines 18-23).

Both packages are the lab's `tasks` extra (`pip install "untied-sc-lab[tasks]"`); an error says so when one is missing.
"""

import math
import statistics
from dataclasses import dataclass


ROUGE_TYPES = ("rouge1", "rouge2", "rougeL")


def _import(module: str, package: str):
    import importlib

    try:
        return importlib.import_module(module)
    except ImportError:
        raise ImportError(
            f"The task metrics need {package}: `pip install 'untied-sc-lab[tasks]'` (or `pip install {package}`)."
        ) from None


def _check_pairs(hypotheses: list[str], references: list[str]) -> None:
    for name, texts in (("hypotheses", hypotheses), ("references", references)):
        if isinstance(texts, str) or not all(isinstance(text, str) for text in texts):
            raise TypeError(f"{name} must be a list of strings (one per sample), got {type(texts).__name__}.")
    if len(hypotheses) != len(references):
        raise ValueError(
            f"Got {len(hypotheses)} hypotheses but {len(references)} references: give one reference per generated "
            "text, in the same order."
        )
    if not hypotheses:
        raise ValueError("No pairs to score: give at least one hypothesis and its reference.")


def corpus_bleu(hypotheses: list[str], references: list[str]) -> float:
    """sacreBLEU's corpus BLEU (0-100) of `hypotheses` against one reference each, with the official options
    (`lowercase=True, use_effective_order=True`)."""
    _check_pairs(hypotheses, references)
    sacrebleu = _import("sacrebleu", "sacrebleu")
    return float(sacrebleu.corpus_bleu(hypotheses, [references], lowercase=True, use_effective_order=True).score)


@dataclass(frozen=True)
class RougeScores:
    """
    ROUGE F-measures ×100 over the pairs.

    Args:
        mean: the mean of each of `rouge1`, `rouge2`, `rougeL`.
        std: the population standard deviation of each (0 for one pair).
        sem: the standard error std/√n of each (0 for one pair).
        count: the number of pairs.
    """

    mean: dict[str, float]
    std: dict[str, float]
    sem: dict[str, float]
    count: int


def rouge(hypotheses: list[str], references: list[str]) -> RougeScores:
    """ROUGE-1/2/L F-measures of each (reference, hypothesis) pair with the Porter stemmer, ×100, with their mean,
    population standard deviation and standard error, as the official `compute_rouge`."""
    _check_pairs(hypotheses, references)
    rouge_scorer = _import("rouge_score.rouge_scorer", "rouge-score")
    scorer = rouge_scorer.RougeScorer(list(ROUGE_TYPES), use_stemmer=True)
    values: dict[str, list[float]] = {name: [] for name in ROUGE_TYPES}
    for hypothesis, reference in zip(hypotheses, references, strict=True):
        scores = scorer.score(reference, hypothesis)
        for name in ROUGE_TYPES:
            values[name].append(scores[name].fmeasure * 100)
    n = len(hypotheses)
    mean = {name: sum(v) / n for name, v in values.items()}
    std = {name: statistics.pstdev(v) if n > 1 else 0.0 for name, v in values.items()}
    sem = {name: std[name] / math.sqrt(n) if n > 1 else 0.0 for name in ROUGE_TYPES}
    return RougeScores(mean, std, sem, n)
