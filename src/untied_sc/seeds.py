"""Which generator draws which batch: one seed space per purpose, disjoint by construction.

Every batch the package samples for a measurement is drawn from `torch.Generator().manual_seed(g)` with

    g = generator_seed(space, seed, b) = SPACE_OFFSETS[space] + 1_000_003 · seed + b

for batch b of stream `seed` of a space. The offsets are 2⁵⁶ apart and the benchmark's is 0, so a benchmark batch's
seed is `1_000_003 · s + b`. With 0 ≤ seed < MAX_STREAM and 0 ≤ b < BATCH_STRIDE (both
checked), 1_000_003 · seed + b < 2⁵⁶: two spaces never share a generator, whatever seeds the commands are given. So a
calibration, a tuning bank or an ACE estimation can never draw the batches a benchmark evaluates on, and the
benchmark's default seeds (0, 1, 2) are safe after `pipe.calibrate(..., seed=0)`.

The spaces and the streams of one command-line seed s:
- `benchmark`: `untied-sc benchmark --seeds`, `untied-sc generate --seed`: stream s;
- `calibration`: `untied-sc calibrate --seed`: bank B_μ stream 2s, bank B_σ stream 2s + 1;
- `base_scales`: ELF's response-Gram bank of the same calibration: stream s;
- `tuning`: `untied-sc tune --seed`: stream s;
- `ace`: ACE's offline estimation: stream s.

A record that names no space (a plain list of seeds, a tuning record without `seed_space`: the bundled folders'
calibration banks 4000 and 4001 and 32- and 64-NFE tuning bank 10000) is in the benchmark space
([`DEFAULT_RECORD_SPACE`]), and the benchmark refuses those seeds.
"""

BATCH_STRIDE = 1_000_003
SPACE_WIDTH = 2**56
# The streams one space can hold: 1_000_003 · 2³⁶ ≈ 6.9e16 < 2⁵⁶ ≈ 7.2e16.
MAX_STREAM = 2**36
# The largest seed a user may give (a calibration seed s uses streams 2s and 2s + 1).
MAX_SEED = 2**32
SPACE_OFFSETS = {
    "benchmark": 0,
    "calibration": 1 * SPACE_WIDTH,
    "base_scales": 2 * SPACE_WIDTH,
    "tuning": 3 * SPACE_WIDTH,
    "ace": 4 * SPACE_WIDTH,
}
# The space of a record that names none (a plain list of calibration seeds, a tuning record without `seed_space`): the
# benchmark's, in which those banks were drawn (the bundled folders' calibration banks, seeds 4000 and 4001, and
# their 32- and 64-NFE tuning banks, seed 10000).
DEFAULT_RECORD_SPACE = "benchmark"


def check_seed(seed, option: str = "seed") -> int:
    """`seed` as an `int` in [0, MAX_SEED); otherwise a `ValueError` naming `option` and the valid range."""
    if isinstance(seed, bool) or not hasattr(seed, "__index__"):
        raise ValueError(f"{option} must be an integer, got {seed!r} ({type(seed).__name__}).")
    seed = int(seed)
    if not 0 <= seed < MAX_SEED:
        raise ValueError(f"{option} must lie in [0, 2**32), got {seed}.")
    return seed


def generator_seed(space: str, stream: int, batch_index: int) -> int:
    """The generator seed of batch `batch_index` of `stream` in `space` (see the module docstring)."""
    if space not in SPACE_OFFSETS:
        raise ValueError(f"Unknown seed space {space!r}; expected one of {sorted(SPACE_OFFSETS)}.")
    stream, batch_index = int(stream), int(batch_index)
    if not 0 <= stream < MAX_STREAM:
        raise ValueError(f"A {space} seed must lie in [0, 2**36) to stay inside its seed space, got {stream}.")
    if not 0 <= batch_index < BATCH_STRIDE:
        raise ValueError(f"A batch index must lie in [0, {BATCH_STRIDE:,}), got {batch_index}.")
    return SPACE_OFFSETS[space] + BATCH_STRIDE * stream + batch_index


def streams_of_record(record) -> tuple[str, list[int]]:
    """(space, streams) of a calibration `seeds` entry or a tuning/ACE record: a list of seeds (in
    [`DEFAULT_RECORD_SPACE`]) or a mapping with `space` and `streams`."""
    if isinstance(record, dict):
        return str(record["space"]), [int(s) for s in record["streams"]]
    return DEFAULT_RECORD_SPACE, [int(s) for s in record]


def seeds_in_space(records, space: str) -> set[int]:
    """The streams of `space` among `records` (each read by [`streams_of_record`])."""
    used = set()
    for record in records:
        record_space, streams = streams_of_record(record)
        if record_space == space:
            used.update(streams)
    return used


def calibration_seeds(statistics) -> set[int]:
    """The benchmark seeds whose batches calibrated these statistics: the banks of NFEs whose `seeds` entry is a plain
    list (the benchmark space, `untied_sc.seeds.DEFAULT_RECORD_SPACE`); a mapping names the calibration space."""
    if statistics is None:
        return set()
    return seeds_in_space((statistics.config.get("seeds") or {}).values(), "benchmark")
