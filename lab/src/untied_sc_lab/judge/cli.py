"""`untied-sc judge export | run | score`: the pairwise LLM-judge protocol on a benchmark samples file.

The top-level CLI registers it with `register_judge_command(commands)`.
"""

import argparse
import os
import sys
from pathlib import Path

from untied_sc.defaults import JUDGE_NUM_RESAMPLES


# Handlers import lazily, so that `--help` and the refusals that need no model run before torch loads.


def _parse_knobs(values: list[str] | None) -> dict:
    knobs = {}
    for value in values or []:
        name, sep, number = value.partition("=")
        if not sep:
            raise ValueError(f"--knob takes NAME=VALUE (e.g. temperature=0.9), got {value!r}.")
        try:
            knobs[name] = float(number)
        except ValueError as error:
            raise ValueError(f"--knob {value!r}: {number!r} is not a number.") from error
    return knobs


def _optional_float(value: str) -> float | None:
    return None if value.lower() == "none" else float(value)


def export_command(args: argparse.Namespace):
    from untied_sc.generation import read_samples

    from .export import export_presentations
    from .pairs import match_pairs

    knobs = _parse_knobs(args.knob)
    pairs = match_pairs(read_samples(args.samples), args.baseline, args.candidate, args.nfe, knobs)
    if args.max_pairs is not None:
        pairs = pairs[: args.max_pairs]
    paths = export_presentations(
        pairs,
        args.out,
        args.baseline,
        args.candidate,
        args.nfe,
        seed=args.seed,
        knobs=knobs,
        samples=str(args.samples),
        key_path=args.key,
        overwrite=args.overwrite,
    )
    print(
        f"Wrote {2 * len(pairs)} presentations of {len(pairs)} pairs to {paths.prompts} and their key to "
        f"{paths.key} (keep the key away from the judge)."
    )
    return paths


def run_command(args: argparse.Namespace):
    import json

    from .client import ChatClient
    from .prompt import load_template
    from .run import run_judge

    options = json.loads(args.extra_body) if args.extra_body else {}
    if not isinstance(options, dict):
        raise ValueError(f"--extra-body must be a JSON object, got {args.extra_body!r}.")
    if args.temperature is not None:
        options.update(temperature=args.temperature)
    if args.max_tokens is not None:
        options.update(max_tokens=args.max_tokens)
    client = ChatClient(
        args.endpoint,
        args.model,
        api_key=os.environ.get(args.api_key_env) or None,
        options=options,
        timeout=args.timeout,
        retries=args.retries,
        backoff=args.backoff,
    )
    summary = run_judge(
        args.prompts,
        args.out,
        client,
        template=load_template(args.prompt_file),
        cache=args.cache,
        concurrency=args.concurrency,
        overwrite=args.overwrite,
        progress=not args.no_progress,
    )
    print(
        f"Wrote {summary.num_presentations} verdicts to {summary.out} ({summary.num_requests} requests sent, "
        f"{summary.num_cached} from the cache {summary.cache})."
    )
    if summary.num_unparseable:
        print(
            f"{summary.num_unparseable} replies had no verdict tag (recorded as null, not guessed): "
            f"{', '.join(summary.unparseable_ids[:10])}{' ...' if summary.num_unparseable > 10 else ''}"
        )
    return summary


def score_command(args: argparse.Namespace):
    from dataclasses import replace

    from .export import read_key
    from .report import write_report
    from .score import score_verdicts
    from .verdicts import read_verdicts

    key = read_key(args.key)
    result = score_verdicts(
        key, read_verdicts(args.verdicts), num_resamples=args.num_resamples, confidence=args.confidence, seed=args.seed
    )
    if args.judge and not result.judges:
        result = replace(result, judges=(args.judge,))
    name = args.name or f"judge-{key.candidate}-vs-{key.baseline}-nfe{key.nfe}"
    paths = write_report(result, args.output_dir or Path(args.key).parent, name, overwrite=args.overwrite)
    low, high = result.arena_score.ci
    win_rate = result.win_rate_non_tie.value
    print(
        f"{result.candidate} vs {result.baseline} at {result.nfe} NFE over {result.num_pairs_scored} "
        f"pairs: {result.wins} wins, {result.ties} ties, {result.losses} losses; Arena score "
        f"{result.arena_score.value:.1f} [{low:.1f}, {high:.1f}]"
        + ("" if win_rate is None else f", wins {100 * win_rate:.1f}% of non-tie pairs")
    )
    if result.num_pairs_unparseable or result.num_pairs_missing:
        print(
            f"Left out: {result.num_pairs_unparseable} pairs with an unparseable verdict, "
            f"{result.num_pairs_missing} with an unjudged presentation."
        )
    print(f"Wrote {paths.json} and {paths.md}")
    return result


