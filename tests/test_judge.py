"""The pairwise-judge protocol: verdict parsing, scoring on a hand-computed example, blinded export, and `judge run`
against a loopback HTTP server started here (no network)."""

import json
import random
import re
import threading
from dataclasses import replace
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import torch

from untied_sc.cli import main
from untied_sc.generation import Sample, write_samples
from untied_sc_lab.judge import (
    ChatClient,
    JudgeKey,
    JudgeRequestError,
    blind_presentations,
    export_presentations,
    load_template,
    match_pairs,
    normalise_verdict,
    parse_template,
    parse_verdict,
    read_key,
    read_prompts,
    read_verdicts,
    run_judge,
    score_verdicts,
)
from untied_sc_lab.judge.records import PositionCounts
from untied_sc_lab.judge.run import default_cache_path


# ---------------------------------------------------------------------------------------------------------- verdicts


def test_every_accepted_spelling_normalises_to_one_of_five_levels():
    assert {s: normalise_verdict(s) for s in ("A>>B", "a >> b", "A≫B", "B<<A", "B≪A", "[[A>>B]]")} == dict.fromkeys(
        ("A>>B", "a >> b", "A≫B", "B<<A", "B≪A", "[[A>>B]]"), "A>>B"
    )
    assert normalise_verdict("B<A") == normalise_verdict("[A>B]") == "A>B"
    assert normalise_verdict("B=A") == normalise_verdict("a=b") == "A=B"
    assert normalise_verdict("A<B") == "B>A"
    assert normalise_verdict("A<<B") == normalise_verdict("B ≫ A") == "B>>A"
    for nonsense in ("A", "A>>>B", "A>A", "C>B", "", "A=>B"):
        assert normalise_verdict(nonsense) is None


def test_reply_parsing_takes_the_last_tag_and_never_guesses():
    assert parse_verdict("Comparing [[A>B]] first... on reflection: Final verdict: [[b>>a]]") == "B>>A"
    assert parse_verdict("My final verdict is tie: [[A=B]].") == "A=B"
    assert parse_verdict("No double tag, so the single one counts: [A>B]") == "A>B"
    assert parse_verdict("[[A>B]] outranks a later single tag [B>A]") == "A>B"  # double tags are tried first
    assert parse_verdict("Sample A is clearly better.") is None  # no tag: unparseable, not 'A>B'
    assert parse_verdict("Final verdict: [[A>>>B]]") is None  # a tag that spells no verdict
    assert parse_verdict("") is None and parse_verdict(None) is None


def test_verdict_files_read_json_and_text_lines_and_refuse_conflicts(tmp_path):
    path = tmp_path / "verdicts.txt"
    path.write_text(
        "# written by hand\n\n"
        "x1 A>>B\n"
        "x2 ?\n"
        '{"id": "x3", "verdict": null, "reply": "hmm"}\n'
        '{"id": "x4", "reply": "ok [[B>A]]", "judge": "m"}\n'
        '{"id": "x2", "verdict": "A<B"}\n'  # a parsed verdict replaces an unparseable one
    )
    records = read_verdicts(path)
    assert {k: r.verdict for k, r in records.items()} == {"x1": "A>>B", "x2": "B>A", "x3": None, "x4": "B>A"}
    assert records["x4"].judge == "m"
    (tmp_path / "other.txt").write_text("x1 A>B\n")
    with pytest.raises(ValueError, match="x1"):
        read_verdicts([path, tmp_path / "other.txt"])
    (tmp_path / "typo.txt").write_text("x1 A>>C\n")
    with pytest.raises(ValueError, match="typo.txt, line 1"):
        read_verdicts(tmp_path / "typo.txt")


# ----------------------------------------------------------------------------------------------------------- scoring


