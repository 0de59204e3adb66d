"""`make demo`: official vs untied sampling at 8 steps on the bundled pipelines, with samples and metrics.

    python -m untied_sc_lab.demo [--artifacts hub_artifacts] [--steps 8] [--batch-size 8] [--seed 0] [--results DIR]

For every pipeline folder under `--artifacts` (each with a `model_index.json`): sample with the official scheduler
and with `UntiedSelfConditioningScheduler` (the folder's tuned coefficients, and the paper's closest preset) from the
same generator seed (so all start from the same latent and random stream), print the samples side by side, and score
them with the offline evaluator (SmolLM2-135M-Instruct, Q4_1 GGUF, in float32 as the committed benchmarks):
GenPPL, unigram entropy and Rep-4 under the model family's protocol. The summary tells apart the demo's own few
samples (a glimpse, no interval) and the verdict of the model's committed equal-entropy benchmark at that NFE (which
sampler did better, with its 95 % interval), found in `--results` or, by default, the `benchmarks/results` folder
beside the artifacts, in the working directory or in the source checkout.
"""

import argparse
import json
import sys
import textwrap
from pathlib import Path

import torch
from tqdm.auto import tqdm

from untied_sc.families import get_family
from untied_sc.generation import Sample
from untied_sc.pipelines import load_pipeline
from untied_sc.schedulers import UntiedSelfConditioningScheduler

from .evaluation import evaluate_samples, load_evaluator
from .evaluation.evaluator import describe_evaluator
from .experiments.equal_entropy_records import EqualEntropyRow, FrontierRow
from .experiments.report_record import Report


ENTROPY_IDS = {"elf": "evaluator", "langflow": "generator"}  # whose token ids each protocol's entropy counts


def find_pipelines(artifacts: Path) -> list[Path]:
    return sorted(index.parent for index in Path(artifacts).glob("*/model_index.json"))


def sample_both(pipe, steps: int, batch_size: int, seed: int, progress=None) -> dict:
    """Official, untied with the folder's coefficients, and untied with the paper's closest preset; same seed.
    `progress` (a tqdm bar, optional) is told each sampler's name as it starts."""
    official_scheduler = pipe.scheduler
    preset = get_family(pipe.family).require("default_preset", "The demo's preset comparison")
    overrides = {"official": None, "untied": {}, f"untied ({preset} preset)": {"coefficients": preset}}
    results = {}
    try:
        for name, config in overrides.items():
            if progress is not None:
                progress.set_postfix_str(f"sampling {name}")
            if config is not None:
                pipe.scheduler = UntiedSelfConditioningScheduler.from_config(official_scheduler.config, **config)
            generator = torch.Generator().manual_seed(seed)
            results[name] = pipe(batch_size=batch_size, num_inference_steps=steps, generator=generator)
            if progress is not None:
                progress.update()
    finally:
        pipe.scheduler = official_scheduler
    return results


EXPLANATION = """\
How to read the numbers:
  GenPPL   perplexity of the samples under the evaluator: lower reads as more fluent, but only at similar entropy
           (text that repeats itself also scores low), so read it beside the entropy.
  entropy  unigram entropy of the sample's tokens: its diversity (which tokenizer's ids is said on each line).
  Rep-4    share of repeated 4-grams, on words and on the generator's tokens (loops inside words show in the latter).
Each block starts from the same seed, so official and untied begin from the same latent and random stream."""


RESULTS = Path("benchmarks") / "results"


def results_candidates(artifacts: Path) -> list[Path]:
    """Where the committed benchmarks may be, in order: beside the artifacts folder (a checkout's `hub_artifacts`),
    in the working directory, in the source checkout this module runs from."""
    places = [
        Path(artifacts).resolve().parent / RESULTS,
        Path.cwd() / RESULTS,
        Path(__file__).resolve().parents[3] / RESULTS,
    ]
    return list(dict.fromkeys(places))


def find_results(artifacts: Path) -> Path | None:
    """The first of [`results_candidates`] that exists, or `None`."""
    return next((place for place in results_candidates(artifacts) if place.is_dir()), None)


