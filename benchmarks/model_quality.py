"""Is a bundled model a real language model? GenPPL of its samples next to held-out text and a unigram baseline.

    python benchmarks/model_quality.py hub_artifacts/langflow-small [--nfe 8 64] [--num-samples 256]

Under the offline evaluator (SmolLM2-135M-Instruct, Q4_1 GGUF) and the model family's GenPPL protocol, scores:
- `reference`: held-out corpus text (never trained on) cut into windows of the model's sequence length in the model's
  own tokens and decoded, so it has the samples' shape and the tokenizer's normalisation (ELF: lower case);
- `unigram`: windows of tokens drawn independently from the train split's unigram distribution, decoded;
- per NFE, the official sampler with self-conditioning (as trained), the official sampler with self-conditioning
  off (the network always gets the zero self-conditioning input), and the untied sampler (the folder's statistics).
Every sampler at one NFE draws batch b from `torch.Generator().manual_seed(seed * 1_000_003 + b)` (matched pairs).
Writes benchmarks/results/<model>-quality.json and .md, and every scored text in <model>-quality.samples.jsonl.gz (one
run per table row, named by its row), so `untied-sc evaluate` scores the table again; existing files are refused
unless --overwrite.
"""

import argparse
import json
import time
from pathlib import Path

import torch

from untied_sc import UntiedSelfConditioningScheduler
from untied_sc.generation import Sample, write_samples
from untied_sc.generation.sampling import build_scheduler, family_of, generate
from untied_sc.pipelines import load_pipeline
from untied_sc_lab.evaluation import evaluate_samples, load_evaluator
from untied_sc_lab.evaluation.evaluator import describe_evaluator
from untied_sc_lab.training.data import fixed_windows, load_split_tokens


SHOWN = 5  # samples per row kept whole in the JSON (the model card shows them)


def without_self_conditioning(scheduler):
    """The same scheduler, except that the network never receives a self-conditioning input (SC off)."""

    class NoSelfConditioning(type(scheduler)):
        def step(self, *args, **kwargs):
            output = super().step(*args, **kwargs)
            self.self_conditioning = None
            return output

    return NoSelfConditioning.from_config(scheduler.config)


def text_windows(pipe, split_file: Path, count: int, seed: int) -> list[str]:
    tokens = load_split_tokens(split_file, pipe.tokenizer)
    windows = fixed_windows(tokens, count, pipe.latent_shape[0], seed=seed)
    return pipe.tokenizer.batch_decode(windows, skip_special_tokens=family_of(pipe) == "elf")