def _hand_key() -> JudgeKey:
    """Seven pairs; presentation `p<i>a` shows the candidate as A, `p<i>b` as B (the reversed order)."""
    presentations = {}
    for i in range(7):
        presentations[f"p{i}a"] = {"pair": i, "candidate": "A"}
        presentations[f"p{i}b"] = {"pair": i, "candidate": "B"}
    data = {
        "format": "untied-sc judge key v1",
        "baseline": "official",
        "candidate": "untied",
        "nfe": 8,
        "knobs": {},
        "num_pairs": 7,
        "pairs": [{"seed": 0, "batch": 0, "index": i, "nfe": 8} for i in range(7)],
        "presentations": presentations,
    }
    return JudgeKey.from_json(data, "the hand-written key")


# Verdicts as the judge wrote them (about positions A/B), and what they mean for the candidate (c) vs baseline (o):
HAND_VERDICTS = """
p0a A>>B
p0b B>A
p1a A=B
p1b A>B
p2a A>B
p2b A>B
p3a B>>A
p3b B≫A
p4a A<B
p4b B>>A
p5a A>B
p5b ?
p6a A>B
"""
# pair 0: p0a c≫o -> 3 obs of 1; p0b c>o -> 1 obs of 1.          n=4, s=4   -> 1.00  win
# pair 1: p1a tie -> 1 obs of 0.5; p1b o>c -> 1 obs of 0.        n=2, s=0.5 -> 0.25  loss
# pair 2: p2a c>o -> 1 of 1; p2b o>c -> 1 of 0 (A always wins).  n=2, s=1   -> 0.50  tie (order reversal cancels)
# pair 3: p3a o≫c -> 3 of 0; p3b c≫o -> 3 of 1 (B always wins).  n=6, s=3   -> 0.50  tie
# pair 4: p4a o>c -> 1 of 0; p4b c≫o -> 3 of 1.                  n=4, s=3   -> 0.75  win (unweighted: a tie)
# pair 5: p5b unparseable -> pair left out; pair 6: p6b never judged -> pair left out.
# Scored pairs 5: wins 2 (0, 4), ties 2 (2, 3), losses 1 (1): rates 0.4 / 0.4 / 0.2, win rate 2 / (2 + 1) = 2/3.
# Arena score: Σs / Σn = (4 + 0.5 + 1 + 3 + 3) / (4 + 2 + 2 + 6 + 4) = 11.5 / 18 -> 63.888...


def _hand_verdicts(tmp_path) -> dict:
    path = tmp_path / "hand.txt"
    path.write_text(HAND_VERDICTS)
    return read_verdicts(path)


def test_score_of_a_hand_computed_example_with_ties_strong_weights_and_reversed_orders(tmp_path):
    result = score_verdicts(_hand_key(), _hand_verdicts(tmp_path), num_resamples=2000)
    assert (result.wins, result.ties, result.losses) == (2, 2, 1)
    assert result.num_pairs_scored == 5
    assert (result.num_pairs_unparseable, result.num_pairs_missing) == (1, 1)
    assert result.unparseable_ids == ("p5b",) and result.missing_ids == ("p6b",)
    assert result.num_observations == 18
    assert result.win_rate.value == pytest.approx(0.4) and result.tie_rate.value == pytest.approx(0.4)
    assert result.loss_rate.value == pytest.approx(0.2)
    assert result.win_rate_non_tie.value == pytest.approx(2 / 3)
    assert result.arena_score.value == pytest.approx(100 * 11.5 / 18)
    by_pair = {p.pair: p for p in result.per_pair}
    assert [by_pair[i].score for i in range(5)] == [1.0, 0.25, 0.5, 0.5, 0.75]
    assert [by_pair[i].outcome for i in range(7)] == ["win", "loss", "tie", "tie", "win", "unparseable", "missing"]
    assert result.verdicts == {"candidate>>": 3, "candidate>": 2, "tie": 1, "baseline>": 3, "baseline>>": 1}
    assert result.position == PositionCounts(a_preferred=4, b_preferred=5, tie=1)
    low, high = result.arena_score.ci
    assert 0 <= low <= result.arena_score.value <= high <= 100


