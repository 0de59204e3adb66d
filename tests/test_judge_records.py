"""The judge's typed records: the committed judge files read into records and written back byte for byte, the
committed score report reproduced from its hand-written verdicts, and a missing field named with its record and file."""

import copy
import json
import re
from dataclasses import replace
from pathlib import Path

import pytest

from untied_sc_lab.judge import (
    CachedReply,
    ChatReply,
    JudgeKey,
    JudgeScore,
    PairOutcome,
    Prompt,
    RecordError,
    format_markdown,
    read_key,
    read_prompts,
    read_verdicts,
    score_verdicts,
    write_report,
)
from untied_sc_lab.judge.cache import ReplyCache


EXAMPLE = Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "judge" / "langflow-small-nfe8"
REPORT = EXAMPLE / "langflow-small-nfe8-by-hand"
HAND_JUDGE = "written by hand by the developer, not a judge model"


def _json_file(record) -> str:
    """A record written as the judge writes its JSON files."""
    return json.dumps(record.to_json(), indent=1, ensure_ascii=False) + "\n"


def _report_data() -> dict:
    return json.loads(REPORT.with_suffix(".json").read_text(encoding="utf-8"))


# ------------------------------------------------------------------------------------------------------ round trips


def test_the_committed_key_reads_into_records_and_writes_back_byte_for_byte():
    key = read_key(EXAMPLE / "key.json")
    assert (key.baseline, key.candidate, key.nfe, key.num_pairs, len(key.presentations)) == (
        "official",
        "untied",
        8,
        20,
        40,
    )
    assert key.pairs[3].index == 3 and key.pairs[3].knobs == {}
    assert {p.candidate for p in key.presentations.values()} == {"A", "B"}
    assert _json_file(key) == (EXAMPLE / "key.json").read_text(encoding="utf-8")


def test_the_committed_prompts_read_into_records_and_write_back_byte_for_byte():
    prompts = read_prompts(EXAMPLE / "prompts.jsonl")
    assert len(prompts) == 40 and all(isinstance(p, Prompt) for p in prompts)
    written = "".join(json.dumps(p.to_json(), ensure_ascii=False) + "\n" for p in prompts)
    assert written == (EXAMPLE / "prompts.jsonl").read_text(encoding="utf-8")


def test_the_committed_score_report_reads_into_a_record_and_renders_back_byte_for_byte():
    score = JudgeScore.from_json(_report_data(), str(REPORT))
    assert (score.wins, score.ties, score.losses, score.judges) == (9, 5, 6, (HAND_JUDGE,))
    assert score.arena_score.value == pytest.approx(61.36363636363637) and score.arena_score.ci[0] == 40.0
    assert all(isinstance(p, PairOutcome) and p.scored for p in score.per_pair)
    assert _json_file(score) == REPORT.with_suffix(".json").read_text(encoding="utf-8")
    assert format_markdown(score) == REPORT.with_suffix(".md").read_text(encoding="utf-8")


def test_scoring_the_committed_hand_verdicts_reproduces_the_committed_report(tmp_path):
    key = read_key(EXAMPLE / "key.json")
    score = score_verdicts(key, read_verdicts(EXAMPLE / "verdicts-by-hand.txt"))
    paths = write_report(replace(score, judges=(HAND_JUDGE,)), tmp_path, REPORT.name)
    assert paths.json.read_bytes() == REPORT.with_suffix(".json").read_bytes()
    assert paths.md.read_bytes() == REPORT.with_suffix(".md").read_bytes()


def test_pairs_left_out_and_an_undefined_win_rate_round_trip():
    data = _report_data()
    data["per_pair"][0] = {key: data["per_pair"][0][key] for key in ("seed", "batch", "index", "nfe", "pair")}
    data["per_pair"][0]["outcome"] = "missing"
    origin = {key: data["per_pair"][1][key] for key in ("seed", "batch", "index", "nfe")}
    data["per_pair"][1] = {**origin, "temperature": 0.9, **data["per_pair"][1]}  # a knob of the pair's origin
    data["win_rate_non_tie"], data["win_rate_non_tie_ci"] = None, None
    score = JudgeScore.from_json(data, "edited report")
    assert not score.per_pair[0].scored and score.per_pair[0].verdicts is None
    assert score.per_pair[1].origin.knobs == {"temperature": 0.9}
    assert score.win_rate_non_tie.value is None and score.win_rate_non_tie.ci is None
    assert score.to_json() == data and list(score.to_json()["per_pair"][1]) == list(data["per_pair"][1])


def test_a_cached_reply_round_trips_through_the_cache_file(tmp_path):
    reply = ChatReply("Final verdict: [[A>B]]", "thinking", {"total_tokens": 7}, "stop")
    entry = CachedReply("k1", "p1", reply)
    assert CachedReply.from_json(entry.to_json(), "a line") == entry
    cache = ReplyCache(tmp_path / "cache.jsonl")
    cache.add("k1", reply, "p1")
    assert json.loads((tmp_path / "cache.jsonl").read_text()) == entry.to_json()
    assert ReplyCache(tmp_path / "cache.jsonl").get("k1") == reply


