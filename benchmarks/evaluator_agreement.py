"""GenPPL of held-out real text and of generated samples under several evaluators: does each see the same gap?

A sanity check of a second evaluator against the default: real text must score far lower than samples under both, and
the two should rank samples alike (Pearson correlation of per-sample NLL per token over the samples of all runs).

    python benchmarks/evaluator_agreement.py --heldout data/corpus/heldout.txt \\
        --samples benchmarks/results/langflow-small-baselines.samples.jsonl.gz --protocol langflow --num-samples 64 \\
        --output benchmarks/results/evaluator-agreement-langflow-small.json

Held-out windows are runs of whole words from `--heldout` (`--num-samples` of them at seeded random places), each as
long in characters as the samples are on average. Runs are read from the samples file by (sampler, NFE), first seed.
"""

import argparse
import json
import random
import shlex
import sys
import time
from pathlib import Path


def heldout_windows(path: Path, count: int, characters: int, seed: int) -> list[str]:
    """`count` windows of whole words of about `characters` characters each, from seeded random places in `path`."""
    words = path.read_text(encoding="utf-8").split()
    rng = random.Random(seed)
    windows = []
    for _ in range(count):
        start, text = rng.randrange(len(words)), []
        while len(" ".join(text)) < characters and start < len(words):
            text.append(words[start])
            start += 1
        windows.append(" ".join(text))
    return windows


def pearson(a: list[float], b: list[float]) -> float:
    mean_a, mean_b = sum(a) / len(a), sum(b) / len(b)
    covariance = sum((x - mean_a) * (y - mean_b) for x, y in zip(a, b, strict=True))
    spread = (sum((x - mean_a) ** 2 for x in a) * sum((y - mean_b) ** 2 for y in b)) ** 0.5
    return covariance / spread if spread else float("nan")


def main(argv=None) -> int:
    import torch

    from untied_sc.generation import read_samples
    from untied_sc_lab.evaluation.evaluator import describe_evaluator, load_evaluator
    from untied_sc_lab.evaluation.metrics import generative_perplexity

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--heldout", type=Path, required=True, help="Real text, e.g. data/corpus/heldout.txt.")
    parser.add_argument("--samples", type=Path, required=True, help="A samples file (a benchmark's).")
    parser.add_argument("--runs", nargs="+", default=["official:8", "untied:8"], help="SAMPLER:NFE runs to score.")
    parser.add_argument("--evaluators", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    parser.add_argument("--protocol", choices=["elf", "langflow"], default="langflow")
    parser.add_argument("--num-samples", type=int, default=64)
    parser.add_argument("--dtype", default="auto", help="The evaluators' dtype (auto: by the CPU).")
    parser.add_argument("--seed", type=int, default=0, help="Seed of the held-out windows' places.")
    parser.add_argument("--output", type=Path)
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args(argv)
    if args.output and args.output.exists() and not args.overwrite:
        raise SystemExit(f"{args.output} exists; pass --overwrite to replace it.")

    samples = read_samples(args.samples)
    texts = {}
    for run in args.runs:
        sampler, nfe = run.rsplit(":", 1)
        chosen = [s for s in samples if s.sampler == sampler and s.nfe == int(nfe)]
        if not chosen:
            raise SystemExit(f"{args.samples} holds no samples of sampler {sampler!r} at NFE {nfe}.")
        first_seed = chosen[0].seed
        texts[run] = [s.text for s in chosen if s.seed == first_seed][: args.num_samples]
    mean_characters = sum(len(t) for run in texts.values() for t in run) // sum(len(run) for run in texts.values())
    texts = {"held-out text": heldout_windows(args.heldout, args.num_samples, mean_characters, args.seed), **texts}

    results, per_sample = {}, {}
    for name in args.evaluators:
        model, tokenizer = load_evaluator(name, dtype=args.dtype)
        rows = {}
        for label, run in texts.items():
            began = time.perf_counter()
            scores = generative_perplexity(run, model, tokenizer, protocol=args.protocol)
            rows[label] = {
                "gen_ppl": scores.gen_ppl,
                "num_samples": len(run),
                "num_tokens": scores.num_tokens,
                "seconds": time.perf_counter() - began,
            }
            per_sample.setdefault(name, []).extend(
                scores.per_sample.mean_nll.tolist() if label != "held-out text" else []
            )
            print(f"{name:>14} {label:>16}: GenPPL {scores.gen_ppl:9.1f} over {scores.num_tokens} tokens", flush=True)
        results[name] = {"evaluator": describe_evaluator(name, model.dtype), "rows": rows}
        del model, tokenizer
    names = list(results)
    correlations = {
        f"{a} vs {b}": pearson(per_sample[a], per_sample[b]) for i, a in enumerate(names) for b in names[i + 1 :]
    }
    for key, value in correlations.items():
        print(f"per-sample NLL/token correlation over the samples, {key}: {value:.3f}")
    report = {
        "what": "GenPPL of held-out real text and of generated samples under each evaluator",
        "command": shlex.join(["python", "benchmarks/evaluator_agreement.py", *(argv or sys.argv[1:])]),
        "protocol": args.protocol,
        "samples_file": str(args.samples),
        "heldout": str(args.heldout),
        "torch": torch.__version__,
        "evaluators": results,
        "per_sample_nll_correlation": correlations,
    }
    if args.output:
        args.output.write_text(json.dumps(report, indent=2) + "\n")
        print(f"Wrote {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
