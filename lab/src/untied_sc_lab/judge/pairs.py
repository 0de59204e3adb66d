"""Matched (baseline, candidate) sample pairs: the two samplers' generations from the same latent.

Two samples of a benchmark samples file (`<report>.samples.jsonl.gz`, see [`untied_sc_lab.evaluation.io`]) are a pair
when they come from the two samplers at the same NFE, seed, batch, sample index and diversity-knob value: the same
initial latent and random stream, so the pair differs only by the sampler.
"""

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from untied_sc.generation import RUN_KEYS, Sample

from .records import PairOrigin


# The diversity knobs a benchmark records per sample (`None`: the main run).
KNOB_KEYS = tuple(key for key in RUN_KEYS if key not in ("sampler", "nfe", "seed"))


@dataclass(frozen=True)
class SamplePair:
    """One matched pair: where both samples come from ([`PairOrigin`]: seed, batch, index, NFE, knobs) and their
    texts."""

    origin: PairOrigin
    baseline: str
    candidate: str


def sample_knobs(sample: Sample) -> dict:
    """The diversity knobs set on `sample` (empty for a main-run sample)."""
    return {key: sample.extra[key] for key in KNOB_KEYS if sample.extra.get(key) is not None}


def _origin(sample: Sample, position: int) -> PairOrigin:
    index = sample.extra.get("index", position)
    return PairOrigin(sample.seed, sample.batch, index, sample.nfe, sample_knobs(sample))


def _by_origin(samples: Sequence[Sample], sampler: str) -> dict[tuple, tuple[PairOrigin, Sample]]:
    """`{origin's match key: (origin, sample)}` of one sampler's samples; a sample without `index` takes its position
    among the samples of its run (sampler, NFE, seed, knobs)."""
    positions: dict[tuple, int] = {}
    found: dict[tuple, tuple[PairOrigin, Sample]] = {}
    for sample in samples:
        if sample.sampler != sampler:
            continue
        run = (sample.nfe, sample.seed, tuple(sorted(sample_knobs(sample).items())))
        position = positions.get(run, 0)
        positions[run] = position + 1
        origin = _origin(sample, position)
        key = origin.match_key()
        if key in found:
            raise ValueError(
                f"Two {sampler!r} samples share seed {origin.seed}, batch {origin.batch}, index {origin.index}, NFE "
                f"{origin.nfe}: the file holds a run twice. Keep one copy."
            )
        found[key] = (origin, sample)
    return found


def match_pairs(
    samples: Sequence[Sample], baseline: str, candidate: str, nfe: int, knobs: Mapping | None = None
) -> list[SamplePair]:
    """The (baseline, candidate) pairs at `nfe` among `samples`, in the baseline's file order.

    Args:
        samples: the samples of a benchmark samples file (every run of it).
        baseline, candidate (`str`): the `sampler` values of the two sides (e.g. `"official"`, `"untied"`).
        nfe (`int`): the NFE both samples were drawn at.
        knobs (`Mapping`, *optional*): diversity-knob values to select (e.g. `{"temperature": 0.9}`); by default the
            main runs (no knob set).

    Returns:
        `list[SamplePair]`; samples of either side without a partner are left out.
    """
    knobs = dict(knobs or {})
    selected = [s for s in samples if s.nfe == nfe and sample_knobs(s) == knobs]
    samplers = sorted({str(s.sampler) for s in samples if s.nfe == nfe})
    for side in (baseline, candidate):
        if not any(s.sampler == side for s in selected):
            raise ValueError(
                f"No {side!r} sample at NFE {nfe} with knobs {knobs or 'unset (main run)'}; the file has samplers "
                f"{samplers} at that NFE and NFEs {sorted({s.nfe for s in samples if s.nfe is not None})}."
            )
    baseline_samples = _by_origin(selected, baseline)
    candidate_samples = _by_origin(selected, candidate)
    pairs = [
        SamplePair(origin, sample.text, candidate_samples[key][1].text)
        for key, (origin, sample) in baseline_samples.items()
        if key in candidate_samples
    ]
    if not pairs:
        raise ValueError(
            f"No {baseline!r} sample at NFE {nfe} has a {candidate!r} partner with the same seed, batch and index."
        )
    return pairs
