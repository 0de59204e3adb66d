"""Evaluation, the metrics library: GenPPL under a causal LM evaluator (`elf` / `langflow` protocols), entropy,
repetition, diversity, throughput, the statistics of matched comparisons and the equal-entropy curves (docs/algorithm.md
§6). It scores texts and token ids only (the samples, their files and their batch seeds: `untied_sc.generation`); the
experiments built on it (sweeps, benchmarks, reports, their command line) live in `untied_sc_lab.experiments`, one
floor up."""

from untied_sc.lazy_imports import lazy_attributes


# Imported on first access: importing the package (e.g. for the command line's argument parser) loads nothing heavy.
__getattr__, __dir__, __all__ = lazy_attributes(
    __name__,
    {
        ".curves": (
            "FIT_DESCRIPTION",
            "EntropyRatio",
            "RunSamples",
            "equal_entropy_ratio",
            "gen_ppl_on_curve",
            "monotone_cubic",
        ),
        ".evaluator": ("SMOLLM2_NAME", "default_cache_dir", "evaluator_context_size", "load_evaluator"),
        ".io": ("compare_results", "evaluate_runs", "evaluate_samples"),
        ".metrics": (
            "PROTOCOLS",
            "GenerativePerplexity",
            "SampleNLLs",
            "distinct_n",
            "elf_token_weights",
            "generative_perplexity",
            "longest_repeated_run",
            "mean_unigram_entropy",
            "perplexity_from_nlls",
            "retained_throughput",
            "sample_nlls",
            "samples_per_second",
            "token_distinct_n",
            "token_ngrams",
            "token_nlls",
            "token_repetition",
            "unigram_entropy",
        ),
        ".plots": ("plot_benchmark",),
        ".task_metrics": ("RougeScores", "corpus_bleu", "rouge"),
        ".statistics": (
            "ClusterIntervals",
            "PairedComparison",
            "bootstrap_ci",
            "cluster_mean_intervals",
            "cluster_resample_weights",
            "headline_interval",
            "mean_and_standard_error",
            "paired_comparison",
            "percentile_interval",
            "ratio_difference_intervals",
            "student_t_quantile",
        ),
    },
)
