"""`untied-sc evaluate REPORT.samples.jsonl.gz`: the report's headline computed again from the samples alone and
checked number by number against the report (or a rescoring of it) that the same evaluator and dtype wrote."""

import json
import shutil
from pathlib import Path

import pytest

from untied_sc import LangFlowPipeline, LangFlowScheduler
from untied_sc.cli import main
from untied_sc_lab.experiments import ScoringSettings, SweepSettings, run_sweep

from .conftest import langflow_from_golden
from .tiny import paired_cell, tiny_evaluator, tiny_tokenizer


SWEEP = {"nfe": [8], "seeds": [0, 1], "num_samples": 4, "batch_size": 2}


def _saved_evaluator(folder, seed: int):
    for part in tiny_evaluator(seed=seed):
        part.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def report(langflow_golden, tmp_path_factory):
    """A tiny LangFlow report (official and untied, both swept over the temperature: read on their own frontiers),
    scored by an evaluator saved as a folder in float32, with its samples beside it."""
    evaluator = _saved_evaluator(tmp_path_factory.mktemp("evaluator"), seed=0)
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    folder = tmp_path_factory.mktemp("report")
    run_sweep(
        pipe,
        SweepSettings(**SWEEP, diversity_values=[0.8, 1.2], diversity_samplers=["official", "untied"]),
        ScoringSettings(str(evaluator), num_resamples=50),
        dtype="float32",
        name="tiny",
        command="untied-sc benchmark tiny-langflow",
        output_dir=folder,
        progress=False,
    )
    return {
        "json": folder / "tiny.json",
        "samples": folder / "tiny.samples.jsonl.gz",
        "evaluator": evaluator,
        "pipe": pipe,
    }


def _evaluate(samples, evaluator, output, capsys) -> tuple[dict, str]:
    argv = ["evaluate", str(samples), "--evaluator", str(evaluator), "--dtype", "float32", "--num-resamples", "50"]
    assert main([*argv, "--output", str(output)]) == 0
    return json.loads(output.read_text()), capsys.readouterr().out


def _copy_of_report(report, folder: Path) -> Path:
    """The report and its samples file, copied to `folder` (which is made)."""
    folder.mkdir()
    for path in (report["json"], report["samples"]):
        shutil.copy(path, folder / path.name)
    return folder


def _rescore(folder: Path, evaluator) -> None:
    """`benchmark --rescore` of `folder`'s tiny report under `evaluator`, written beside it."""
    argv = ["benchmark", "--rescore", str(folder / "tiny.json"), "--evaluator", str(evaluator), "--dtype", "float32"]
    assert main([*argv, "--output-dir", str(folder), "--num-resamples", "50", "--no-progress"]) == 0


def test_evaluate_reproduces_the_reports_headline_from_its_samples(report, tmp_path, capsys):
    result, printed = _evaluate(report["samples"], report["evaluator"], tmp_path / "eval.json", capsys)
    saved = json.loads(report["json"].read_text())
    headline = result["headline"]
    # the tiny model's frontier may not reach official's entropy: the headline then reads official's curve
    reached = saved["frontiers"]["by_sampler"]["untied"]["8"]["ratio"] is not None
    assert headline["report"] == str(report["json"])
    assert headline["reading"] == ("frontier" if reached else "baseline curve")
    assert headline["reproduced"] is True and headline["max_relative_difference"] <= 1e-4
    assert headline["unmatched"] == []
    keys = ["reading", "by_sampler", "reported", "head_to_head", "reported_head_to_head", "max_relative_difference"]
    assert list(headline) == [*keys, "unmatched", "reproduced", "report"]
    row = headline["by_sampler"]["untied"]["8"]
    assert list(row) == ["ratio", "ratio_ci", "raw_ratio", "raw_ratio_ci"]
    reported = (saved["frontiers"]["by_sampler"] if reached else saved["equal_entropy"])["untied"]["8"]
    for key in ("ratio", "ratio_ci"):  # None where the tiny samplers lie outside that curve too
        assert (row[key] is None and reported[key] is None) or row[key] == pytest.approx(reported[key], rel=1e-4)
    cell = saved["aggregates"]["paired"]["untied"]["8"]
    assert row["raw_ratio"] == pytest.approx(cell["gen_ppl_ratio"], rel=1e-4)
    assert row["raw_ratio_ci"] == pytest.approx(cell["gen_ppl_ratio_headline_ci"], rel=1e-4)
    assert "untied, NFE 8: at equal entropy" in printed and f"Reproduces {report['json']}'s headline" in printed
    # the run-by-run records are still there, one per run of the report
    assert len(result["runs"]) == len(saved["runs"])


