"""Lets `diffusers.DiffusionPipeline.from_pretrained(repo_id, trust_remote_code=True)` load this component.

The class lives in the untied-sc package (`pip install untied-sc`); this file only re-exports it.
"""

from untied_sc.schedulers.scheduling_langflow import LangFlowScheduler  # noqa: F401
