"""The lab's untied schedulers with the paper's ablation switches (docs/algorithm.md §3.6, §3.8)."""

from .schedulers import (
    ABLATION_SCHEDULERS,
    TRANSFORM_ASSIGNMENTS,
    AblationUntiedELFScheduler,
    AblationUntiedLangFlowScheduler,
    AblationUntiedMixin,
    ablation_scheduler_class,
    needs_ablation_scheduler,
)