def test_mirroring_every_presentation_leaves_the_score_unchanged(tmp_path):
    """Showing each pair the other way round, with the judge's verdict mirrored too, is the same judgment."""
    key, verdicts = _hand_key(), _hand_verdicts(tmp_path)
    sides = {i: replace(p, candidate="B" if p.candidate == "A" else "A") for i, p in key.presentations.items()}
    mirrored_key = replace(key, presentations=sides)
    mirror = {"A>>B": "B>>A", "A>B": "B>A", "A=B": "A=B", "B>A": "A>B", "B>>A": "A>>B", None: None}
    mirrored = {id_: replace(record, verdict=mirror[record.verdict]) for id_, record in verdicts.items()}
    original = score_verdicts(key, verdicts, num_resamples=500)
    flipped = score_verdicts(mirrored_key, mirrored, num_resamples=500)
    for name in ("wins", "ties", "losses", "arena_score", "win_rate_non_tie", "arena_score_ci"):
        assert flipped.to_json()[name] == original.to_json()[name]


def test_bootstrap_resamples_whole_pairs(tmp_path):
    """Three identical pairs, each c≫o then o>c (observations 1, 1, 1, 0): resampling pairs can only give 75, so the
    interval is a point; resampling single observations would not."""
    key = _hand_key()
    presentations = {k: v for k, v in key.presentations.items() if v.pair < 3}
    key = replace(key, num_pairs=3, pairs=key.pairs[:3], presentations=presentations)
    path = tmp_path / "same.txt"
    path.write_text("p0a A>>B\np0b A>B\np1a A>>B\np1b A>B\np2a A>>B\np2b A>B\n")
    result = score_verdicts(key, read_verdicts(path))
    assert result.bootstrap.num_resamples == 10_000 and result.bootstrap.unit == "pair"
    assert result.arena_score.value == 75.0 and result.arena_score.ci == pytest.approx((75.0, 75.0))
    assert result.win_rate_non_tie.value == 1.0


def test_bootstrap_is_reproducible_from_its_seed(tmp_path):
    key, verdicts = _hand_key(), _hand_verdicts(tmp_path)
    first = score_verdicts(key, verdicts, num_resamples=300, seed=3)
    assert score_verdicts(key, verdicts, num_resamples=300, seed=3).arena_score.ci == first.arena_score.ci


def test_verdicts_for_presentations_outside_the_key_are_an_error(tmp_path):
    path = tmp_path / "stray.txt"
    path.write_text("zz A>B\n")
    with pytest.raises(ValueError, match="wrong --key"):
        score_verdicts(_hand_key(), read_verdicts(path))


# ------------------------------------------------------------------------------------------------------------ export


