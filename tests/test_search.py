"""The one tuning rule (`calibration/search.py`): search, edges, objective at equal entropy, keep rule, matching."""

import json
import math
from pathlib import Path

import pytest

from untied_sc_lab.experiments.tuning_records import RATIO_FIELDS, BankComparison
from untied_sc_lab.tuning.search import (
    METHOD_KNOBS,
    NEUTRAL,
    START,
    BankRun,
    Candidate,
    EntropyMatch,
    Knob,
    OfficialCurve,
    coordinate_search,
    knob_edges,
    match_entropy,
    tune_method,
)


ARTIFACTS = Path(__file__).resolve().parents[1] / "hub_artifacts"


SLOPE = 5.5  # log-GenPPL per nat, as on LangFlow-small's official temperature curve


def bank_run(ppl: float, entropy: float, spread: float = 0.0, n: int = 16, tokens: int = 10) -> BankRun:
    """A bank of `n` samples whose pooled GenPPL is `ppl` (per-sample log-GenPPL ± `spread`) and entropy `entropy`."""
    logs = [math.log(ppl) + (spread if i % 2 else -spread) for i in range(n)]
    return BankRun(ppl, entropy, [tokens * v for v in logs], [float(tokens)] * n, [entropy] * n)


def official_at(entropy: float) -> float:
    """Official's GenPPL on a straight log-line through (5.0, 100) with SLOPE."""
    return 100.0 * math.exp(SLOPE * (entropy - 5.0))


def curve(spread: float = 0.0, n: int = 16) -> OfficialCurve:
    values = [1.0, 0.8, 0.9, 1.1, 1.2]  # entropy 5 + (T − 1)
    runs = [bank_run(official_at(4 + v), 4 + v, spread, n) for v in values]
    return OfficialCurve("temperature", values, runs)


def test_the_objective_is_genppl_at_equal_entropy_two_sided_and_never_far_outside_the_curve():
    c = curve()
    assert c.objective(c.default) == pytest.approx(0.0, abs=1e-12)  # official itself scores exactly 0
    # raw GenPPL 10 % lower but 0.05 nats less entropy: worse than official at that entropy
    lower = bank_run(90.0, 4.95)
    assert c.objective(lower) == pytest.approx(math.log(0.9) + SLOPE * 0.05)
    assert c.objective(lower) > 0
    # raw GenPPL 10 % higher at 0.05 nats more entropy: credited (official would be 32 % higher there)
    higher = bank_run(110.0, 5.05)
    assert c.objective(higher) == pytest.approx(math.log(1.1) - SLOPE * 0.05) and c.objective(higher) < 0
    # just beyond the curve's end: read on its tangent; further out: outside, no score
    assert c.objective(bank_run(official_at(5.21), 5.21)) == pytest.approx(0.0, abs=1e-9)
    assert c.objective(bank_run(1.0, 5.3)) is None and c.objective(bank_run(1.0, 4.7)) is None
    assert c.entropy_range() == pytest.approx((4.8, 5.2))


def scorer(optimum: float, eta_o_cost: float = 0.02, entropy_shift=lambda knobs: 0.0, calls=None):
    """A method whose objective is (log(η_T) − log(optimum))² / 10 + eta_o_cost·η_O, at official's entropy + shift."""

    def score(knobs):
        if calls is not None:
            calls.append(dict(knobs))
        h = 5.0 + entropy_shift(knobs)
        eta_t = max(knobs["eta_t"], 1e-3)
        objective = (math.log(eta_t) - math.log(optimum)) ** 2 / 10 + eta_o_cost * knobs["eta_o"] - 0.1
        return bank_run(official_at(h) * math.exp(objective), h)

    return score


START_UNTIED = {"eta_r": 1.0, "eta_t": 1.0, "eta_o": 1.0, "alpha": 1.0}


def test_the_search_extends_a_line_whose_best_is_its_end_and_records_the_edges():
    calls = []
    candidates, best = coordinate_search(METHOD_KNOBS["untied"], START_UNTIED, scorer(8.0, calls=calls), curve())
    assert best.knobs["eta_t"] == 8.0  # 1 → ×2 = 2 (the end) → 4 → 8 → 16 is worse: the extension stops at 8
    assert any(c.knobs["eta_t"] == 16.0 and c.phase == "extension" for c in candidates)
    assert best.knobs["eta_o"] == 0.0  # η_O only costs: its hard limit 0
    assert len(calls) == len(candidates) <= 20  # every scored candidate is recorded, within the budget
    edges = knob_edges(METHOD_KNOBS["untied"], best.knobs, candidates)
    assert edges["eta_t"].startswith("interior") and edges["eta_o"] == "hard limit" and edges["alpha"] == "hard limit"
    # a budget too small to close the line: the record says so
    small, best_small = coordinate_search(METHOD_KNOBS["untied"], START_UNTIED, scorer(8.0), curve(), budget=4)
    assert len(small) == 4
    assert knob_edges(METHOD_KNOBS["untied"], best_small.knobs, small)["eta_t"] == "edge (budget spent)"