def reference_scores(folder: Path, results: Path = RESULTS) -> dict | None:
    """The held-out text's scores for a bundled model (`benchmarks/results/<name>-quality.json`), for scale."""
    path = results / f"{folder.name}-quality.json"
    if not path.is_file():
        return None

    rows = json.loads(path.read_text()).get("rows", [])
    return next((row for row in rows if row.get("sampler") == "held-out reference text"), None)


def equal_entropy_verdict(folder: Path, steps: int, results: Path = RESULTS) -> str | None:
    """Which sampler did better, from the model's committed equal-entropy benchmark at `steps` (3 seeds × 128 pairs;
    `<name>-equal-entropy-<steps>-baselines.json`): untied's GenPPL ratio to official at official's entropy on its
    own frontier, or, where its frontier does not reach official's entropy, at its own entropy on official's curve.
    `None` when there is no such report."""
    path = results / f"{folder.name}-equal-entropy-{steps}-baselines.json"
    if not path.is_file():
        return None
    report = Report.from_json(json.loads(path.read_text()))
    frontier = report.frontiers.by_sampler.get("untied", {}).get(steps) if report.frontiers else None
    own = report.equal_entropy.get("untied", {}).get(steps)
    if _has_interval(frontier):
        row, where = frontier, "at official's entropy"
    elif _has_interval(own):
        row, where = own, f"at untied's own entropy ({own.entropy:.2f} nats; official's is lower)"
    else:
        return None
    low, high = row.ratio_ci
    verdict = "untied did better" if high < 1 else "official did better" if low > 1 else "no clear difference"
    settings = report.settings
    return (
        f"The benchmark at equal entropy ({path.name}, {len(settings.seeds)} seeds × {settings.num_samples} "
        f"pairs): untied's GenPPL is {row.ratio:.3f} of official's (95 % interval [{low:.3f}, {high:.3f}]) "
        f"{where}: {verdict}."
    )


def _has_interval(row: EqualEntropyRow | FrontierRow | None) -> bool:
    """A reading with a ratio and its interval (a frontier that misses the entropy, or too many resamples outside
    the curve, leave one or both `None`)."""
    return row is not None and row.ratio is not None and bool(row.ratio_ci)


def correction_off_note(pipe, steps: int) -> str | None:
    """Why the folder's untied block can equal the official one: its coefficients at `steps` switch the method off."""
    untied = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config)
    coefficients = untied.resolve_coefficients(steps)
    if coefficients["eta_r"] or coefficients["eta_t"]:
        return None
    return (
        f"The folder's coefficients at {steps} steps have η_R = η_T = 0: `untied-sc tune` kept the official sampler "
        "there (no setting beat it on the tuning bank for this model), so the 'untied' block equals the official one "
        "by construction; the preset block shows the method switched on."
    )


def glimpse_line(scored: dict) -> str:
    """The demo's own samples, each untied block against official: raw GenPPL ratio and both entropies."""
    official = scored["official"]
    parts = [
        f"{name} {scores['gen_ppl']:.1f} (×{scores['gen_ppl'] / official['gen_ppl']:.2f} official's, entropy "
        f"{scores['entropy']:.2f})"
        for name, scores in scored.items()
        if name != "official"
    ]
    return f"official GenPPL {official['gen_ppl']:.1f} (entropy {official['entropy']:.2f}) vs " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.splitlines()[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter
    )
    parser.add_argument("--artifacts", default="hub_artifacts", help="Folder of pipeline folders.")
    parser.add_argument("--steps", type=int, default=8, help="NFE of every sampler.")
    parser.add_argument("--batch-size", type=int, default=8, help="Samples per sampler.")
    parser.add_argument("--seed", type=int, default=0, help="Generator seed (the same for every sampler).")
    parser.add_argument("--evaluator", default="smollm2-135m", help="Evaluator name or folder.")
    parser.add_argument(
        "--dtype", default="float32", help="Evaluator dtype (float32: as the committed benchmarks; or auto, bfloat16)."
    )
    parser.add_argument(
        "--results",
        type=Path,
        default=None,
        help="Folder of the committed benchmarks (default: benchmarks/results beside the artifacts folder, in the "
        "working directory, or in the source checkout).",
    )
    parser.add_argument("--show", type=int, default=5, help="Samples printed per sampler.")
    args = parser.parse_args(argv)

    from diffusers.utils import logging as diffusers_logging

    loading_bars = diffusers_logging.is_progress_bar_enabled()
    diffusers_logging.disable_progress_bar()  # loading's bars: the demo shows one bar per model
    try:
        return _run(args)
    finally:
        if loading_bars:
            diffusers_logging.enable_progress_bar()


