"""Generation: the samplers a run builds from a pipeline and a sampler spec, the batched sampling with its seeds, the
checks a run makes before any sampling and the samples files it writes (`untied-sc generate`: `cli_generate.py`)."""

from ..lazy_imports import lazy_attributes


# Imported on first access: the command line's parser imports this package and must not load torch.
__getattr__, __dir__, __all__ = lazy_attributes(
    __name__,
    {
        ".checks": ("check_ace_statistics", "check_runs", "refuse_leaked_seeds"),
        ".repetition": ("word_ngrams", "word_repetition"),
        ".samples": ("PROVENANCE_KEYS", "RUN_KEYS", "SAME_SAMPLES_AS", "Sample", "read_samples", "write_samples"),
        ".sampler_spec": ("CALL_KEYS", "KNOBS_KEY", "SamplerSpec"),
        ".sampling": (
            "MIN_INDEPENDENT_CLUSTERS",
            "batch_seed",
            "build_scheduler",
            "diversity_knob",
            "family_of",
            "generate",
            "generator_ids",
            "independent_clusters",
            "resampling_clusters",
            "resampling_unit",
            "run_samples",
            "tokenizer_description",
            "tuning_seeds",
            "warn_few_clusters",
        ),
    },
)
