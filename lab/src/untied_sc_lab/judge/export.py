"""Blinded presentations of matched pairs: the prompts file a judge sees and the key that un-blinds it.

Each pair is presented twice with the answer order exactly reversed (baseline as A, then candidate as A), as in the
paper's protocol (App. "Pairwise LLM-judge evaluation protocol") and Arena-Hard-Auto's two games per question. The
2·n presentations are shuffled by `random.Random(seed)` (never the global RNG) and given opaque random ids.

Files (`export_presentations` writes both; keep the key away from the judge):

- `prompts.jsonl`: one presentation per line, `{"id", "answer_a", "answer_b"}`: nothing about sampler, NFE or pair;
- `key.json`: `{"format", "baseline", "candidate", "nfe", "knobs", "samples", "seed", "num_pairs", "pairs",
  "presentations"}`, where `pairs[i]` is pair i's origin (seed, batch, index, NFE, knobs) and
  `presentations[id] = {"pair": i, "candidate": "A" | "B"}` says on which side the candidate was shown.
"""

import json
import os
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from .pairs import SamplePair
from .records import JudgeKey, Presentation, Prompt, optional


KEY_FORMAT = "untied-sc judge key v1"
PROMPTS_NAME = "prompts.jsonl"
KEY_NAME = "key.json"


def _opaque_ids(count: int, rng: random.Random) -> list[str]:
    ids: list[str] = []
    seen = set()
    while len(ids) < count:
        identifier = f"{rng.getrandbits(48):012x}"
        if identifier not in seen:
            seen.add(identifier)
            ids.append(identifier)
    return ids


def blind_presentations(pairs: Sequence[SamplePair], seed: int = 0) -> tuple[list[Prompt], dict[str, Presentation]]:
    """The shuffled presentations of `pairs` and their key.

    Pair i gives two presentations: (A, B) = (baseline, candidate) and (A, B) = (candidate, baseline). They are
    shuffled together with `random.Random(seed)`, which also draws the 12-hex-digit ids.

    Returns:
        `(prompts, presentations)`: `prompts` the [`Prompt`]s in shuffled order; `presentations` maps each id to its
        [`Presentation`] (the pair, and the side the candidate is shown on).
    """
    rng = random.Random(seed)
    games = []
    for i, pair in enumerate(pairs):
        games.append((i, "B", pair.baseline, pair.candidate))
        games.append((i, "A", pair.candidate, pair.baseline))
    rng.shuffle(games)
    ids = _opaque_ids(len(games), rng)
    prompts = [Prompt(id_, a, b) for id_, (_, _, a, b) in zip(ids, games, strict=True)]
    presentations = {id_: Presentation(i, side) for id_, (i, side, _, _) in zip(ids, games, strict=True)}
    return prompts, presentations


@dataclass(frozen=True)
class ExportPaths:
    """The two files of an export: the prompts the judge sees and the key kept from it."""

    prompts: Path
    key: Path


def export_presentations(
    pairs: Sequence[SamplePair],
    out_dir: str | os.PathLike,
    baseline: str,
    candidate: str,
    nfe: int,
    seed: int = 0,
    knobs: dict | None = None,
    samples: str | None = None,
    key_path: str | os.PathLike | None = None,
    overwrite: bool = False,
) -> ExportPaths:
    """Writes `out_dir/prompts.jsonl` and the key (default `out_dir/key.json`) for `pairs` (see the module docstring).

    Raises `FileExistsError` when either file exists and `overwrite` is false.
    """
    folder = Path(out_dir)
    paths = ExportPaths(folder / PROMPTS_NAME, Path(key_path) if key_path else folder / KEY_NAME)
    existing = [str(path) for path in (paths.prompts, paths.key) if path.exists()]
    if existing and not overwrite:
        raise FileExistsError(f"{', '.join(existing)} exist(s); pass --overwrite to replace, or choose another --out.")
    prompts, presentations = blind_presentations(pairs, seed)
    key = JudgeKey(
        format=KEY_FORMAT,
        baseline=baseline,
        candidate=candidate,
        nfe=nfe,
        knobs=dict(knobs or {}),
        samples=samples,
        seed=seed,
        num_pairs=len(pairs),
        pairs=tuple(pair.origin for pair in pairs),
        presentations=presentations,
    )
    for path in (paths.prompts, paths.key):
        path.parent.mkdir(parents=True, exist_ok=True)
    with paths.prompts.open("w", encoding="utf-8") as handle:
        for prompt in prompts:
            handle.write(json.dumps(prompt.to_json(), ensure_ascii=False) + "\n")
    paths.key.write_text(json.dumps(key.to_json(), indent=1, ensure_ascii=False) + "\n", encoding="utf-8")
    return paths


def read_key(path: str | os.PathLike) -> JudgeKey:
    """Reads a key file written by [`export_presentations`], checking its format."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        raise ValueError(f"Cannot read the key file {path}: {error}") from error
    if not isinstance(data, Mapping) or optional(data, "format") != KEY_FORMAT:
        raise ValueError(f"{path} is not a judge key file (written by `untied-sc judge export`).")
    return JudgeKey.from_json(data, str(path))


def read_prompts(path: str | os.PathLike) -> list[Prompt]:
    """Reads a prompts file written by [`export_presentations`]: one [`Prompt`] per line."""
    prompts = []
    with Path(path).open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
            except json.JSONDecodeError as error:
                raise ValueError(f"{path}, line {number}: not JSON ({error}).") from error
            prompts.append(Prompt.from_json(data, f"{path}, line {number}"))
    ids = [prompt.id for prompt in prompts]
    if len(set(ids)) != len(ids):
        raise ValueError(f"{path} holds a presentation id twice.")
    return prompts