def _benchmark_samples() -> list[Sample]:
    """A benchmark-like samples file: official and untied at NFE 8 and 16 (2 seeds × 3 samples), an official
    temperature sweep, an official sample without an untied partner; shuffled."""
    samples = []
    for sampler in ("official", "untied"):
        for nfe in (8, 16):
            for seed in (0, 1):
                count = 4 if (sampler, nfe, seed) == ("official", 8, 1) else 3
                for index in range(count):
                    text = f"{'plain' if sampler == 'official' else 'fine'} text {nfe}/{seed}/{index}"
                    extra = {"index": index, "temperature": None}
                    samples.append(Sample(text, [index], seed, index // 2, sampler, nfe, extra))
    for index in range(3):
        extra = {"index": index, "temperature": 0.9}
        samples.append(Sample(f"warm text {index}", [index], 0, index // 2, "official", 8, extra))
    random.Random(5).shuffle(samples)
    return samples


def test_pairs_match_same_seed_batch_index_nfe_and_knob():
    pairs = match_pairs(_benchmark_samples(), "official", "untied", nfe=8)
    assert len(pairs) == 6  # 2 seeds × 3; the lone official sample and the temperature sweep have no partner
    for pair in pairs:
        o = pair.origin
        assert pair.baseline == f"plain text 8/{o.seed}/{o.index}"
        assert pair.candidate == f"fine text 8/{o.seed}/{o.index}"
        assert o.batch == o.index // 2 and o.nfe == 8 and o.knobs == {}
    with pytest.raises(ValueError, match="No 'untied' sample at NFE 8 with knobs"):
        match_pairs(_benchmark_samples(), "official", "untied", nfe=8, knobs={"temperature": 0.9})
    with pytest.raises(ValueError, match="No 'official' sample at NFE 32"):
        match_pairs(_benchmark_samples(), "official", "untied", nfe=32)


def test_export_shows_each_pair_in_both_orders_blind_to_method_and_nfe(tmp_path):
    samples = tmp_path / "run.samples.jsonl.gz"
    write_samples(samples, _benchmark_samples())
    python_state, torch_state = random.getstate(), torch.random.get_rng_state()
    assert main(["judge", "export", str(samples), "--nfe", "8", "--out", str(tmp_path / "out"), "--seed", "7"]) == 0
    assert random.getstate() == python_state and torch.equal(torch.random.get_rng_state(), torch_state)

    text = (tmp_path / "out" / "prompts.jsonl").read_text()
    for revealing in ("official", "untied", "nfe", "NFE", "sampler", "seed", "pair", "candidate", "baseline"):
        assert revealing not in text
    lines = [json.loads(line) for line in text.splitlines()]
    assert all(list(line) == ["id", "answer_a", "answer_b"] for line in lines)
    prompts = read_prompts(tmp_path / "out" / "prompts.jsonl")
    assert all(re.fullmatch(r"[0-9a-f]{12}", p.id) for p in prompts)
    key = read_key(tmp_path / "out" / "key.json")
    assert key.num_pairs == 6 and len(prompts) == 12 == len(key.presentations)
    shown = {}
    for prompt in prompts:
        where = key.presentations[prompt.id]
        pair = key.pairs[where.pair]
        candidate = prompt.answer_a if where.candidate == "A" else prompt.answer_b
        baseline = prompt.answer_b if where.candidate == "A" else prompt.answer_a
        assert candidate == f"fine text 8/{pair.seed}/{pair.index}"
        assert baseline == f"plain text 8/{pair.seed}/{pair.index}"
        shown.setdefault(where.pair, []).append(where.candidate)
    assert all(sorted(sides) == ["A", "B"] for sides in shown.values())  # each pair once in each order
    unshuffled = [(i, side) for i in range(6) for side in "BA"]
    assert [(key.presentations[p.id].pair, key.presentations[p.id].candidate) for p in prompts] != unshuffled
    # the same seed gives the same files; existing files are kept unless --overwrite
    before = (tmp_path / "out" / "key.json").read_text()
    args = ["judge", "export", str(samples), "--nfe", "8", "--out", str(tmp_path / "out"), "--seed", "7"]
    with pytest.raises(SystemExit, match="2"):
        main(args)
    assert main([*args, "--overwrite"]) == 0
    assert (tmp_path / "out" / "key.json").read_text() == before


def test_blinding_depends_on_the_seed_only():
    pairs = match_pairs(_benchmark_samples(), "official", "untied", nfe=8)
    assert blind_presentations(pairs, seed=1) == blind_presentations(pairs, seed=1)
    assert blind_presentations(pairs, seed=1)[0] != blind_presentations(pairs, seed=2)[0]


# ------------------------------------------------------------------------------------------------------- judge prompt


def test_packaged_template_renders_both_samples_and_keeps_braces_in_them():
    messages = load_template().messages("first {answer_b} {x}", "second")
    assert [m["role"] for m in messages] == ["system", "user"]
    assert "first {answer_b} {x}" in messages[1]["content"] and "second" in messages[1]["content"]
    assert "[[A>>B]]" in messages[0]["content"]
    assert parse_template("Compare {answer_a} with {answer_b}.").messages("x", "y") == [
        {"role": "user", "content": "Compare x with y."}
    ]
    with pytest.raises(ValueError, match="answer_b"):
        parse_template("=== user ===\nOnly {answer_a}")


# --------------------------------------------------------------------------------------------------------- judge run


class FakeJudge(ThreadingHTTPServer):
    """A loopback chat endpoint: prefers the sample containing 'fine', replies without a tag to samples containing
    'mumble'; `failures` answers the next requests with HTTP 500, `fail_after` answers 503 after that many
    successes."""

    def __init__(self):
        super().__init__(("127.0.0.1", 0), _FakeJudgeHandler)
        self.requests: list[dict] = []
        self.successes = 0
        self.failures = 0
        self.fail_after: int | None = None
        self.lock = threading.Lock()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}/v1"


class _FakeJudgeHandler(BaseHTTPRequestHandler):
    def log_message(self, *args):
        pass

    def _send(self, status: int, payload: dict) -> None:
        data = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_POST(self):
        server: FakeJudge = self.server
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        with server.lock:
            server.requests.append({"path": self.path, "body": body, "auth": self.headers.get("Authorization")})
            if server.failures > 0:
                server.failures -= 1
                return self._send(500, {"error": "overloaded"})
            if server.fail_after is not None and server.successes >= server.fail_after:
                return self._send(503, {"error": "down"})
            server.successes += 1
        user = body["messages"][-1]["content"]
        a, b = re.findall(r"Sample [AB]\|>\n(.*?)\n<\|The End", user, flags=re.S)
        if "mumble" in a + b:
            content = "Both samples are hard to read; I cannot decide."
        elif ("fine" in a) != ("fine" in b):
            content = "A reads better. Final verdict: [[A>>B]]" if "fine" in a else "Final verdict: [[B>>A]]"
        else:
            content = "[[A=B]]"
        self._send(200, {"choices": [{"message": {"role": "assistant", "content": content}, "finish_reason": "stop"}]})


@pytest.fixture
def judge_server():
    server = FakeJudge()
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.shutdown()
    server.server_close()


def _export(tmp_path, mumble: bool = False) -> tuple[Path, Path]:
    pairs = match_pairs(_benchmark_samples(), "official", "untied", nfe=8)
    if mumble:
        pairs[0] = replace(pairs[0], candidate="mumble mumble")
    paths = export_presentations(pairs, tmp_path / "export", "official", "untied", 8, seed=0)
    return paths.prompts, paths.key


def _client(server: FakeJudge, **options) -> ChatClient:
    return ChatClient(server.url, "fake-judge", api_key="secret", backoff=0.0, sleep=lambda seconds: None, **options)


def test_run_retries_after_a_server_error_and_records_unparseable_replies(tmp_path, judge_server):
    prompts, key = _export(tmp_path, mumble=True)
    judge_server.failures = 1
    summary = run_judge(prompts, tmp_path / "verdicts.jsonl", _client(judge_server), progress=False)
    assert len(judge_server.requests) == 12 + 1  # one retry after the 500
    assert {r["path"] for r in judge_server.requests} == {"/v1/chat/completions"}
    assert {r["auth"] for r in judge_server.requests} == {"Bearer secret"}
    assert judge_server.requests[0]["body"]["model"] == "fake-judge"
    assert summary.num_requests == 12 and summary.num_unparseable == 2  # both presentations of pair 0
    records = [json.loads(line) for line in (tmp_path / "verdicts.jsonl").read_text().splitlines()]
    assert [r["id"] for r in records] == [p.id for p in read_prompts(prompts)]
    assert sum(r["verdict"] is None for r in records) == 2
    assert "secret" not in default_cache_path(tmp_path / "verdicts.jsonl").read_text()
    result = score_verdicts(read_key(key), read_verdicts(tmp_path / "verdicts.jsonl"), num_resamples=200)
    assert result.num_pairs_unparseable == 1 and result.num_unparseable == 2
    assert (result.wins, result.ties, result.losses, result.arena_score.value) == (5, 0, 0, 100.0)


def test_run_asks_nothing_twice_thanks_to_its_cache(tmp_path, judge_server):
    prompts, _ = _export(tmp_path)
    out = tmp_path / "verdicts.jsonl"
    run_judge(prompts, out, _client(judge_server), progress=False)
    first = out.read_text()
    assert len(judge_server.requests) == 12
    with pytest.raises(FileExistsError):
        run_judge(prompts, out, _client(judge_server), progress=False)
    summary = run_judge(prompts, out, _client(judge_server), progress=False, overwrite=True)
    assert len(judge_server.requests) == 12 and summary.num_cached == 12 and summary.num_requests == 0
    assert out.read_text() == first


def test_run_resumes_after_an_interruption(tmp_path, judge_server):
    prompts, _ = _export(tmp_path)
    out = tmp_path / "verdicts.jsonl"
    judge_server.fail_after = 5
    with pytest.raises(JudgeRequestError, match="503"):
        run_judge(prompts, out, _client(judge_server, retries=1), concurrency=1, progress=False)
    assert not out.exists()
    with default_cache_path(out).open("a") as handle:
        handle.write('{"key": "torn')  # a line cut short by the interruption
    judge_server.fail_after = None
    asked_before = len(judge_server.requests)  # 5 answered + 2 refused
    summary = run_judge(prompts, out, _client(judge_server), concurrency=3, progress=False)
    assert summary.num_cached == 5 and summary.num_requests == 7
    assert len(judge_server.requests) - asked_before == 7
    assert len(out.read_text().splitlines()) == 12


def test_client_gives_up_at_once_on_a_request_the_server_refuses(judge_server, monkeypatch):
    def refuse(handler):
        handler._send(401, {"error": "bad key"})

    monkeypatch.setattr(_FakeJudgeHandler, "do_POST", refuse)
    calls = []
    client = ChatClient(judge_server.url, "m", backoff=0.0, sleep=calls.append)
    with pytest.raises(JudgeRequestError, match="HTTP 401"):
        client.complete([{"role": "user", "content": "hi"}])
    assert calls == []


def test_cli_export_run_score_end_to_end(tmp_path, judge_server, monkeypatch):
    samples = tmp_path / "run.samples.jsonl.gz"
    write_samples(samples, _benchmark_samples())
    template = tmp_path / "prompt.txt"
    template.write_text(load_template().user.replace("<|The Start", "Read this.\n<|The Start", 1))
    monkeypatch.setenv("JUDGE_KEY", "k")
    out = tmp_path / "j"
    assert main(["judge", "export", str(samples), "--nfe", "8", "--out", str(out)]) == 0
    run = ["judge", "run", str(out / "prompts.jsonl"), "--endpoint", judge_server.url, "--model", "fake"]
    run += ["--out", str(out / "verdicts.jsonl"), "--prompt-file", str(template), "--api-key-env", "JUDGE_KEY"]
    assert main([*run, "--backoff", "0", "--no-progress", "--max-tokens", "64", "--extra-body", '{"seed": 1}']) == 0
    body = judge_server.requests[0]["body"]
    assert body["messages"][0]["content"].startswith("Read this.") and len(body["messages"]) == 1
    assert (body["temperature"], body["max_tokens"], body["seed"]) == (0.0, 64, 1)
    assert judge_server.requests[0]["auth"] == "Bearer k"
    assert main([*run, "--backoff", "0", "--no-progress", "--temperature", "none", "--overwrite"]) == 0
    assert len(judge_server.requests) == 24 and "temperature" not in judge_server.requests[-1]["body"]
    score = ["judge", "score", str(out / "verdicts.jsonl"), "--key", str(out / "key.json"), "--num-resamples", "100"]
    assert main(score) == 0
    report = json.loads((out / "judge-untied-vs-official-nfe8.json").read_text())
    assert (report["wins"], report["arena_score"], report["judges"]) == (6, 100.0, ["fake"])
    assert "Arena score | 100.0" in (out / "judge-untied-vs-official-nfe8.md").read_text()
    with pytest.raises(SystemExit):
        main(score)  # the report exists
    hand = tmp_path / "hand.txt"
    hand.write_text("# by hand\n" + "".join(f"{p.id} A=B\n" for p in read_prompts(out / "prompts.jsonl")))
    assert main([*score[:2], str(hand), *score[3:], "--name", "hand", "--judge", "me"]) == 0
    report = json.loads((out / "hand.json").read_text())
    assert (report["ties"], report["arena_score"], report["judges"]) == (6, 50.0, ["me"])
    assert report["win_rate_non_tie"] is None and report["win_rate_non_tie_ci"] is None  # no non-tie pair
