"""Evaluation: GenPPL under a causal LM evaluator (`elf` / `langflow` protocols), entropy, repetition, diversity,
throughput, and the statistics of matched comparisons (docs/algorithm.md §6). It scores texts and token ids only."""

from .aggregation import aggregate
from .curves import FIT_DESCRIPTION, RunSamples, equal_entropy_ratio, gen_ppl_on_curve, monotone_cubic
from .evaluator import SMOLLM2_NAME, default_cache_dir, evaluator_context_size, load_evaluator
from .io import Sample, compare_results, evaluate_runs, evaluate_samples, read_samples, write_samples
from .metrics import (
    PROTOCOLS,
    GenerativePerplexity,
    SampleNLLs,
    distinct_n,
    elf_token_weights,
    generative_perplexity,
    longest_repeated_run,
    mean_unigram_entropy,
    perplexity_from_nlls,
    retained_throughput,
    sample_nlls,
    samples_per_second,
    token_distinct_n,
    token_ngrams,
    token_nlls,
    token_repetition,
    unigram_entropy,
    word_ngrams,
    word_repetition,
)
from .plots import plot_benchmark
from .report import format_markdown, write_results
from .sampling import batch_seed, generate, resampling_clusters, resampling_unit
from .statistics import (
    PairedComparison,
    bootstrap_ci,
    cluster_resample_weights,
    mean_and_standard_error,
    paired_comparison,
    percentile_interval,
)
from .sweep import generate_sweep, read_generation, run_sweep, score_sweep, write_generation
