"""A whole benchmark report as one record ([`Report`]): its settings, its samplers' specs and coefficients, its runs,
its aggregates and diversity curves, its equal-entropy readings, the knob tuning, a rescoring's evaluator control
and where its runs came from. [`Report.from_json`] reads a report's JSON (`<model>.json`); what renders a report
([`format_markdown`]) reads this record.

The samplers' specs stay the JSON mappings the report holds (`{name: spec}`).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..evaluation.aggregates import Aggregates, DiversityCurves, curves_from_json
from .control_records import EvaluatorControl
from .equal_entropy_records import EqualEntropy, Frontiers, equal_entropy_from_json
from .provenance import Provenance
from .records import RunRecord, report_records
from .report_settings import ReportSettings
from .tuning_records import KnobTuning


# `{sampler: {nfe: {coefficient: value}}}`: η_R, η_T, η_O, α and, where `untied-sc tune` stored one, the knob.
Coefficients = Mapping[str, Mapping[int, Mapping[str, float]]]


@dataclass(frozen=True)
class Report:
    """
    A benchmark report.

    Args:
        settings ([`ReportSettings`]): what ran and how.
        samplers (`Mapping[str, Mapping]`): each sampler's spec, as the report holds it.
        coefficients (`Coefficients`): the untied samplers' coefficients per NFE (empty where none are recorded).
        runs (`Sequence[RunRecord]`): the scored runs.
        aggregates ([`Aggregates`]): the main runs' aggregates.
        diversity_curves (`DiversityCurves`): the swept samplers' GenPPL–entropy curves.
        equal_entropy (`EqualEntropy`): each sampler against the baseline's curve at its entropy.
        frontiers ([`Frontiers`], *optional*): each sampler on its own frontier (every sampler swept).
        knob_tuning ([`KnobTuning`], *optional*): the knobs chosen on the tuning bank.
        evaluator_control ([`EvaluatorControl`], *optional*): a rescoring's control.
        provenance ([`Provenance`]): where the runs came from.
    """

    settings: ReportSettings
    samplers: Mapping[str, Mapping]
    coefficients: Coefficients
    runs: Sequence[RunRecord]
    aggregates: Aggregates
    diversity_curves: DiversityCurves
    equal_entropy: EqualEntropy
    frontiers: Frontiers | None
    knob_tuning: KnobTuning | None
    evaluator_control: EvaluatorControl | None
    provenance: Provenance

    @classmethod
    def from_json(cls, data: Mapping) -> "Report":
        knob = data["diversity_knob"]
        coefficients = {
            sampler: {int(nfe): values for nfe, values in by_nfe.items()}
            for sampler, by_nfe in (data.get("coefficients") or {}).items()
        }
        tuning, frontiers, control = (data.get(key) for key in ("knob_tuning", "frontiers", "evaluator_control"))
        return cls(
            ReportSettings.from_json(data),
            data["samplers"],
            coefficients,
            report_records(data),
            Aggregates.from_json(data["aggregates"]),
            curves_from_json(data.get("diversity_curves") or {}, knob),
            equal_entropy_from_json(data.get("equal_entropy") or {}),
            Frontiers.from_json(frontiers) if frontiers else None,
            KnobTuning.from_json(tuning) if tuning else None,
            EvaluatorControl.from_json(control) if control else None,
            Provenance.from_json(data),
        )
