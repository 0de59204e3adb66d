"""A report's headline computed again from its samples and checked against the report (`untied-sc evaluate
REPORT.samples.jsonl.gz`, [`compare_headlines`]) as one record, [`HeadlineCheck`]: the samplers' rows are the
evaluator control's [`HeadlineRatios`], the head to head's the frontiers' [`HeadToHead`].

`to_json` writes the `headline` of the file `untied-sc evaluate` writes, key for key in its order; NFEs are `int` in
memory. The file is written, never read back, so there is no `from_json` (a head to head's JSON keeps only the
numbers checked, too few to rebuild its record).
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from ..evaluation.aggregates import by_sampler_to_json
from .control_records import HeadlineRatios
from .equal_entropy_records import HeadToHead


# `{sampler: {nfe: HeadlineRatios}}`: each sampler's headline ([`headline_ratios`]).
Headlines = Mapping[str, Mapping[int, HeadlineRatios]]
# `{nfe: {"<sampler> vs <against>": HeadToHead}}`: the head to head at equal entropy ([`head_to_head_ratios`]).
HeadsToHead = Mapping[int, Mapping[str, HeadToHead]]

# The numbers of a head to head that the check compares, and all its JSON keeps of it.
HEAD_TO_HEAD_FIELDS = ("ratio", "ratio_ci")


def heads_to_json(heads: HeadsToHead) -> dict[str, dict[str, dict]]:
    """A head to head table as the check writes it: each pair's checked numbers, NFEs as strings."""
    return {
        str(nfe): {pair: {key: getattr(row, key) for key in HEAD_TO_HEAD_FIELDS} for pair, row in by_pair.items()}
        for nfe, by_pair in heads.items()
    }


@dataclass(frozen=True)
class HeadlineCheck:
    """
    A report's headline computed again, beside the report's own.

    Args:
        reading (`str`, *optional*): how the computed headline reads equal entropy (`"frontier"`, `"baseline
            curve"`; `None`: raw ratios only).
        by_sampler, reported ([`Headlines`]): each sampler's headline computed and as the report gives it.
        head_to_head, reported_head_to_head ([`HeadsToHead`]): the head to head computed and as the report gives it.
        max_relative_difference (`float`): the largest relative difference over every number both sides give.
        unmatched (`Sequence[Sequence[str]]`): the numbers one side only gives, each named by its path in the
            tables' JSON (sampler or `"head to head"`, NFE, …, field, position).
        reproduced (`bool`, *optional*): whether the report is reproduced; `None` where no report was scored by
            this evaluator, so there is nothing to check against.
        report (`str`, *optional*): the report checked against.
    """

    reading: str | None
    by_sampler: Headlines
    reported: Headlines
    head_to_head: HeadsToHead
    reported_head_to_head: HeadsToHead
    max_relative_difference: float
    unmatched: Sequence[Sequence[str]]
    reproduced: bool | None
    report: str | None = None

    def to_json(self) -> dict:
        return {
            "reading": self.reading,
            "by_sampler": by_sampler_to_json(self.by_sampler, HeadlineRatios.to_json),
            "reported": by_sampler_to_json(self.reported, HeadlineRatios.to_json),
            "head_to_head": heads_to_json(self.head_to_head),
            "reported_head_to_head": heads_to_json(self.reported_head_to_head),
            "max_relative_difference": self.max_relative_difference,
            "unmatched": [list(name) for name in self.unmatched],
            "reproduced": self.reproduced,
            "report": self.report,
        }
