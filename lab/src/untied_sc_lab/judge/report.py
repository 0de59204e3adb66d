"""The judge score report: `<name>.json` (the [`score_verdicts`] result) and `<name>.md` (its tables)."""

import json
import os
from pathlib import Path


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _percent_ci(ci) -> str:
    return "n/a" if ci is None else f"[{100 * ci[0]:.1f}, {100 * ci[1]:.1f}]"


def format_markdown(result: dict, title: str | None = None) -> str:
    """The report as Markdown: outcomes, Arena score, verdict counts, exclusions and the protocol's definitions."""
    candidate, baseline = result["candidate"], result["baseline"]
    knobs = ", ".join(f"{k} {v}" for k, v in result.get("knobs", {}).items())
    boot = result["bootstrap"]
    level = f"{100 * boot['confidence']:g}%"
    arena_ci = result["arena_score_ci"]
    title = title or f"Pairwise judge: {candidate} vs {baseline}, {result['nfe']} NFE"
    lines = [
        f"# {title}",
        "",
        f"- Candidate **{candidate}** vs baseline **{baseline}** at {result['nfe']} NFE"
        + (f" ({knobs})" if knobs else "")
        + f"; judge: {', '.join(result['judges']) or 'not recorded'}.",
        f"- {result['num_pairs_scored']} of {result['num_pairs']} pairs scored, each judged in both presentation "
        f"orders ({result['num_observations']} observations); {result['num_pairs_unparseable']} pairs left out for an "
        f"unparseable verdict ({result['num_unparseable']} presentations), {result['num_pairs_missing']} for a "
        "missing one.",
        "",
        f"| statistic | value | {level} CI |",
        "|---|---:|---:|",
        f"| Arena score | {result['arena_score']:.1f} | "
        + ("n/a" if arena_ci is None else f"[{arena_ci[0]:.1f}, {arena_ci[1]:.1f}]")
        + " |",
        f"| win rate (non-tie pairs) | {_percent(result['win_rate_non_tie'])} | "
        f"{_percent_ci(result['win_rate_non_tie_ci'])} |",
        f"| wins ({result['wins']}) | {_percent(result['win_rate'])} | {_percent_ci(result['win_rate_ci'])} |",
        f"| ties ({result['ties']}) | {_percent(result['tie_rate'])} | {_percent_ci(result['tie_rate_ci'])} |",
        f"| losses ({result['losses']}) | {_percent(result['loss_rate'])} | {_percent_ci(result['loss_rate_ci'])} |",
        "",
        "Verdicts of the scored pairs, read from the candidate's side (both presentations):",
        "",
        "| " + " | ".join(result["verdicts"]) + " |",
        "|" + "---:|" * len(result["verdicts"]),
        "| " + " | ".join(str(count) for count in result["verdicts"].values()) + " |",
        "",
        f"Position: A preferred {result['position']['A_preferred']}, B preferred {result['position']['B_preferred']}, "
        f"tie {result['position']['tie']} times.",
        "",
        'Definitions (paper, App. "Pairwise LLM-judge evaluation protocol"): a significant verdict (≫) is three '
        'binary observations of "the candidate is better", a slight one (>) or a tie (0.5) one. A pair merges its two '
        "presentations: a win if its observations' mean exceeds 0.5, a loss below 0.5, a tie otherwise. Arena score = "
        "100 × the mean of all observations; win rate = wins / (wins + losses). Intervals: percentile, "
        f"{boot['num_resamples']:,} bootstrap resamples of pairs (seed {boot['seed']}).",
    ]
    if result["unparseable_ids"]:
        lines += ["", f"Unparseable presentations: {', '.join(result['unparseable_ids'])}."]
    if result["missing_ids"]:
        shown = result["missing_ids"][:20]
        more = len(result["missing_ids"]) - len(shown)
        lines += ["", f"Unjudged presentations: {', '.join(shown)}" + (f" and {more} more." if more else ".")]
    return "\n".join(lines) + "\n"


def write_report(
    result: dict, output_dir: str | os.PathLike, name: str, overwrite: bool = False, title: str | None = None
) -> dict[str, Path]:
    """Writes `<output_dir>/<name>.json` and `.md`; raises `FileExistsError` if either exists and not `overwrite`."""
    folder = Path(output_dir)
    paths = {"json": folder / f"{name}.json", "md": folder / f"{name}.md"}
    existing = [str(path) for path in paths.values() if path.exists()]
    if existing and not overwrite:
        raise FileExistsError(
            f"{', '.join(existing)} exist(s); pass --overwrite to replace, or choose another --name."
        )
    folder.mkdir(parents=True, exist_ok=True)
    paths["json"].write_text(json.dumps(result, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    paths["md"].write_text(format_markdown(result, title), encoding="utf-8")
    return paths
