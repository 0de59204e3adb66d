"""untied-sc's lab: experiments (matched sweeps, benchmarks, reports), evaluation (GenPPL, entropy, repetition, the
statistics of matched comparisons), tuning and search of the samplers' coefficients, diagnostics, the judge, the
paper's ablations and the bundled models' training. It imports only the public names of `untied_sc`.

Importing it registers the ablation schedulers ([`untied_sc_lab.ablations`]) with the library, which builds them for
a sampler spec that sets an ablation switch (named by class: registering loads no torch)."""

from untied_sc.families import ClassRef
from untied_sc.untied_variants import ABLATION_DEFAULTS, UntiedVariant, register_untied_variant


__version__ = "0.1.0.dev0"

register_untied_variant(
    UntiedVariant(
        name="ablations",
        switches=tuple(ABLATION_DEFAULTS),
        schedulers={
            "elf": ClassRef("untied_sc_lab.ablations", "AblationUntiedELFScheduler"),
            "langflow": ClassRef("untied_sc_lab.ablations", "AblationUntiedLangFlowScheduler"),
        },
    )
)