def test_evaluate_says_when_a_report_is_not_reproduced(report, tmp_path, capsys):
    # the same samples beside a report whose untied headline was edited: the check fails and says so
    folder = tmp_path / "edited"
    folder.mkdir()
    shutil.copy(report["samples"], folder / "tiny.samples.jsonl.gz")
    edited = json.loads(report["json"].read_text())
    edited["aggregates"]["paired"]["untied"]["8"]["gen_ppl_ratio"] *= 1.01
    (folder / "tiny.json").write_text(json.dumps(edited))
    result, printed = _evaluate(folder / "tiny.samples.jsonl.gz", report["evaluator"], tmp_path / "e.json", capsys)
    assert result["headline"]["reproduced"] is False
    assert result["headline"]["max_relative_difference"] == pytest.approx(0.01 / 1.01, rel=1e-3)
    assert "Does NOT reproduce" in printed


def test_evaluate_checks_a_second_evaluator_against_the_reports_rescoring(report, tmp_path, capsys):
    folder = _copy_of_report(report, tmp_path / "copy")
    second = _saved_evaluator(tmp_path / "second", seed=1)
    samples = folder / "tiny.samples.jsonl.gz"
    # no report beside the samples was scored by the second evaluator: computed, nothing to check against
    result, printed = _evaluate(samples, second, tmp_path / "a.json", capsys)
    assert result["headline"]["report"] is None and result["headline"]["reproduced"] is None
    assert "nothing to check these against" in printed and "run in float32" in printed
    # its rescoring written beside them (`benchmark --rescore`) is the report that evaluator's headline is checked on
    _rescore(folder, second)
    capsys.readouterr()
    result, printed = _evaluate(samples, second, tmp_path / "b.json", capsys)
    assert result["headline"]["report"] == str(folder / "tiny-second.json")
    assert result["headline"]["reproduced"] is True
    # the first evaluator still checks against the first report, not the rescoring
    result, _ = _evaluate(samples, report["evaluator"], tmp_path / "c.json", capsys)
    assert result["headline"]["report"] == str(folder / "tiny.json") and result["headline"]["reproduced"] is True


def test_a_rescoring_of_part_of_a_grown_report_is_still_checked_on_the_shared_samples(report, tmp_path, capsys):
    folder = _copy_of_report(report, tmp_path / "grown")
    second = _saved_evaluator(tmp_path / "second", seed=1)
    _rescore(folder, second)
    # the report grows by a temperature (the file replaced: samples stored once); the rescoring now covers part of the
    # runs in the samples file it names
    run_sweep(
        report["pipe"],
        SweepSettings(**SWEEP, diversity_values=[0.8, 1.2, 1.5], diversity_samplers=["official", "untied"]),
        ScoringSettings(str(report["evaluator"]), num_resamples=50),
        dtype="float32",
        name="tiny",
        command="untied-sc benchmark tiny-langflow",
        output_dir=folder,
        progress=False,
    )
    capsys.readouterr()
    samples = folder / "tiny.samples.jsonl.gz"
    result, _ = _evaluate(samples, second, tmp_path / "a.json", capsys)
    assert result["headline"]["report"] == str(folder / "tiny-second.json")
    assert result["headline"]["reproduced"] is True
    result, _ = _evaluate(samples, report["evaluator"], tmp_path / "b.json", capsys)
    assert result["headline"]["report"] == str(folder / "tiny.json") and result["headline"]["reproduced"] is True
    assert len(result["runs"]) == len(json.loads((folder / "tiny-second.json").read_text())["runs"]) + 2 * 2


def test_a_samples_file_beside_a_record_that_is_not_a_report_has_no_headline_to_check(report, tmp_path):
    from untied_sc_lab.experiments.rescore import reports_of_samples

    samples = report["samples"]
    assert [path for path, _ in reports_of_samples(samples)][0] == report["json"]
    quality = tmp_path / "tiny-quality.samples.jsonl.gz"
    shutil.copy(samples, quality)
    # `benchmarks/model_quality.py` writes its rows beside its samples: a record, not a benchmark report
    (tmp_path / "tiny-quality.json").write_text(json.dumps({"model": "tiny", "family": "langflow", "rows": []}))
    assert reports_of_samples(quality) == []


# A committed report whose headline's parts the tests below replace: the headline reads any report as a record.
COMMITTED = (
    Path(__file__).resolve().parents[1] / "benchmarks" / "results" / "langflow-small-equal-entropy-16-baselines.json"
)