def _run(args: argparse.Namespace) -> int:
    folders = find_pipelines(Path(args.artifacts))
    if not folders:
        print(f"No pipeline folders (with model_index.json) under {args.artifacts}/.", file=sys.stderr)
        return 1
    results = args.results if args.results is not None else find_results(Path(args.artifacts))
    if results is None or not results.is_dir():
        looked = [args.results] if args.results is not None else results_candidates(Path(args.artifacts))
        results = None
        print(
            "No committed benchmarks found (looked in " + ", ".join(str(place) for place in looked) + "): the summary "
            "gives the demo's own samples only; pass --results benchmarks/results of a checkout for the verdicts."
        )
    print("Loading the evaluator (the first run converts its GGUF weights, about a minute)...", flush=True)
    evaluator = load_evaluator(args.evaluator, dtype=args.dtype)
    print(f"Evaluator: {describe_evaluator(args.evaluator, next(evaluator[0].parameters()).dtype)}")
    print(EXPLANATION)
    summary = []
    for folder in folders:
        pipe = load_pipeline(folder)
        pipe.set_progress_bar_config(disable=True)  # one bar per model below, not one per sampling loop
        protocol = get_family(pipe.family).require("protocol", "The demo's GenPPL scoring")
        print(f"\n=== {folder.name} ({type(pipe).__name__}), {args.steps} steps, seed {args.seed} ===")
        reference = reference_scores(folder, results) if results is not None else None
        if reference is not None:
            print(
                f"For scale: held-out text scores GenPPL {reference['gen_ppl']:.1f} under this evaluator "
                f"(evaluator-id entropy {reference['entropy_evaluator_ids']:.2f})."
            )
        note = correction_off_note(pipe, args.steps)
        if note:
            print(textwrap.fill(note, 118))
        with tqdm(total=6, desc=folder.name, leave=False, file=sys.stderr, dynamic_ncols=True) as progress:
            outputs = sample_both(pipe, args.steps, args.batch_size, args.seed, progress)
            scored = {}
            for name, output in outputs.items():
                progress.set_postfix_str(f"scoring {name}")
                samples = [Sample(text=t, ids=i.tolist()) for t, i in zip(output.texts, output.sequences, strict=True)]
                scored[name] = evaluate_samples(samples, evaluator=evaluator, protocol=protocol)
                progress.update()
        for name, output in outputs.items():
            scores = scored[name]
            print(
                f"\n--- {name} ({len(output.texts)} samples): GenPPL {scores['gen_ppl']:.1f}, unigram entropy "
                f"{scores['entropy']:.2f} ({protocol} protocol: {ENTROPY_IDS[protocol]} ids), word Rep-4 "
                f"{scores['rep_4']:.3f}, token Rep-4 {scores['token_rep_4']:.3f}"
            )
            for text in output.texts[: args.show]:
                print(textwrap.indent(textwrap.fill(text, 110), "  | "), end="\n\n")
        verdict = equal_entropy_verdict(folder, args.steps, results) if results is not None else None
        summary.append(
            f"{folder.name}:\n  These {args.batch_size} samples per sampler (a glimpse at their own entropies, no "
            f"interval): {glimpse_line(scored)}.\n  "
            + (
                verdict + " That measurement decides; a few samples at other entropies can read otherwise."
                if verdict
                else "No equal-entropy benchmark of this model at this NFE: compare GenPPL only at similar entropy."
            )
        )
    print(f"\n=== Summary ({args.steps} steps) ===")
    for line in summary:
        print(line)
    print("Benchmarks with paired confidence intervals over thousands of samples: docs/results.md.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