def _handle(handler):
    def run(args: argparse.Namespace):
        from .client import JudgeRequestError

        try:
            return handler(args)
        except (FileExistsError, JudgeRequestError) as error:
            hint = ""
            if isinstance(error, JudgeRequestError):
                hint = " Replies received so far are cached; run the same command again to resume."
            print(f"untied-sc judge {args.judge_command}: error: {error}{hint}", file=sys.stderr)
            raise SystemExit(2) from error

    return run


def register_judge_command(commands) -> argparse.ArgumentParser:
    """Registers `judge` (with `export`, `run`, `score`) on an `add_subparsers()` object and returns its parser."""

    judge = commands.add_parser(
        "judge", help="Pairwise LLM-judge protocol: export blinded pairs, ask a judge model, score the verdicts."
    )
    sub = judge.add_subparsers(dest="judge_command", required=True, help="The step of the protocol, in this order.")

    export = sub.add_parser(
        "export", help="Matched baseline/candidate pairs as blinded presentations (both orders) plus a key file."
    )
    export.add_argument("samples", help="Benchmark samples file (<report>.samples.jsonl.gz).")
    export.add_argument("--baseline", default="official", help="Sampler of the baseline side (default: official).")
    export.add_argument("--candidate", default="untied", help="Sampler of the candidate side (default: untied).")
    export.add_argument("--nfe", type=int, required=True, help="NFE of both sides.")
    export.add_argument(
        "--knob", action="append", metavar="NAME=VALUE", help="Diversity-knob run to pair (default: the main runs)."
    )
    export.add_argument("--max-pairs", type=int, help="Keep the first N pairs (file order).")
    export.add_argument("--seed", type=int, default=0, help="Seed of the shuffle and the ids (random.Random).")
    export.add_argument("--out", required=True, help="Folder for prompts.jsonl (and key.json unless --key).")
    export.add_argument("--key", help="Write the key here instead of <out>/key.json.")
    export.add_argument("--overwrite", action="store_true", help="Replace existing prompts/key files.")
    export.set_defaults(handler=_handle(export_command))

    run = sub.add_parser("run", help="Ask an OpenAI-compatible chat endpoint for every presentation's verdict.")
    run.add_argument("prompts", help="prompts.jsonl written by `judge export`.")
    run.add_argument("--endpoint", required=True, help="API base URL; requests go to <URL>/chat/completions.")
    run.add_argument("--model", required=True, help="Judge model name sent with every request.")
    run.add_argument("--out", required=True, help="Verdicts file to write (JSONL).")
    run.add_argument("--prompt-file", help="Judge prompt template (default: the packaged judge_prompt.txt).")
    run.add_argument("--api-key-env", default="OPENAI_API_KEY", help="Environment variable holding the API key.")
    run.add_argument(
        "--temperature",
        type=_optional_float,
        default=0.0,
        help="Sampling temperature sent (default 0; 'none': not sent, for models that refuse the field).",
    )
    run.add_argument("--max-tokens", type=int, help="max_tokens sent (default: the server's).")
    run.add_argument("--extra-body", help='Further request fields as JSON, e.g. \'{"reasoning_effort": "high"}\'.')
    run.add_argument("--cache", help="Reply cache file (default <out>.cache.jsonl).")
    run.add_argument("--concurrency", type=int, default=4, help="Requests in flight at once.")
    run.add_argument("--retries", type=int, default=6, help="Retries of a failed request.")
    run.add_argument("--backoff", type=float, default=2.0, help="First retry's wait in seconds (doubles each time).")
    run.add_argument("--timeout", type=float, default=600.0, help="Seconds one request may take.")
    run.add_argument("--overwrite", action="store_true", help="Write --out again if it exists.")
    run.add_argument("--no-progress", action="store_true", help="No progress bar.")
    run.set_defaults(handler=_handle(run_command))

    score = sub.add_parser(
        "score", help="Arena score, win rate and pair outcomes of verdict files, with bootstrap CIs."
    )
    score.add_argument("verdicts", nargs="+", help="Verdict files (JSONL from `judge run`, or 'ID VERDICT' lines).")
    score.add_argument("--key", required=True, help="key.json written by `judge export`.")
    score.add_argument("--output-dir", help="Folder of <name>.json/.md (default: the key's folder).")
    score.add_argument("--name", help="Report name (default judge-<candidate>-vs-<baseline>-nfe<N>).")
    score.add_argument(
        "--judge", help="Judge named in the report when the verdict files record none (e.g. hand-written verdicts)."
    )
    score.add_argument("--num-resamples", type=int, default=JUDGE_NUM_RESAMPLES, help="Paired bootstrap resamples.")
    score.add_argument("--confidence", type=float, default=0.95, help="Interval coverage.")
    score.add_argument("--seed", type=int, default=0, help="Seed of the bootstrap.")
    score.add_argument("--overwrite", action="store_true", help="Replace an existing report.")
    score.set_defaults(handler=_handle(score_command))
    return judge
