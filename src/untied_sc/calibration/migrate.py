"""Bringing a pipeline saved with the old sampler-statistics layout (format 1) to the current one.

Format 1 kept the per-NFE coefficients (as float32 buffers) and the tuning record inside `sampler_statistics`; they now
live in the scheduler config (`coefficients_by_steps`, `tuning_by_steps`), which says what runs. Old folders still load
and sample as before (the untied scheduler reads their coefficients with a `FutureWarning`); `untied-sc migrate`
rewrites them.
"""

import os
from pathlib import Path


def migrate_pipeline(pipe) -> bool:
    """
    Moves the coefficients and tuning record of `pipe`'s format-1 statistics into its scheduler config, in memory;
    `False` if there was nothing to migrate. Values the scheduler config already holds for an NFE win (they were set
    after the statistics were saved). Same seed and coefficients give the same samples before and after.
    """
    statistics = getattr(pipe, "sampler_statistics", None)
    if statistics is None or not statistics.is_legacy:
        return False
    migrated, coefficients, tuning = statistics.migrate()
    config = pipe.scheduler.config
    pipe.scheduler.register_to_config(
        coefficients_by_steps={**coefficients, **(config.get("coefficients_by_steps") or {})},
        tuning_by_steps={**tuning, **(config.get("tuning_by_steps") or {})},
    )
    pipe.register_modules(sampler_statistics=migrated)
    return True


def migrate_folder(
    source: str | os.PathLike, output: str | os.PathLike | None = None, overwrite: bool = False
) -> Path:
    """
    Rewrites a local pipeline folder in the current layout: `sampler_statistics/` and `scheduler/scheduler_config.json`
    only (the weights and tokenizer stay byte for byte). In place needs `overwrite=True`; with `output`, the whole
    pipeline is saved there (a new folder).
    """
    from ..pipelines import load_pipeline
    from ..pipelines.loading import save_sampler_statistics

    source = Path(source)
    if output is None and not overwrite:
        raise FileExistsError(
            f"Migrating {source} in place rewrites its sampler_statistics/ and scheduler/ config: pass --overwrite, "
            "or --output NEW_FOLDER to write a migrated copy."
        )
    if output is not None and Path(output).exists():
        raise FileExistsError(f"{output} exists; choose a new folder (nothing was written).")
    pipe = load_pipeline(source)
    if not migrate_pipeline(pipe):
        raise ValueError(f"{source} has no sampler statistics in the old layout; nothing to migrate.")
    if output is not None:
        pipe.save_pretrained(output)
        return Path(output)
    save_sampler_statistics(pipe, source)
    pipe.scheduler.save_config(source / "scheduler")
    return source