def test_fine_rounds_refine_between_the_coarse_steps():
    candidates, best = coordinate_search(METHOD_KNOBS["ace"], {"ace_strength": 2.0}, _ace(5.6), curve(), budget=16)
    assert best.knobs["ace_strength"] == pytest.approx(4 * 2**0.5)  # between 4 and 8, found by ×√2
    assert {c.phase for c in candidates} >= {"start", "coarse", "fine"}


def _ace(optimum):
    def score(knobs):
        x = max(knobs["ace_strength"], 1e-3)
        return bank_run(official_at(5.0) * math.exp((math.log(x) - math.log(optimum)) ** 2 - 0.05), 5.0)

    return score


def test_a_choice_knob_tries_every_value_and_a_candidate_outside_the_curve_is_never_picked():
    def score(knobs):
        # routing "solver" is best but throws entropy far below the curve: outside, unscored
        h = {"solver": 4.0, "self_conditioning": 5.0, "both": 5.0}[knobs["higs_routing"]]
        gain = {"solver": -1.0, "self_conditioning": -0.1, "both": -0.05}[knobs["higs_routing"]]
        return bank_run(official_at(h) * math.exp(gain + 0.01 * abs(knobs["higs_weight"] - 1.75)), h)

    candidates, best = coordinate_search(METHOD_KNOBS["higs"], START["higs"], score, curve())
    assert {c.knobs["higs_routing"] for c in candidates} == {"solver", "self_conditioning", "both"}
    assert best.knobs["higs_routing"] == "self_conditioning"
    assert [c.objective for c in candidates if c.knobs["higs_routing"] == "solver"] == [None]
    assert knob_edges(METHOD_KNOBS["higs"], best.knobs, candidates)["higs_routing"] == "every value"


def test_a_choice_tried_only_at_an_earlier_value_of_another_knob_is_not_an_edge():
    # every routing tried at w = 1.75; the refinement then moved w alone (to 1.75·√2), as on LangFlow-small's bank
    knobs = METHOD_KNOBS["higs"]
    tried = [(1.75, "both"), (1.75, "solver"), (1.75, "self_conditioning"), (0.875, "both"), (2.47, "both")]
    candidates = [
        Candidate({"higs_weight": w, "higs_routing": r}, bank_run(official_at(5.0), 5.0), 0.0, "round 1")
        for w, r in tried
    ]
    best = {"higs_weight": 2.47, "higs_routing": "both"}
    edges = knob_edges(knobs, best, candidates)
    assert edges["higs_routing"] == "every value (on an earlier line)"
    assert knob_edges(knobs, best, candidates[:1] + candidates[3:])["higs_routing"] == "edge (budget spent)"


def test_momentum_moves_one_minus_beta_and_stays_in_range():
    knob = METHOD_KNOBS["momentum"][0]
    assert knob.to_search(0.9) == pytest.approx(0.1) and knob.to_config(0.0) == 1.0  # β = 1: no momentum
    assert knob.step(0.8, 2.0) == 0.95  # capped: β stays ≥ 0.05
    alpha = Knob("alpha", upper=1.0, positive=True)
    assert alpha.step(1.0, 0.0) is None and alpha.step(0.8, 2.0) == 1.0


def test_the_keep_rule_reads_the_pick_at_equal_entropy_on_matched_pairs():
    # 10 % better at equal entropy on every pair: kept
    steady = tune_method("ace", 8, START["ace"], lambda k: bank_run(official_at(5.0) * 0.9, 5.0), curve())
    assert steady.kept and steady.outcome == "accepted" and steady.chosen == steady.best.knobs
    assert steady.comparison.ratio == pytest.approx(0.9) and steady.comparison.ratio_ci[1] < 1
    # the same mean, pairs scattered by ±1 nat: within noise, ACE runs at its neutral value
    noisy = tune_method("ace", 8, START["ace"], lambda k: bank_run(official_at(5.0) * 0.9, 5.0, spread=1.0), curve())
    assert not noisy.kept and noisy.outcome == "no win at equal entropy beyond noise"
    assert noisy.chosen == {"ace_strength": NEUTRAL["ace"]["ace_strength"]}
    # 10 % lower raw GenPPL bought with 0.05 nats less entropy: a loss at equal entropy, not kept
    cheap = tune_method("ace", 8, START["ace"], lambda k: bank_run(official_at(5.0) * 0.9, 4.95), curve())
    assert cheap.comparison.ratio > 1 and not cheap.kept
    record = steady.record()
    assert record["budget"] == 20 and record["candidates_tried"] == len(record["candidates"])
    assert record["official_curve"]["knob"] == "temperature" and "objective" in record["candidates"][0]
    assert record["on_edge"] is False


