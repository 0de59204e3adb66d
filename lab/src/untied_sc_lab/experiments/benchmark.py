"""Compatibility shim: the matched benchmark (`untied-sc benchmark`) now lives in one module per job.

- `experiments.py`: the sampler sets (`--experiment` main, placement, components, sensitivity, baselines;
  `--coefficients` presets): `experiment_samplers`, `with_preset`, `normalise_samplers`, `experiment_name`, `BASELINE`;
- `sweep.py`: the matched generation sweep over NFE × seeds × samplers and its scoring: `run_sweep`,
  `generate_sweep`, `score_sweep`, `DEFAULT_NFE`, `DEFAULT_SEEDS`;
- `generation_files.py`: a generation between the sampling and the scoring machine: `write_generation`,
  `read_generation`, `read_generations`, `merge_generations`;
- `aggregation.py`: the statistics of a scored sweep: `analyse`, `aggregate`, `genppl_ratio_ci`, `run_clusters`,
  `diversity_curves`, `gen_ppl_at_entropy`, `equal_entropy_comparison`, `AGGREGATED_METRICS`;
- `report.py`: the report files: `write_results`, `format_markdown`, `entropy_label`, `interval_label`;
- `cli.py`: the `benchmark` command beside `evaluate`: `register_benchmark_command`, `add_benchmark_arguments`,
  `benchmark_command`, `benchmark_command_line`;
- `sampling.py`: seeding and schedulers by sampler spec, shared with `untied-sc tune` (`tuning_seeds` among them);
- `baselines.py`: `--experiment baselines`' checks and knob tuning before the sweep (`tune_baselines`);
  `baseline_generation.py`: the same split across a sampling and a scoring machine.

Import from those modules; the names below are re-exported so that `from untied_sc_lab.experiments.benchmark import …`
keeps working.
"""

from .aggregation import (
    AGGREGATED_METRICS,
    aggregate,
    analyse,
    diversity_curves,
    equal_entropy_comparison,
    gen_ppl_at_entropy,
    genppl_ratio_ci,
    run_clusters,
)
from .cli import (
    SCORING_OPTIONS,
    SWEEP_DEFAULTS,
    add_benchmark_arguments,
    benchmark_command,
    register_benchmark_command,
)
from .cli import benchmark_command_line as command_line
from .definitions import BASELINE, DEFAULT_SAMPLERS, SENSITIVITY_FACTORS, experiment_samplers, with_preset
from .definitions import experiment_name as _experiment_name
from .generation_files import GENERATION_FORMAT, read_generation, write_generation
from .report import entropy_label, format_markdown, interval_label, write_results
from .sweep import (
    DEFAULT_NFE,
    DEFAULT_SEEDS,
    PER_SAMPLE_KEYS,
    generate_sweep,
    run_sweep,
    score_sweep,
)


__all__ = [
    "AGGREGATED_METRICS",
    "BASELINE",
    "DEFAULT_NFE",
    "DEFAULT_SAMPLERS",
    "DEFAULT_SEEDS",
    "GENERATION_FORMAT",
    "PER_SAMPLE_KEYS",
    "SCORING_OPTIONS",
    "SENSITIVITY_FACTORS",
    "SWEEP_DEFAULTS",
    "_experiment_name",
    "add_benchmark_arguments",
    "aggregate",
    "analyse",
    "benchmark_command",
    "command_line",
    "diversity_curves",
    "entropy_label",
    "equal_entropy_comparison",
    "experiment_samplers",
    "format_markdown",
    "gen_ppl_at_entropy",
    "generate_sweep",
    "genppl_ratio_ci",
    "interval_label",
    "read_generation",
    "register_benchmark_command",
    "run_clusters",
    "run_sweep",
    "score_sweep",
    "with_preset",
    "write_generation",
    "write_results",
]