# --------------------------------------------------------------------------------------------------- missing fields


def _without(data: dict, path: tuple) -> dict:
    edited = copy.deepcopy(data)
    holder = edited
    for step in path[:-1]:
        holder = holder[step]
    del holder[path[-1]]
    return edited


@pytest.mark.parametrize(
    ("path", "named"),
    [
        (("presentations",), ": the judge key lacks the field 'presentations'"),
        (("nfe",), ": the judge key lacks the field 'nfe'"),
        (("pairs", 4, "index"), ", pair 4: the pair origin lacks the field 'index'"),
        (
            ("presentations", "dd8471545a13", "candidate"),
            ", presentation dd8471545a13: the presentation lacks the field",
        ),
    ],
)
def test_a_key_without_a_field_names_the_field_and_the_file(tmp_path, path, named):
    data = json.loads((EXAMPLE / "key.json").read_text(encoding="utf-8"))
    broken = tmp_path / "key.json"
    broken.write_text(json.dumps(_without(data, path)), encoding="utf-8")
    with pytest.raises(RecordError, match="^" + re.escape(f"{broken}{named}")):
        read_key(broken)


@pytest.mark.parametrize(
    ("path", "named"),
    [
        (("arena_score_ci",), ": the judge score lacks the field 'arena_score_ci'"),
        (("wins",), ": the judge score lacks the field 'wins'"),
        (("position", "tie"), ", position: the position count lacks the field 'tie'"),
        (("bootstrap", "seed"), ", bootstrap: the bootstrap setting lacks the field 'seed'"),
        (("per_pair", 2, "outcome"), ", per_pair 2: the pair outcome lacks the field 'outcome'"),
        (("per_pair", 2, "points"), ", per_pair 2: the pair outcome lacks the field 'points'"),
        (("per_pair", 2, "seed"), ", per_pair 2: the pair outcome lacks the field 'seed'"),
    ],
)
def test_a_score_report_without_a_field_names_the_field_and_the_file(path, named):
    with pytest.raises(RecordError, match="^" + re.escape(f"{REPORT}{named}")):
        JudgeScore.from_json(_without(_report_data(), path), str(REPORT))


def test_a_prompt_without_an_answer_names_the_field_the_file_and_the_line(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('{"id": "a", "answer_a": "x", "answer_b": "y"}\n{"id": "b", "answer_a": "x"}\n')
    with pytest.raises(RecordError, match="^" + re.escape(f"{path}, line 2: the prompt lacks the field 'answer_b'")):
        read_prompts(path)
    path.write_text('{"id": "a", "answer_a": "x", "answer_b": 3}\n')
    with pytest.raises(ValueError, match="line 1: expected string 'id', 'answer_a', 'answer_b'"):
        read_prompts(path)
    path.write_text('["a", "x", "y"]\n')
    with pytest.raises(RecordError, match="line 1: a prompt must be a JSON object, got list"):
        read_prompts(path)


def test_a_verdict_line_without_id_or_verdict_names_the_file_and_the_line(tmp_path):
    path = tmp_path / "verdicts.jsonl"
    path.write_text('{"id": "a", "verdict": "A>B"}\n{"id": "b", "judge": "m"}\n')
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}, line 2: ") + ".*needs 'verdict' \\(or 'reply'\\)"):
        read_verdicts(path)
    path.write_text('{"verdict": "A>B"}\n')
    with pytest.raises(ValueError, match="^" + re.escape(f"{path}, line 1: ") + ".*needs a string 'id'"):
        read_verdicts(path)


def test_a_chat_completion_without_choices_or_message_is_named():
    assert ChatReply.from_json({"choices": [{"message": {"content": None}}]}, "url") == ChatReply("")
    with pytest.raises(RecordError, match="^url: the chat completion lacks the field 'choices'"):
        ChatReply.from_json({"error": "x"}, "url")
    with pytest.raises(RecordError, match="^url: the chat completion choice lacks the field 'message'"):
        ChatReply.from_json({"choices": [{"text": "x"}]}, "url")


def test_a_cache_line_without_its_reply_is_skipped_like_a_torn_one(tmp_path):
    path = tmp_path / "cache.jsonl"
    good = CachedReply("k1", "p1", ChatReply("[[A=B]]")).to_json()
    path.write_text(json.dumps(good) + "\n" + json.dumps({"key": "k2", "id": "p2"}) + '\n{"key": "to')
    cache = ReplyCache(path)
    assert len(cache) == 1 and "k1" in cache and cache.skipped_lines == 2
    with pytest.raises(RecordError, match="^line 1: the cached reply lacks the field 'reply'"):
        CachedReply.from_json({"key": "k2"}, "line 1")


def test_the_key_records_are_frozen():
    key = read_key(EXAMPLE / "key.json")
    with pytest.raises(AttributeError):
        key.nfe = 16
    with pytest.raises(AttributeError):
        next(iter(key.presentations.values())).candidate = "A"
    assert isinstance(key, JudgeKey)
