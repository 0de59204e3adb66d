"""The lab's untied schedulers with the paper's ablation switches (docs/algorithm.md §3.6, §3.8), the direction
controls and the chained oracle of the untied step. The library builds these schedulers for a sampler spec that sets
an ablation switch: importing `untied_sc_lab` registers them (`untied_sc.untied_variants`)."""

from .schedulers import (
    ABLATION_SCHEDULERS,
    TRANSFORM_ASSIGNMENTS,
    AblationUntiedELFScheduler,
    AblationUntiedLangFlowScheduler,
    AblationUntiedMixin,
    ablation_scheduler_class,
    needs_ablation_scheduler,
)