def test_the_keep_rule_resamples_whole_batches():
    """Two batches of 32 (ELF: two time grids): one wins by 0.2 nats per sample, the other loses by 0.1. As 64 pairs
    the win looks sure; as 2 grids the interval reaches above 1 and the method stays neutral."""

    def split(knobs):
        run = bank_run(official_at(5.0), 5.0, n=64)
        shifted = [s + 10 * (-0.2 if i < 32 else 0.1) for i, s in enumerate(run.nll_sum)]
        return BankRun(math.exp(sum(shifted) / sum(run.num_tokens)), 5.0, shifted, run.num_tokens, run.entropies)

    pairs = tune_method("multistep", 8, START["multistep"], split, curve(n=64))
    batches = tune_method(
        "multistep", 8, START["multistep"], split, curve(n=64), clusters=[i // 32 for i in range(64)]
    )
    assert pairs.kept and not batches.kept


def test_match_entropy_finds_the_temperature_at_official_entropy():
    runs = []

    def score(temperature):
        runs.append(temperature)
        return bank_run(100.0, 4.96 + 0.8 * (temperature - 1.0) + 0.2 * (temperature - 1.0) ** 2)

    match = match_entropy(score, 5.0, (1.0, bank_run(100.0, 4.96)), slope=1.0, lowest=0.05, knob="temperature")
    assert abs(match.entropy - 5.0) <= match.tolerance and match.value > 1.0
    assert len(runs) <= 3 and [run.value for run in match.runs] == runs
    # a knob that cannot move entropy far enough the wrong way (ELF's decode temperature cannot go below 0)
    stuck = match_entropy(
        lambda v: bank_run(100.0, 5.1), 5.0, (0.0, bank_run(100.0, 5.1)), slope=1.0, lowest=0.0, knob="temperature"
    )
    assert stuck.value is None


def test_the_keep_tests_comparison_writes_what_a_report_reads_back():
    steady = tune_method("ace", 8, START["ace"], lambda k: bank_run(official_at(5.0) * 0.9, 5.0), curve())
    written = steady.record()["best_vs_official"]
    assert list(written) == list(RATIO_FIELDS) and isinstance(written["ratio_ci"], list)
    read = BankComparison.from_json(written)
    assert (read.ratio, tuple(read.ratio_ci)) == (steady.comparison.ratio, steady.comparison.ratio_ci)
    assert read.to_json() == written


def test_the_bundled_entropy_matching_records_round_trip():
    records = [
        record["entropy_matching"]
        for folder in sorted(ARTIFACTS.iterdir())
        for record in json.loads((folder / "scheduler" / "scheduler_config.json").read_text())[
            "tuning_by_steps"
        ].values()
        if record.get("entropy_matching")
    ]
    assert any(r["value"] is None for r in records) and any(r["value"] is not None for r in records)
    for record in records:
        match = EntropyMatch.from_json(record)
        assert match.to_json() == record and match.knob in ("temperature", "decode_temperature")
        assert len(match.runs) == len(record["runs"]) and match.tolerance == record["tolerance"]


def test_an_entropy_matching_that_tried_no_step_writes_its_short_layout():
    stuck = match_entropy(
        lambda v: bank_run(100.0, 5.1), 5.0, (1.0, bank_run(100.0, 5.1)), 0.0, 0.05, knob="temperature"
    )
    written = stuck.to_json()
    assert written == {"knob": "temperature", "value": None, "target_entropy": 5.0, "runs": []}
    assert EntropyMatch.from_json(written) == stuck
    tried = match_entropy(
        lambda v: bank_run(100.0, 4.8 + 0.1 * v), 5.0, (1.0, bank_run(100.0, 4.9)), 0.1, 0.05, knob="temperature"
    )
    written = tried.to_json()
    assert list(written) == ["knob", "value", "entropy", "gen_ppl", "target_entropy", "tolerance", "runs"]
    assert tried.value == 2.0 and list(written["runs"][0]) == ["value", "gen_ppl", "entropy"]
    assert EntropyMatch.from_json(written) == tried


def test_an_entropy_matching_record_without_a_field_names_it():
    record = {"knob": "temperature", "value": None, "target_entropy": 5.0, "runs": [{"value": 1.1, "gen_ppl": 90.0}]}
    lacks = r"entropy_matching.runs\[0\]: the entropy-matching record lacks the field 'entropy'"
    with pytest.raises(ValueError, match=lacks):
        EntropyMatch.from_json(record)
    with pytest.raises(
        ValueError, match="entropy_matching: the entropy-matching record lacks the field 'target_entropy'"
    ):
        EntropyMatch.from_json({"knob": "temperature", "value": None, "runs": []})
