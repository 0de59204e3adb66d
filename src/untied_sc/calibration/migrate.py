"""Bringing a pipeline saved with the old sampler-statistics layout (format 1) to the current one.

Format 1 kept the per-NFE coefficients (as float32 buffers) and the tuning record inside `sampler_statistics`; they now
live in the scheduler config (`coefficients_by_steps`, `tuning_by_steps`), which says what runs. ELF folders also kept
the SC-CFG scale in the scheduler config; it is now the pipeline's (`model_index.json`). Old folders still load and
sample as before (the untied scheduler reads their coefficients with a `FutureWarning`); `untied-sc migrate` rewrites
them (`untied_sc.pipelines.migration.migrate_folder`).
"""

from diffusers.configuration_utils import FrozenDict


def migrate_pipeline(pipe) -> bool:
    """
    Brings `pipe` to the current layout in memory; `False` if it already had it. Moves the coefficients and tuning
    record of format-1 statistics into the scheduler config (values the scheduler config already holds for an NFE
    win: they were set after the statistics were saved), and ELF's SC-CFG scale from the scheduler config (where
    earlier versions kept it) to the pipeline config. Same seed and coefficients give the same samples before and
    after.
    """
    changed = False
    statistics = getattr(pipe, "sampler_statistics", None)
    if statistics is not None and statistics.is_legacy:
        migrated, coefficients, tuning = statistics.migrate()
        config = pipe.scheduler.config
        pipe.scheduler.register_to_config(
            coefficients_by_steps={**coefficients, **(config.get("coefficients_by_steps") or {})},
            tuning_by_steps={**tuning, **(config.get("tuning_by_steps") or {})},
        )
        pipe.register_modules(sampler_statistics=migrated)
        changed = True
    if "sc_cfg_scale" in pipe.scheduler.config and "sc_cfg_scale" in pipe.config:
        # The pipeline took the scheduler's value when it was built (`ELFPipeline.__init__`); drop the old copy.
        config = {key: value for key, value in pipe.scheduler.config.items() if key != "sc_cfg_scale"}
        pipe.scheduler._internal_dict = FrozenDict(config)
        changed = True
    return changed
