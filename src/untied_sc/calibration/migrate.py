"""Bringing a pipeline saved with the old sampler-statistics layout (format 1) to the current one.

Format 1 kept the per-NFE coefficients (as float32 buffers) and the tuning record inside `sampler_statistics`; they now
live in the scheduler config (`coefficients_by_steps`, `tuning_by_steps`), which says what runs. ELF folders also kept
the SC-CFG scale in the scheduler config; it is now the pipeline's (`model_index.json`). Old folders still load and
sample as before (the untied scheduler reads their coefficients with a `FutureWarning`); `untied-sc migrate` rewrites
them.
"""

import json
import os
from pathlib import Path

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
        raise ValueError(f"{source} already has the current layout; nothing to migrate.")
    if output is not None:
        pipe.save_pretrained(output)
        return Path(output)
    if getattr(pipe, "sampler_statistics", None) is not None:
        save_sampler_statistics(pipe, source)
    pipe.scheduler.save_config(source / "scheduler")
    index_path = source / "model_index.json"
    index = json.loads(index_path.read_text())
    settings = {key: value for key, value in pipe.config.items() if not key.startswith("_") and key not in index}
    settings = {key: value for key, value in settings.items() if not isinstance(value, list | tuple)}  # components
    if settings:  # pipeline settings that moved here (ELF's sc_cfg_scale)
        index_path.write_text(json.dumps({**index, **settings}, indent=2, sort_keys=True) + "\n")
    return source
