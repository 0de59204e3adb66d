"""Loads this folder with `diffusers.DiffusionPipeline.from_pretrained(folder, trust_remote_code=True)`.

The pipeline classes live in the untied-sc package (`pip install untied-sc`); this file only re-exports them.
"""

from untied_sc.pipelines import ELFPipeline, LangFlowPipeline  # noqa: F401
