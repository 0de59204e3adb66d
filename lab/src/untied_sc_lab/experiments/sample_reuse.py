"""The samples of an earlier report, taken for the runs it already sampled (`benchmark --reuse-samples`).

Adding a temperature or a sampler to a report would otherwise sample every run again; on a CPU that is hours. A run
of the new sweep takes the earlier report's samples (and its sampling time) when the report holds the same run: the
same sampler under the same spec (its knobs at this NFE), the same untied coefficients, NFE, seed and knob value, and
the same matched-pair settings ([`SAMPLING_SETTINGS`]). What a report does not record (the weights, the device's
rounding) is checked by sampling the first batch of each lent sampler's first run again: its token ids must equal the
lent ones, or the run is refused, since pairs drawn by two machines are no longer matched.
"""

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from untied_sc.generation import KNOBS_KEY, Sample
from untied_sc.per_nfe import read_steps_table

from .score_reuse import read_report_runs


# What the lent runs and this sweep's must share, besides the run itself: another batch size or batch seed draws
# other samples, another tokenizer decodes other texts.
SAMPLING_SETTINGS = ("family", "pipeline_class", "generator_tokenizer", "num_samples", "batch_size", "batch_seed")


def spec_at(spec: Mapping, n: int) -> dict:
    """A sampler spec as it samples at NFE `n`: its settings and, for a tuned comparison sampler, its knobs there."""
    at_n = {key: value for key, value in spec.items() if key != KNOBS_KEY}
    if KNOBS_KEY in spec:
        at_n[KNOBS_KEY] = read_steps_table(spec[KNOBS_KEY], KNOBS_KEY).get(n)
    return at_n


@dataclass
class ReusableSamples:
    """An earlier report's runs by (sampler, NFE, seed, knob value): each run's spec at its NFE, coefficients,
    sampling seconds and samples; `lent` counts the runs taken and `checked` names the runs sampled again."""

    path: str
    settings: dict
    runs: dict[tuple, dict] = field(default_factory=dict)
    lent: int = 0
    checked: list[str] = field(default_factory=list)
    checked_samplers: set = field(default_factory=set)

    def record(self) -> dict:
        """What the report says of the lending."""
        return {"report": self.path, "runs": self.lent, "checked_runs": list(self.checked)}


def read_report_samples(path: str | os.PathLike) -> ReusableSamples:
    """Reads a benchmark report (`<model>.json`) and its samples file for [`generate_sweep`]'s `reuse_samples`."""
    report, runs = read_report_runs(path, "--reuse-samples", " Sample without --reuse-samples.")
    knob = report.get("diversity_knob", "temperature")
    reusable = ReusableSamples(str(path), {key: report.get(key) for key in SAMPLING_SETTINGS})
    coefficients = report.get("coefficients") or {}
    for record, samples in zip(report["runs"], runs, strict=True):
        sampler, n = record["sampler"], record["nfe"]
        reusable.runs[(sampler, n, record["seed"], record.get(knob))] = {
            "spec": spec_at(report["samplers"][sampler], n),
            "coefficients": read_steps_table(coefficients.get(sampler), "coefficients").get(n),
            "seconds": record["seconds"],
            "samples": samples,
        }
    return reusable


def check_settings(reusable: ReusableSamples, settings: Mapping) -> None:
    """Refuses a report sampled with other matched-pair settings than this sweep's (none of its runs could be lent)."""
    differ = [key for key in SAMPLING_SETTINGS if reusable.settings.get(key) != settings.get(key)]
    if differ:
        theirs = ", ".join(f"{key} {reusable.settings.get(key)!r} (here {settings.get(key)!r})" for key in differ)
        raise ValueError(
            f"--reuse-samples: {reusable.path} was sampled with {theirs}: none of its runs are this sweep's. Give a "
            "report of this pipeline, --num-samples and --batch-size, or leave --reuse-samples out."
        )


def lend_samples(
    reusable: ReusableSamples | None,
    run: tuple,
    spec: Mapping,
    coefficients: Mapping | None,
    sample_batch: Callable[[], list[Sample]],
) -> tuple[list[Sample], float] | None:
    """
    The earlier report's samples and sampling seconds of `run` (sampler, NFE, seed, knob value), or `None` when it
    does not hold that run with this `spec` at this NFE and these untied `coefficients`. The first run lent for each
    sampler is checked: `sample_batch()` draws its first batch here, which must equal the lent one.

    Raises:
        ValueError: the batch drawn here differs from the report's (another machine, weights or version drew it).
    """
    if reusable is None:
        return None
    earlier = reusable.runs.get(run)
    sampler, n = run[0], run[1]
    if earlier is None or earlier["spec"] != spec_at(spec, n) or earlier["coefficients"] != coefficients:
        return None
    if sampler not in reusable.checked_samplers:
        fresh = sample_batch()
        lent = earlier["samples"][: len(fresh)]
        if [(s.text, s.ids) for s in fresh] != [(s.text, s.ids) for s in lent]:
            raise ValueError(
                f"--reuse-samples: the first batch of {sampler} at NFE {n}, seed {run[2]}, sampled here, differs from "
                f"{reusable.path}'s: another machine, torch or weights drew that report, so its samples would not be "
                "matched with the ones drawn here. Sample without --reuse-samples."
            )
        reusable.checked_samplers.add(sampler)
        label = f"{sampler} at NFE {n}, seed {run[2]}" + (f", {run[3]}" if run[3] is not None else "")
        reusable.checked.append(label)
    reusable.lent += 1
    return list(earlier["samples"]), earlier["seconds"]
