"""Evaluation: GenPPL under a causal LM evaluator (`elf` / `langflow` protocols), entropy, repetition, diversity,
throughput, and the statistics of matched comparisons (SPEC §6). It scores texts and token ids only."""

from .benchmark import (
    aggregate,
    format_markdown,
    generate_sweep,
    read_generation,
    run_sweep,
    score_sweep,
    write_generation,
    write_results,
)
from .evaluator import SMOLLM2_NAME, default_cache_dir, evaluator_context_size, load_evaluator
from .io import Sample, compare_results, evaluate_samples, read_samples, write_samples
from .metrics import (
    PROTOCOLS,
    GenerativePerplexity,
    SampleNLLs,
    distinct_n,
    elf_token_weights,
    generative_perplexity,
    mean_unigram_entropy,
    perplexity_from_nlls,
    retained_throughput,
    sample_nlls,
    samples_per_second,
    token_nlls,
    unigram_entropy,
    word_ngrams,
    word_repetition,
)
from .plots import plot_benchmark
from .statistics import (
    PairedComparison,
    bootstrap_ci,
    interpolated_ratio_ci,
    mean_and_standard_error,
    paired_comparison,
)