def unigram_texts(pipe, train_file: Path, count: int, seed: int) -> list[str]:
    tokens = load_split_tokens(train_file, pipe.tokenizer)
    counts = torch.bincount(tokens.long(), minlength=len(pipe.tokenizer)).double()
    generator = torch.Generator().manual_seed(seed)
    length = pipe.latent_shape[0]
    ids = torch.multinomial(counts / counts.sum(), count * length, replacement=True, generator=generator)
    return pipe.tokenizer.batch_decode(ids.view(count, length), skip_special_tokens=family_of(pipe) == "elf")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("pipeline")
    parser.add_argument("--corpus-dir", default="data/corpus")
    parser.add_argument("--nfe", type=int, nargs="+", default=[8, 64])
    parser.add_argument("--num-samples", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--dtype", default="auto", choices=["auto", "float32", "bfloat16"], help="Evaluator dtype (auto: by the CPU)."
    )
    parser.add_argument("--output-dir", default="benchmarks/results")
    parser.add_argument("--overwrite", action="store_true", help="Replace the output files if they exist.")
    args = parser.parse_args()

    out = Path(args.output_dir)
    name = Path(args.pipeline.rstrip("/")).name
    outputs = [out / f"{name}-quality{suffix}" for suffix in (".json", ".md", ".samples.jsonl.gz")]
    existing = [str(path) for path in outputs if path.exists()]
    if existing and not args.overwrite:
        raise SystemExit(f"{', '.join(existing)} exist; pass --overwrite to replace them, or another --output-dir.")

    began = time.perf_counter()
    pipe = load_pipeline(args.pipeline)
    pipe.set_progress_bar_config(disable=True)
    family = family_of(pipe)
    evaluator = load_evaluator(dtype=args.dtype)
    dtype = str(evaluator[0].dtype).removeprefix("torch.")  # the one "auto" chose
    corpus = Path(args.corpus_dir)
    rows, stored = [], []

    def score(label: str, texts: list[str], ids=None, nfe=None, seconds=None) -> None:
        samples = [
            Sample(
                text=t,
                ids=None if ids is None else i,
                seed=args.seed,
                batch=None if nfe is None else index // args.batch_size,  # generated texts: the batch that drew it
                sampler=label,
                nfe=nfe,
            )
            for index, (t, i) in enumerate(zip(texts, ids or texts, strict=True))
        ]
        stored.extend(samples)
        result = evaluate_samples(samples, evaluator=evaluator, protocol=family)
        rows.append(
            {
                "sampler": label,
                "nfe": nfe,
                "gen_ppl": result["gen_ppl"],
                "entropy_evaluator_ids": result["entropy_evaluator_ids"],
                "entropy_generator_ids": result["entropy_generator_ids"],
                "rep_4": result["rep_4"],
                "distinct_2": result["distinct_2"],
                "example": texts[0][:300],
                "examples": texts[:SHOWN],  # unedited, for the model card's samples
                "sampling_seconds": seconds,
            }
        )
        print(
            f"{label:>28} {nfe or '':>3}  GenPPL {result['gen_ppl']:9.1f}  entropy(eval ids) "
            f"{result['entropy_evaluator_ids']:.3f}  | {texts[0][:100]!r}",
            flush=True,
        )

    score("held-out reference text", text_windows(pipe, corpus / "heldout.txt", args.num_samples, seed=args.seed))
    score("unigram baseline", unigram_texts(pipe, corpus / "train.txt", args.num_samples, seed=args.seed))
    official = pipe.scheduler
    samplers = {
        "official (SC on)": lambda n: build_scheduler(pipe, {"scheduler": "official"}, official.config, n),
        "official (SC off)": lambda n: without_self_conditioning(
            build_scheduler(pipe, {"scheduler": "official"}, official.config, n)
        ),
        "untied": lambda n: UntiedSelfConditioningScheduler.from_config(official.config),
    }
    try:
        for n in args.nfe:
            for label, make in samplers.items():
                pipe.scheduler = make(n)
                texts, ids, seconds = generate(pipe, n, args.seed, args.num_samples, args.batch_size)
                score(label, texts, ids, n, seconds)
    finally:
        pipe.scheduler = official

    results = {
        "model": name,
        "family": family,
        "evaluator": describe_evaluator("smollm2-135m", dtype),
        "num_samples": args.num_samples,
        "seed": args.seed,
        "rows": rows,
        "samples_file": outputs[2].name,
        "command": f"python benchmarks/model_quality.py {args.pipeline} --nfe {' '.join(map(str, args.nfe))} "
        f"--batch-size {args.batch_size} "
        f"--num-samples {args.num_samples} --seed {args.seed} --dtype {args.dtype}",
        "wall_seconds": time.perf_counter() - began,
    }
    out.mkdir(parents=True, exist_ok=True)
    outputs[0].write_text(json.dumps(results, indent=2) + "\n")
    write_samples(outputs[2], stored)
    lines = [
        f"# {name}: sample quality against held-out text and a unigram baseline",
        "",
        f"`{results['command']}` ({results['wall_seconds'] / 60:.1f} min on 2 CPU cores). Evaluator SmolLM2-135M "
        f"({dtype}), "
        f"{family} protocol, {args.num_samples} samples each; entropy = mean per-sample unigram entropy of the "
        "evaluator's ids (nats).",
        "",
        "| text | NFE | GenPPL | entropy | Rep-4 | distinct-2 |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['sampler']} | {row['nfe'] or ''} | {row['gen_ppl']:.1f} | {row['entropy_evaluator_ids']:.3f} "
            f"| {row['rep_4']:.3f} | {row['distinct_2']:.3f} |"
        )
    outputs[1].write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
