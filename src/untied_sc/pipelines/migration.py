"""Rewriting a pipeline folder saved in the old sampler-statistics layout (format 1) in the current one; the in-memory
step is `untied_sc.calibration.migrate.migrate_pipeline`, which calibration and tuning also run."""

import json
import os
from pathlib import Path

from ..calibration.migrate import migrate_pipeline
from ..input_checks import check_writes_stay_inside, pipeline_writes
from .loading import load_pipeline, save_sampler_statistics


def migrate_folder(
    source: str | os.PathLike, output: str | os.PathLike | None = None, overwrite: bool = False
) -> Path:
    """
    Rewrites a local pipeline folder in the current layout: `sampler_statistics/` and `scheduler/scheduler_config.json`
    only (the weights and tokenizer stay byte for byte). In place needs `overwrite=True`; with `output`, the whole
    pipeline is saved there (a new folder).
    """
    source = Path(source)
    if output is None and not overwrite:
        raise FileExistsError(
            f"Migrating {source} in place rewrites its sampler_statistics/ and scheduler/ config: pass --overwrite, "
            "or --output NEW_FOLDER to write a migrated copy."
        )
    if output is not None and Path(output).exists():
        raise FileExistsError(f"{output} exists; choose a new folder (nothing was written).")
    if output is None:
        check_writes_stay_inside(source, pipeline_writes(source), "`untied-sc migrate`")
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
