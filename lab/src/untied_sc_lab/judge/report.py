"""The judge score report: `<name>.json` (the [`score_verdicts`] result, a [`JudgeScore`]) and `<name>.md` (its
tables)."""

import json
import os
from dataclasses import dataclass
from pathlib import Path

from .records import Estimate, JudgeScore


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _percent_ci(ci) -> str:
    return "n/a" if ci is None else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def _estimate_row(label: str, estimate: Estimate) -> str:
    return f"| {label} | {_percent(estimate.value)} | {_percent_ci(estimate.ci)} |"


def format_markdown(result: JudgeScore, title: str | None = None) -> str:
    """The report as Markdown: outcomes, Arena score, verdict counts, exclusions and the protocol's definitions."""
    candidate, baseline = result.candidate, result.baseline
    knobs = ", ".join(f"{k} {v}" for k, v in result.knobs.items())
    boot = result.bootstrap
    level = f"{100 * boot.confidence:g}%"
    arena, arena_ci = result.arena_score.value, result.arena_score.ci
    title = title or f"Pairwise judge: {candidate} vs {baseline}, {result.nfe} NFE"
    position = result.position
    lines = [
        f"# {title}",
        "",
        f"- Candidate **{candidate}** vs baseline **{baseline}** at {result.nfe} NFE"
        + (f" ({knobs})" if knobs else "")
        + f"; judge: {', '.join(result.judges) or 'not recorded'}.",
        f"- {result.num_pairs_scored} of {result.num_pairs} pairs scored, each judged in both presentation "
        f"orders ({result.num_observations} observations); {result.num_pairs_unparseable} pairs left out for an "
        f"unparseable verdict ({result.num_unparseable} presentations), {result.num_pairs_missing} for a "
        "missing one.",
        "",
        f"| statistic | value | {level} CI |",
        "|---|---:|---:|",
        f"| Arena score | {arena:.1f} | "
        + ("n/a" if arena_ci is None else f"[{arena_ci[0]:.1f}, {arena_ci[1]:.1f}]")
        + " |",
        _estimate_row("win rate (non-tie pairs)", result.win_rate_non_tie),
        _estimate_row(f"wins ({result.wins})", result.win_rate),
        _estimate_row(f"ties ({result.ties})", result.tie_rate),
        _estimate_row(f"losses ({result.losses})", result.loss_rate),
        "",
        "Verdicts of the scored pairs, read from the candidate's side (both presentations):",
        "",
        "| " + " | ".join(result.verdicts) + " |",
        "|" + "---:|" * len(result.verdicts),
        "| " + " | ".join(str(count) for count in result.verdicts.values()) + " |",
        "",
        f"Position: A preferred {position.a_preferred}, B preferred {position.b_preferred}, tie {position.tie} times.",
        "",
        'Definitions (paper, App. "Pairwise LLM-judge evaluation protocol"): a significant verdict (≫) is three '
        'binary observations of "the candidate is better", a slight one (>) or a tie (0.5) one. A pair merges its two '
        "presentations: a win if its observations' mean exceeds 0.5, a loss below 0.5, a tie otherwise. Arena score = "
        "100 × the mean of all observations; win rate = wins / (wins + losses). Intervals: percentile, "
        f"{boot.num_resamples:,} bootstrap resamples of pairs (seed {boot.seed}).",
    ]
    if result.unparseable_ids:
        lines += ["", f"Unparseable presentations: {', '.join(result.unparseable_ids)}."]
    if result.missing_ids:
        shown = result.missing_ids[:20]
        more = len(result.missing_ids) - len(shown)
        lines += ["", f"Unjudged presentations: {', '.join(shown)}" + (f" and {more} more." if more else ".")]
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class ReportPaths:
    """The two files of a score report: its record (`.json`) and its tables (`.md`)."""

    json: Path
    md: Path


def write_report(
    result: JudgeScore, output_dir: str | os.PathLike, name: str, overwrite: bool = False, title: str | None = None
) -> ReportPaths:
    """Writes `<output_dir>/<name>.json` and `.md`; raises `FileExistsError` if either exists and not `overwrite`."""
    folder = Path(output_dir)
    paths = ReportPaths(folder / f"{name}.json", folder / f"{name}.md")
    existing = [str(path) for path in (paths.json, paths.md) if path.exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"{', '.join(existing)} exist(s); pass --overwrite to replace, or choose another --name."
        )
    folder.mkdir(parents=True, exist_ok=True)
    paths.json.write_text(json.dumps(result.to_json(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    paths.md.write_text(format_markdown(result, title), encoding="utf-8")
    return paths