def curve_row(ratio, ratio_ci) -> dict:
    """A reading on the baseline's curve, the fields the headline does not read made up."""
    return {
        "entropy": 4.2,
        "gen_ppl": 50.0,
        "baseline_gen_ppl_at_entropy": 100.0,
        "ratio": ratio,
        "ratio_ci": ratio_ci,
        "fraction_outside": 0.0,
        "entropy_resampled": True,
    }


def frontier_row(ratio, ratio_ci, **more) -> dict:
    """A reading on a sampler's own frontier, the fields the headline does not read made up."""
    reading = {"entropy": 4.4, "gen_ppl": 50.0, "reference_gen_ppl": 100.0, "ratio": ratio, "ratio_ci": ratio_ci}
    return {**reading, "fraction_outside": 0.0, "entropy_resampled": True, "points": 3, **more}


def head_row(sampler: str, against: str, ratio, ratio_ci) -> dict:
    """A head to head on the two frontiers, the fields the check does not read made up."""
    reading = {key: value for key, value in frontier_row(ratio, ratio_ci).items() if key != "points"}
    return {"sampler": sampler, "against": against, **reading}


def headline_report(
    paired: dict, equal_entropy: dict | None = None, frontiers: dict | None = None, heads=None
) -> dict:
    """The committed report with these paired cells, equal-entropy rows and frontier rows (`None`: none)."""
    data = json.loads(COMMITTED.read_text())
    data["aggregates"]["paired"] = paired
    data["equal_entropy"] = equal_entropy or {}
    data.pop("frontiers")
    if frontiers is not None:
        data["frontiers"] = {"by_sampler": frontiers, "head_to_head": heads or {}}
    return data


def test_the_headline_reads_the_baseline_curve_where_no_frontier_reaches_the_baseline_entropy():
    from untied_sc_lab.experiments.report_record import Report
    from untied_sc_lab.experiments.rescore import headline_ratios

    def headline(*args, **kwargs):
        return headline_ratios(Report.from_json(headline_report(*args, **kwargs)))

    paired = {"untied": {"8": paired_cell(2.2, [2.0, 2.4])}}
    curve = {"untied": {"8": curve_row(0.46, [0.45, 0.48])}}
    outside = {"untied": {"8": frontier_row(None, None)}}
    reading, rows = headline(paired, curve, outside)
    assert reading == "baseline curve" and rows["untied"][8].ratio == 0.46
    assert rows["untied"][8].raw_ratio == 2.2 and list(rows["untied"][8].raw_ratio_ci) == [2.0, 2.4]
    reached = {"untied": {"8": frontier_row(0.7, [0.6, 0.8])}}
    reading, rows = headline(paired, curve, reached)
    assert reading == "frontier" and rows["untied"][8].ratio == 0.7
    reading, rows = headline(paired)
    assert reading is None and rows["untied"][8].ratio is None and rows["untied"][8].raw_ratio == 2.2
    # a method its tuning switched off runs the baseline's samples: its frontier "reaches" trivially, and is not read
    neutral = frontier_row(1.0, [1.0, 1.0], switched_off=True)
    paired_off = {**paired, "Momentum": {"8": paired_cell(1.0, [1.0, 1.0])}}
    reading, rows = headline(paired_off, curve, {**outside, "Momentum": {"8": neutral}})
    assert reading == "baseline curve" and rows["untied"][8].ratio == 0.46
    reading, _ = headline(paired, curve, {"Momentum": {"8": {**neutral, "switched_off": False}}})
    assert reading == "frontier"


