"""Experiments on the samplers, the top floor over the metrics library (`untied_sc_lab.evaluation`), calibration and the
pipelines: matched sweeps (`benchmark`), the comparison samplers' experiment, sweeps split across machines (carried by a
run store), aggregation and reports, `untied-sc generate`, and the `evaluate` / `benchmark` command line."""

from untied_sc.lazy_imports import lazy_attributes


# Imported on first access: importing the package (e.g. for the command line's argument parser) loads nothing heavy.
__getattr__, __dir__, __all__ = lazy_attributes(
    __name__,
    {
        ".aggregation": ("aggregate", "genppl_ratio_intervals"),
        ".generation_record": ("Generation",),
        ".generate": ("generate_samples",),
        ".report": ("format_markdown", "write_results"),
        ".rescore": ("evaluator_control", "rescore_report"),
        ".stored_sweeps": ("read_stored_sweeps", "store_sweep"),
        ".sweep": ("generate_sweep", "run_sweep", "score_sweep"),
        ".sweep_parts": ("merge_generations",),
        ".sweep_settings": ("ScoringSettings", "SweepSettings", "TuningSettings"),
    },
)