def test_the_head_to_head_is_checked_number_by_number_too():
    from untied_sc_lab.experiments.rescore import compare_headlines

    paired = {"untied": {"16": paired_cell(0.9, [0.8, 1.0])}}
    frontier = {"untied": {"16": frontier_row(0.76, [0.73, 0.79])}}
    report = headline_report(
        paired, frontiers=frontier, heads={"16": [head_row("untied", "HiGS", 0.96, [0.92, 0.99])]}
    )
    check = compare_headlines(report, report)
    assert check.reproduced is True and check.max_relative_difference == 0.0 and check.report is None
    # NFEs are ints in memory, each pair the frontiers' own head to head record
    head = check.head_to_head[16]["untied vs HiGS"]
    assert (head.sampler, head.against, head.ratio, list(head.ratio_ci)) == ("untied", "HiGS", 0.96, [0.92, 0.99])
    row = check.by_sampler["untied"][16]
    assert (row.ratio, list(row.ratio_ci), row.raw_ratio, list(row.raw_ratio_ci)) == (
        0.76,
        [0.73, 0.79],
        0.9,
        [0.8, 1.0],
    )
    assert check.reported == check.by_sampler and check.reported_head_to_head == check.head_to_head
    # an interval bound of the head to head off by 1 %: not reproduced, and by how much
    edited = json.loads(json.dumps(report))
    edited["frontiers"]["head_to_head"]["16"][0]["ratio_ci"][1] *= 1.01
    check = compare_headlines(report, edited)
    assert check.reproduced is False
    assert check.max_relative_difference == pytest.approx(0.01 / 1.01)
    # a head to head that only the report gives (or a rival that changed) is named, not passed over
    alone = headline_report(paired, frontiers=frontier, heads={"16": []})
    check = compare_headlines(alone, report)
    assert check.reproduced is False and ("head to head", "16", "untied vs HiGS", "ratio", "0") in check.unmatched
    other = json.loads(json.dumps(report))
    other["frontiers"]["head_to_head"]["16"][0]["against"] = "DPM-Solver++(2M)"
    assert compare_headlines(other, report).reproduced is False


def test_the_headline_check_writes_the_json_evaluate_writes_key_for_key():
    from dataclasses import replace

    from untied_sc_lab.experiments.rescore import compare_headlines

    paired = {"untied": {"16": paired_cell(0.9, [0.8, 1.0])}, "HiGS": {"16": paired_cell(0.95, [0.9, 1.0])}}
    frontier = {"untied": {"16": frontier_row(0.76, [0.73, 0.79])}, "HiGS": {"16": frontier_row(0.8, None)}}
    heads = {"16": [head_row("untied", "HiGS", 0.96, [0.92, 0.99])]}
    computed = headline_report(paired, frontiers=frontier)
    check = replace(compare_headlines(computed, headline_report(paired, frontiers=frontier, heads=heads)), report="r")
    untied = {"ratio": 0.76, "ratio_ci": [0.73, 0.79], "raw_ratio": 0.9, "raw_ratio_ci": [0.8, 1.0]}
    higs = {"ratio": 0.8, "ratio_ci": None, "raw_ratio": 0.95, "raw_ratio_ci": [0.9, 1.0]}
    by_sampler = {"untied": {"16": untied}, "HiGS": {"16": higs}}
    # the layout `untied-sc evaluate` has always written under `headline`, in its order
    expected = {
        "reading": "frontier",
        "by_sampler": by_sampler,
        "reported": by_sampler,
        "head_to_head": {},
        "reported_head_to_head": {"16": {"untied vs HiGS": {"ratio": 0.96, "ratio_ci": [0.92, 0.99]}}},
        "max_relative_difference": 0.0,
        "unmatched": [
            ["head to head", "16", "untied vs HiGS", "ratio", "0"],
            ["head to head", "16", "untied vs HiGS", "ratio_ci", "0"],
            ["head to head", "16", "untied vs HiGS", "ratio_ci", "1"],
        ],
        "reproduced": False,
        "report": "r",
    }
    assert json.dumps(check.to_json()) == json.dumps(expected)
    # nothing to check against: the same keys, `report` and `reproduced` null
    nothing = replace(check, report=None, reproduced=None).to_json()
    assert list(nothing) == list(expected) and nothing["report"] is None and nothing["reproduced"] is None


def test_evaluate_prints_and_checks_the_reports_head_to_head(report, tmp_path, capsys):
    # The tiny report sets untied against no other method; beside a copy that claims a head to head, the check names
    # the claim as given by the report alone and fails
    folder = tmp_path / "claimed"
    folder.mkdir()
    shutil.copy(report["samples"], folder / "tiny.samples.jsonl.gz")
    claimed = json.loads(report["json"].read_text())
    claimed["frontiers"]["head_to_head"] = {"8": [head_row("untied", "HiGS", 0.9, [0.8, 1.0])]}
    (folder / "tiny.json").write_text(json.dumps(claimed))
    result, printed = _evaluate(folder / "tiny.samples.jsonl.gz", report["evaluator"], tmp_path / "e.json", capsys)
    assert result["headline"]["reproduced"] is False
    assert result["headline"]["reported_head_to_head"] == {
        "8": {"untied vs HiGS": {"ratio": 0.9, "ratio_ci": [0.8, 1.0]}}
    }
    assert "Does NOT reproduce" in printed and "untied vs HiGS" in printed
