"""`untied-sc benchmark --experiment baselines`: the comparison samplers in the matched sweep, tuned on the tuning bank
by the one rule (`calibration/search.py`), each read on its own frontier at official's entropy, ACE's direction as a
pipeline component; tiny golden pipelines under a tiny evaluator."""

import copy
import json
import re
import shlex
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler
from untied_sc.calibration.ace import estimate_ace_direction
from untied_sc.cli import build_parser, main
from untied_sc.defaults import EXTRAPOLATE, TUNE_BUDGET, TUNE_CONFIDENCE, TUNE_NUM_SAMPLES, TUNE_SEED
from untied_sc.generation import SamplerSpec
from untied_sc.generation.sampling import build_scheduler
from untied_sc.pipelines import load_pipeline
from untied_sc.schedulers.comparison_names import comparison_scheduler_class
from untied_sc_lab.evaluation.curves import EntropyRatio
from untied_sc_lab.experiments import ScoringSettings, SweepSettings, TuningSettings, run_sweep
from untied_sc_lab.experiments.baseline_generation import generate_baseline_candidates, score_baseline_candidates
from untied_sc_lab.experiments.baselines import tune_baselines
from untied_sc_lab.experiments.benchmark_cli import _tuning_settings
from untied_sc_lab.experiments.benchmark_options import TUNING_DEFAULTS
from untied_sc_lab.experiments.definitions import BASELINE_METHODS, experiment_samplers, with_preset
from untied_sc_lab.experiments.generation_record import CANDIDATES_KEY
from untied_sc_lab.experiments.stored_sweeps import read_stored_sweeps, store_sweep
from untied_sc_lab.experiments.sweep_settings import DEFAULT_TUNING
from untied_sc_lab.experiments.tuning_records import RATIO_FIELDS
from untied_sc_lab.runs.store import RunStore
from untied_sc_lab.tuning import search
from untied_sc_lab.tuning.baseline_knobs import is_neutral, neutral_knobs
from untied_sc_lab.tuning.search import METHOD_KNOBS, RULE, START

from .conftest import elf_from_golden, langflow_from_golden
from .tiny import tiny_evaluator, tiny_tokenizer


TUNING = TuningSettings(num_samples=4, budget=2)
TINY = SweepSettings(nfe=[8], seeds=[0, 1], num_samples=4, batch_size=2)
BASELINES = replace(TINY, samplers=experiment_samplers("baselines"))


@pytest.fixture(scope="module")
def evaluator():
    return tiny_evaluator()


def _pipe(family, golden, ace: bool = True):
    if family == "elf":
        pipe = ELFPipeline(elf_from_golden(golden), ELFScheduler(), tiny_tokenizer())
    else:
        pipe = LangFlowPipeline(langflow_from_golden(golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    if ace:  # a real (tiny) estimation: 6 official trajectories of 4 NFE
        statistics = estimate_ace_direction(
            pipe, num_trajectories=6, num_inference_steps=4, batch_size=3, progress=False
        )
        pipe.register_modules(ace_statistics=statistics)
    return pipe


@pytest.fixture(scope="module")
def pipes(elf_golden, langflow_golden):
    return {"elf": _pipe("elf", elf_golden), "langflow": _pipe("langflow", langflow_golden)}


def test_the_baselines_set_names_every_method_and_builds_it_from_the_official_config(pipes):
    samplers = experiment_samplers("baselines")
    assert list(samplers)[:2] == ["official", "untied"]
    assert {spec.scheduler for name, spec in samplers.items() if name in BASELINE_METHODS} == set(START)
    assert set(METHOD_KNOBS) == {*START, "untied"}
    assert with_preset(samplers, "langflow-lm1b")["Momentum"].to_json() == {"scheduler": "momentum"}  # no coefficients
    for family, pipe in pipes.items():
        for name, method in BASELINE_METHODS.items():
            spec = {"scheduler": method, "knobs_by_steps": {"8": START[method]}}
            scheduler = build_scheduler(pipe, spec, None, 8)
            assert type(scheduler) is comparison_scheduler_class(method, family), name
            assert {knob.name: scheduler.config[knob.name] for knob in METHOD_KNOBS[method]} == START[method]
            assert is_neutral(method, neutral_knobs(method)) and not is_neutral(method, START[method])
            with pytest.raises(ValueError, match="knobs for NFE \\[8\\] only, not 16"):
                build_scheduler(pipe, spec, None, 16)
    with pytest.raises(ValueError, match="has no config keys \\['eta_r'\\]"):
        build_scheduler(pipes["elf"], {"scheduler": "momentum", "eta_r": 1.0}, None, 8)


def test_missing_ace_statistics_fail_up_front_with_the_command_that_estimates_them(langflow_golden, evaluator):
    bare = _pipe("langflow", langflow_golden, ace=False)
    calls = []
    bare.transformer.register_forward_hook(lambda *args: calls.append(1))
    samplers = experiment_samplers("baselines")
    with pytest.raises(ValueError, match=r"'ACE', 'HiGS \+ ACE' need ACE's .*`untied-sc ace my-pipe`"):
        tune_baselines(bare, replace(TINY, samplers=samplers), evaluator, TUNING, source="my-pipe", progress=False)
    with pytest.raises(ValueError, match="untied-sc ace PIPELINE_DIR"):
        run_sweep(
            bare, replace(TINY, samplers={"official": {}, "ACE": {"scheduler": "ace"}}), ScoringSettings(evaluator)
        )
    assert not calls  # nothing was sampled


def test_seeds_are_checked_before_tuning(pipes, evaluator):
    pipe = pipes["langflow"]
    calls = []
    hook = pipe.transformer.register_forward_hook(lambda *args: calls.append(1))
    samplers = experiment_samplers("baselines")
    original = pipe.ace_statistics
    try:
        # a direction estimated before ACE had its own seed space drew benchmark seed 3000's batches
        legacy = copy.deepcopy(pipe.ace_statistics)
        legacy.register_to_config(seed_space="benchmark", seed=3000)
        pipe.register_modules(ace_statistics=legacy)
        with pytest.raises(ValueError, match=r"Seeds \[3000\] drew the trajectories ACE's direction"):
            leaked = replace(TINY, samplers=samplers, seeds=[0, 3000])
            tune_baselines(pipe, leaked, evaluator, TUNING, progress=False)
        with pytest.raises(ValueError, match="--tune-seed must lie in"):
            negative = replace(TUNING, seed=-1)
            tune_baselines(pipe, replace(TINY, samplers=samplers), evaluator, negative, progress=False)
    finally:
        pipe.register_modules(ace_statistics=original)
        hook.remove()
    assert not calls  # refused before any sampling


FRONTIER = {"langflow": [0.8, 1.2], "elf": [0.5, 1.0]}


def _tiny_baselines_report(pipe, family, evaluator, folder, command) -> dict:
    """The baselines experiment on a tiny pipeline: every comparison sampler tuned on the bank, then every sampler
    swept on its own frontier, written to `folder` as `tiny.*`."""
    samplers, record = tune_baselines(pipe, BASELINES, evaluator, TUNING, progress=False)
    return run_sweep(
        pipe,
        replace(TINY, samplers=samplers, diversity_values=FRONTIER[family], diversity_samplers=list(samplers)),
        ScoringSettings(evaluator, num_resamples=50),
        knob_tuning=record,
        progress=False,
        name="tiny",
        command=command,
        output_dir=folder,
    )


@pytest.mark.parametrize("family", ["langflow", "elf"])
def test_baselines_run_end_to_end_with_every_method_tuned_by_the_one_rule_and_read_on_its_frontier(
    family, pipes, evaluator, tmp_path
):
    pipe = pipes[family]
    results = _tiny_baselines_report(pipe, family, evaluator, tmp_path, "pytest")
    saved = json.loads((tmp_path / "tiny.json").read_text())
    assert {run["sampler"] for run in saved["runs"]} == set(experiment_samplers("baselines"))
    assert set(saved["aggregates"]["paired"]) == set(experiment_samplers("baselines")) - {"official"}
    tuning = saved["knob_tuning"]
    assert tuning["seed"] == 10_000 and tuning["seed_space"] == "tuning" and tuning["num_samples"] == 4
    assert set(tuning["samplers"]) == set(BASELINE_METHODS) and tuning["budget"] == 2
    assert tuning["untied"] == {"untied": {"8": None}}  # calibrated coefficients, not tuned
    markdown = (tmp_path / "tiny.md").read_text()
    assert "## Samplers tuned on the tuning bank" in markdown
    by_run = {(run["sampler"], run["seed"]): run for run in results["runs"] if run[results["diversity_knob"]] is None}
    curves = set()
    for name, method in BASELINE_METHODS.items():
        entry = tuning["samplers"][name]["by_steps"]["8"]
        assert entry["rule"] == RULE and entry["budget"] == 2
        assert 1 <= entry["candidates_tried"] == len(entry["candidates"]) <= 2
        assert entry["candidates"][0] == {**entry["candidates"][0], **START[method], "phase": "start"}
        curves.add(json.dumps(entry["official_curve"]))
        # the knob chosen on the bank is the knob the benchmark ran
        assert saved["samplers"][name]["knobs_by_steps"]["8"] == entry["chosen"]
        assert f"| {name} | 8 | the same |" in markdown
        if entry["outcome"] != "accepted":  # the neutral value: the official sampler's samples, bit for bit
            assert entry["chosen"] == neutral_knobs(method)
            for seed in TINY.seeds:
                assert by_run[name, seed]["per_sample"] == by_run["official", seed]["per_sample"]
        else:
            assert entry["best_vs_official"]["ratio_ci"][1] < 1 and entry["chosen"] == {
                k: v for k, v in entry["best"].items() if k in START[method]
            }
    assert len(curves) == 1  # one official curve on the bank, shared by every method
    # the headline: every sampler on its own frontier at official's entropy, the raw ratio beside it
    frontiers = saved["frontiers"]["by_sampler"]
    assert set(frontiers) == set(experiment_samplers("baselines")) - {"official"}
    for name, by_nfe in frontiers.items():
        row = by_nfe["8"]
        assert row["points"] == 1 + len(FRONTIER[family])
        assert row["raw_ratio"] == saved["aggregates"]["paired"][name]["8"]["gen_ppl_ratio"]
        if row["ratio"] is not None:
            assert row["reference_gen_ppl"] == pytest.approx(
                saved["aggregates"]["by_sampler"]["official"]["8"]["gen_ppl"]["mean"]
            )
    assert "## At official's entropy, each sampler on its own frontier" in markdown
    heads = saved["frontiers"]["head_to_head"].get("8", [])
    assert all(row["sampler"] == "untied" and row["against"] in BASELINE_METHODS for row in heads)


def test_benchmark_command_tunes_samples_and_scores_the_baselines(pipes, evaluator, tmp_path, capsys):
    pipes["elf"].save_pretrained(tmp_path / "tiny-elf")
    assert load_pipeline(tmp_path / "tiny-elf").ace_statistics is not None  # the component round-trips
    evaluator[0].save_pretrained(tmp_path / "evaluator")
    evaluator[1].save_pretrained(tmp_path / "evaluator")
    argv = ["benchmark", str(tmp_path / "tiny-elf"), "--experiment", "baselines", "--nfe", "8", "--seeds", "0"]
    argv += ["--num-samples", "2", "--batch-size", "2", "--tune-num-samples", "2", "--tune-budget", "2"]
    argv += ["--no-progress", "--evaluator", str(tmp_path / "evaluator")]
    # one machine: tuned, sampled and scored in one command
    assert main([*argv, "--output-dir", str(tmp_path / "one"), "--num-resamples", "20"]) == 0
    one = json.loads((tmp_path / "one" / "tiny-elf-baselines.json").read_text())
    assert set(one["knob_tuning"]["samplers"]) == set(BASELINE_METHODS)
    captured = capsys.readouterr()
    assert "## Samplers tuned on the tuning bank" in captured.out
    # without bars, a line per scored bank run: each comparison method's candidates and official's curve
    logged = re.findall(r" NFE 8 \{'scheduler': '(\w+)'", captured.err)
    assert {"official", "momentum", "ace", "higs", "higs_ace", "multistep"} <= set(logged)
    # no evaluator where the bank is sampled: refused (the search needs the scores as it goes)
    with pytest.raises(SystemExit, match="needs --tune-here"):
        main([*argv, "--output-dir", str(tmp_path / "gen"), "--generate-only", "--store", str(tmp_path / "gen")])
    # tuned here, sampled here, scored elsewhere (the run store carries the bank runs' samples and the candidates beside
    # the runs): the same report
    carrier = tmp_path / "carrier"
    assert main([*argv, "--generate-only", "--tune-here", "--store", str(carrier)]) == 0
    [(_, generation, _)] = RunStore(carrier).sweeps()
    assert "--tune-budget 2" in generation["command"]
    assert generation[CANDIDATES_KEY]["bank"]["num_samples"] == 2
    bank = [run for run in generation["runs"] if "bank_key" in run]
    assert bank and all(run["sampler"].startswith("tuning bank: ") for run in bank)
    # its bank was scored here only to choose: the store has the bank's samples to score there, no scored bank run
    assert not (carrier / "banks").exists() and RunStore(carrier).bank_runs() == []
    shutil.copytree(carrier, tmp_path / "store")  # the sampled part, unscored, for --store-from below
    with pytest.raises(SystemExit, match="drop --tune-seed"):
        main(["benchmark", "--store", str(carrier), "--tune-seed", "5"])
    score = ["benchmark", "--store", str(carrier), "--evaluator", str(tmp_path / "evaluator")]
    score += ["--output-dir", str(tmp_path / "results")]
    assert main([*score, "--num-resamples", "20", "--no-progress"]) == 0
    saved = json.loads((tmp_path / "results" / "tiny-elf-baselines.json").read_text())
    assert {key: value for key, value in saved["knob_tuning"].items() if key != "evaluator"} == {
        key: value for key, value in one["knob_tuning"].items() if key != "evaluator"
    }
    assert saved["knob_tuning"]["evaluator"] == str(tmp_path / "evaluator")
    assert [run["per_sample"] for run in saved["runs"]] == [run["per_sample"] for run in one["runs"]]
    assert "banks_written" not in saved["store"] and not (carrier / "banks").exists()  # its bank scores: scores/
    # --store-from: the runs and the bank take the first report's scores through a store (the first of each scored
    # again as the check), the same report
    first = str(tmp_path / "results" / "tiny-elf-baselines.json")
    reuse = ["benchmark", "--store", str(tmp_path / "store"), "--evaluator", str(tmp_path / "evaluator")]
    reuse += ["--output-dir", str(tmp_path / "results-reuse"), "--num-resamples", "20", "--no-progress"]
    reuse += ["--store-from", first]
    assert main(reuse) == 0
    lent = json.loads((tmp_path / "results-reuse" / "tiny-elf-baselines.json").read_text())
    assert lent["runs"] == saved["runs"] and lent["knob_tuning"] == saved["knob_tuning"]
    assert lent["bank_scores"] == saved["bank_scores"]
    # every bank run the search asked for and every run is read, none scored and kept
    assert lent["store"]["scores_written"] == 0 and lent["store"]["scores_read"] >= len(bank)
    checked = lent["store"]["checked_runs"]
    assert len(checked) == 2 and checked[0].startswith("bank run ") and checked[1].startswith("official at NFE 8")
    with pytest.raises(SystemExit, match="--tune-here chooses the comparison samplers' knobs before sampling"):
        main([*argv, "--tune-here"])  # without --generate-only
    with pytest.raises(SystemExit, match="drop --tune-here"):
        main([*score, "--tune-here"])
    with pytest.raises(SystemExit, match="--tune-seed tune the comparison samplers' knobs"):
        main(["benchmark", str(tmp_path / "tiny-elf"), "--tune-seed", "5", "--generate-only"])


def test_ace_command_writes_the_component_and_refuses_to_overwrite_it(langflow_golden, tmp_path, capsys):
    _pipe("langflow", langflow_golden, ace=False).save_pretrained(tmp_path / "pipe")
    argv = ["ace", str(tmp_path / "pipe"), "--num-trajectories", "3", "--nfe", "3", "--batch-size", "3"]
    assert main([*argv, "--no-progress"]) == 0
    assert "ACE direction" not in capsys.readouterr().err  # no bar, not even the pipeline's own
    # A fresh interpreter loads the component (diffusers loads only classes whose module is already imported).
    check = (
        "from untied_sc.pipelines import load_pipeline; import sys; print(load_pipeline(sys.argv[1]).ace_statistics)"
    )
    loaded_apart = subprocess.run(
        [sys.executable, "-c", check, str(tmp_path / "pipe")], capture_output=True, text=True, timeout=300
    )
    assert loaded_apart.returncode == 0 and "ACEStatistics" in loaded_apart.stdout, loaded_apart.stderr
    loaded = load_pipeline(tmp_path / "pipe")
    config = loaded.ace_statistics.config
    assert config.num_trajectories == 3 and config.seed == 3000 and config.seed_space == "ace"
    loaded.ace_statistics.check_model(loaded.transformer)
    assert main([*argv, "--no-progress"]) == 2
    assert main([*argv, "--no-progress", "--overwrite", "--seed", "3100"]) == 0
    assert load_pipeline(tmp_path / "pipe").ace_statistics.config.seed == 3100
    assert "already exists; pass --overwrite" in capsys.readouterr().err
    assert main(["ace", str(tmp_path / "nowhere")]) == 2
    assert "does not exist: give the path of a local pipeline folder" in capsys.readouterr().err


def test_the_record_says_how_the_untied_coefficients_were_chosen(langflow_golden, evaluator):
    from untied_sc_lab.experiments.baselines import untied_tuning_record
    from untied_sc_lab.tuning.tune import tune_coefficients

    pipe = _pipe("langflow", langflow_golden, ace=False)
    assert untied_tuning_record(pipe, [8]) == {8: None}
    result = tune_coefficients(pipe, [8], num_samples=4, batch_size=2, budget=2, evaluator=evaluator, progress=False)[
        0
    ]
    record = untied_tuning_record(pipe, [8, 16])
    tuned = record[8]
    assert record[16] is None and tuned.seed == 10_000 and tuned.num_samples == 4 and tuned.layout == "untied"
    assert tuned.seed_space == "tuning" and tuned.rule == RULE and tuned.budget == 2
    assert tuned.chosen == result.chosen and tuned.outcome == result.outcome
    run = result.best.run if result.kept else result.curve.default
    assert tuned.chosen_scores.gen_ppl == pytest.approx(run.gen_ppl)
    assert tuned.edges == result.edges and set(result.edges) == {"eta_r", "eta_t", "eta_o", "alpha"}
    # a report of the untied sampler alone names the rule from its record, and where its pick lies on each knob
    from untied_sc_lab.experiments.report import _knob_lines
    from untied_sc_lab.experiments.tuning_records import KnobTuning, untied_to_json

    tuning = {"seed": 10_000, "seed_space": "tuning", "num_samples": 4, "batch_size": 2, "evaluator": "tiny"}
    tuning.update(protocol="langflow", budget=2, confidence=0.95, ace=None, samplers={})
    tuning.update(untied=untied_to_json({"untied": record}))
    text = "\n".join(_knob_lines(KnobTuning.from_json(tuning)))
    assert f"at most): {RULE}." in text
    row = next(line for line in text.splitlines() if line.startswith("| untied | 8 |"))
    assert "| the same (`untied-sc tune`) |" in row and f"eta_t: {result.edges['eta_t']}" in row
    # a record of the entropy-guard rule (the bundled folders' 32- and 64-NFE ones) is read, and says its rule
    old = {
        "seed": 10_000,
        "num_samples": 32,
        "max_entropy_drop": 0.05,
        "chosen": {"eta_r": 2.5, "eta_t": 0.0, "eta_o": 1.0, "alpha": 1.0, "gen_ppl": 1324.9, "entropy": 4.44},
        "best_vs_official": {"mean_delta_nll_ci": [-0.19, -0.015]},
    }
    pipe.scheduler.register_to_config(tuning_by_steps={"8": old})
    legacy = untied_tuning_record(pipe, [8])[8]
    assert legacy.outcome == "accepted" and legacy.rule.startswith("earlier rule: entropy guard of 0.05")
    assert legacy.seed_space == "benchmark" and legacy.layout == "untied grid" and legacy.chosen_scores.entropy == 4.44
    assert list(legacy.to_json()["chosen_scores"]) == ["gen_ppl", "entropy"]


def _without_timings(tree):
    """Aggregates without the wall-time figures (samples per second, retained throughput): they differ run to run."""
    if not isinstance(tree, dict):
        return tree
    return {k: _without_timings(v) for k, v in tree.items() if k not in ("samples_per_second", "retained_throughput")}


@pytest.mark.parametrize("family", ["langflow", "elf"])
@pytest.mark.parametrize("keep", ["rule", "every best value"])
def test_tuning_here_then_scoring_elsewhere_gives_the_one_machine_report(
    family, keep, pipes, evaluator, tmp_path, monkeypatch
):
    if keep == "every best value":  # the tiny bank wins nothing beyond noise: make the picks run too
        unread = EntropyRatio(**dict.fromkeys(RATIO_FIELDS), entropy_resampled=False)  # a comparison, none read
        monkeypatch.setattr(search, "keep_test", lambda best, *args: (unread, best is not None))
    pipe = pipes[family]
    scoring = ScoringSettings(evaluator, num_resamples=50)
    samplers, record = tune_baselines(pipe, BASELINES, evaluator, TUNING, progress=False)
    one = run_sweep(pipe, replace(TINY, samplers=samplers), scoring, knob_tuning=record, name="one", progress=False)
    generation = generate_baseline_candidates(pipe, BASELINES, TUNING, evaluator=evaluator, name="two", progress=False)
    store_sweep(RunStore(tmp_path / "store"), generation)  # through a run store, as between two machines
    two = score_baseline_candidates(read_stored_sweeps(RunStore(tmp_path / "store")), scoring, progress=False)
    assert two["knob_tuning"] == one["knob_tuning"] and two["samplers"] == one["samplers"]
    outcomes = {entry["by_steps"]["8"]["outcome"] for entry in two["knob_tuning"]["samplers"].values()}
    assert "accepted" in outcomes or keep == "rule"
    sampled = set(generation.tuned_when_sampled.sampled[8])
    accepted = {
        name
        for name, entry in two["knob_tuning"]["samplers"].items()
        if entry["by_steps"]["8"]["outcome"] == "accepted"
        and not is_neutral(
            two["samplers"][name]["scheduler"], SamplerSpec.from_json(two["samplers"][name]).knobs_at(8)
        )
    }
    # a method at its neutral value (switched off, or picked there) runs as official: not sampled again
    assert sampled == {"official", "untied", *accepted}
    key = ("sampler", "nfe", "seed")
    assert [tuple(run[k] for k in key) for run in two["runs"]] == [tuple(run[k] for k in key) for run in one["runs"]]
    for mine, theirs in zip(two["runs"], one["runs"], strict=True):
        assert mine["per_sample"] == theirs["per_sample"], (mine["sampler"], mine["seed"])
    assert _without_timings(two["aggregates"]) == _without_timings(one["aggregates"])


def test_tuned_parts_sampled_per_nfe_merge_into_the_one_command_comparison(langflow_golden, evaluator, tmp_path):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[4, 8], bank_size=4, batch_size=4, progress=False)
    pipe.register_modules(
        ace_statistics=estimate_ace_direction(
            pipe, num_trajectories=6, num_inference_steps=4, batch_size=3, progress=False
        )
    )
    options = {"evaluator": evaluator, "name": "m", "progress": False}
    settings = replace(BASELINES, seeds=[0])
    whole = generate_baseline_candidates(pipe, replace(settings, nfe=[4, 8]), TUNING, **options)
    store = RunStore(tmp_path / "store")
    parts = [generate_baseline_candidates(pipe, replace(settings, nfe=[n]), TUNING, **options) for n in (8, 4)]
    for part in parts:
        store_sweep(store, part)
    merged = read_stored_sweeps(store)
    assert merged.candidates == whole.candidates
    assert sorted((r.sampler, r.nfe) for r in merged.sampled_runs) == sorted(
        (r.sampler, r.nfe) for r in whole.sampled_runs
    )
    scored = [
        score_baseline_candidates(g, ScoringSettings(evaluator, num_resamples=50), progress=False)
        for g in (whole, merged)
    ]
    assert scored[0]["knob_tuning"] == scored[1]["knob_tuning"]
    assert [r["per_sample"] for r in scored[0]["runs"]] == [r["per_sample"] for r in scored[1]["runs"]]
    assert _without_timings(scored[0]["aggregates"]) == _without_timings(scored[1]["aggregates"])
    assert scored[1]["knob_tuning"]["ace"]["direction_sha256"] == merged.candidates.ace.direction_sha256
    candidates = parts[1].candidates
    other = replace(parts[1], candidates=replace(candidates, ace=replace(candidates.ace, direction_sha256="another")))
    store_sweep(store, other)  # the part sampled again, with another direction: it replaces its entry
    with pytest.raises(ValueError, match="differ in baseline_candidates.ace"):
        read_stored_sweeps(store)


def test_a_subset_of_samplers_tuned_with_a_store_resumes_and_names_its_samplers(pipes, evaluator, tmp_path, capsys):
    pipes["langflow"].save_pretrained(tmp_path / "tiny-langflow")
    evaluator[0].save_pretrained(tmp_path / "evaluator")
    evaluator[1].save_pretrained(tmp_path / "evaluator")
    store = tmp_path / "store"
    argv = ["benchmark", str(tmp_path / "tiny-langflow"), "--experiment", "baselines", "--nfe", "8", "--seeds", "0"]
    argv += ["--num-samples", "2", "--batch-size", "2", "--tune-num-samples", "2", "--tune-budget", "2"]
    argv += ["--no-progress", "--evaluator", str(tmp_path / "evaluator"), "--num-resamples", "20"]
    base, argv = argv, [*argv, "--samplers", "HiGS", "untied", "--store", str(store)]
    assert main([*argv, "--output-dir", str(tmp_path / "first")]) == 0
    first = json.loads((tmp_path / "first" / "tiny-langflow-baselines.json").read_text())
    assert list(first["samplers"]) == ["official", "untied", "HiGS"]  # the experiment's order, official first
    assert set(first["knob_tuning"]["samplers"]) == {"HiGS"}
    assert {run["sampler"] for run in first["runs"]} == {"official", "untied", "HiGS"}
    assert "--samplers HiGS untied" in first["command"]
    banks = RunStore(store).bank_runs()  # official's curve and HiGS's candidates, one entry each
    assert len(banks) > 2 and {json.loads(key.spec)["scheduler"] for key, _ in banks} == {"official", "higs"}
    assert first["store"]["banks_written"] == len(banks) and "banks_read" not in first["store"]
    # a second run finds every bank run in the store: nothing is sampled for the tuning, the same choice
    stamps = {path.name: path.stat().st_mtime_ns for path in (store / "banks").iterdir()}
    assert main([*argv, "--output-dir", str(tmp_path / "second")]) == 0
    second = json.loads((tmp_path / "second" / "tiny-langflow-baselines.json").read_text())
    assert {path.name: path.stat().st_mtime_ns for path in (store / "banks").iterdir()} == stamps
    assert second["store"]["banks_read"] == len(banks) and "banks_written" not in second["store"]
    report = (tmp_path / "second" / "tiny-langflow-baselines.md").read_text()
    assert f"Scores of {len(banks)} tuning-bank runs were read from the run store {store}" in report
    assert "tuning-bank runs were read" not in (tmp_path / "first" / "tiny-langflow-baselines.md").read_text()
    assert second["knob_tuning"] == first["knob_tuning"]
    assert [run["per_sample"] for run in second["runs"]] == [run["per_sample"] for run in first["runs"]]
    capsys.readouterr()
    with pytest.raises(SystemExit, match="'HiGS2' is not among the baselines experiment's samplers: 'official'"):
        main([*base, "--samplers", "HiGS2", "--output-dir", str(tmp_path / "bad")])
    with pytest.raises(SystemExit, match="--tune-budget tune the comparison samplers' knobs"):
        main(["benchmark", str(tmp_path / "tiny-langflow"), "--tune-budget", "2", "--store", str(store)])


def test_the_bank_is_named_by_the_evaluator_name_given_so_tune_and_benchmark_share_a_store(pipes, evaluator, tmp_path):
    # The benchmark loads its evaluator before tuning; its bank runs must still name it as `untied-sc tune` does (by
    # the name the user gave), or the bank runs tune stored would be another bank's, never read.
    samplers = {"official": {}, "HiGS": {"scheduler": "higs"}}
    settings = SweepSettings(nfe=[8], seeds=[0], num_samples=2, batch_size=2, samplers=samplers)
    tune_baselines(
        pipes["langflow"],
        settings,
        evaluator,
        TuningSettings(num_samples=2, budget=2),
        progress=False,
        store=tmp_path / "store",
        evaluator_name="smollm2-135m",
    )
    assert {key.evaluator for key, _ in RunStore(tmp_path / "store").bank_runs()} == {"smollm2-135m"}
    assert getattr(evaluator[0], "name_or_path", None) != "smollm2-135m"


def test_the_tuning_settings_are_one_record_with_the_defaults_of_tune_and_the_benchmark():
    defaults = (TUNE_SEED, TUNE_NUM_SAMPLES, TUNE_BUDGET, TUNE_CONFIDENCE, None, EXTRAPOLATE)
    assert DEFAULT_TUNING == TuningSettings(*defaults)
    assert (TUNE_NUM_SAMPLES, TUNE_CONFIDENCE) == (64, 0.95)
    tune = build_parser().parse_args(["tune", "PIPE", "--nfe", "8"])
    assert (tune.seed, tune.num_samples, tune.budget, tune.confidence, tune.extrapolate) == (
        DEFAULT_TUNING.seed,
        DEFAULT_TUNING.num_samples,
        DEFAULT_TUNING.budget,
        DEFAULT_TUNING.confidence,
        DEFAULT_TUNING.extrapolate,
    )
    # the benchmark's options fill in the same defaults, and its one record carries what was given
    args = build_parser().parse_args(["benchmark", "PIPE", "--experiment", "baselines", "--tune-budget", "3"])
    for key, default in TUNING_DEFAULTS.items():
        setattr(args, key, default if getattr(args, key) is None else getattr(args, key))
    assert _tuning_settings(args) == replace(DEFAULT_TUNING, budget=3)
    args.tune_seed, args.tune_num_samples, args.confidence = 5, 8, 0.9
    assert _tuning_settings(args) == TuningSettings(seed=5, num_samples=8, budget=3, confidence=0.9)


# ---- `benchmark --rescore`: a report's samples under a second evaluator -------------------------------------------


@pytest.fixture(scope="module")
def tiny_report(pipes, evaluator, tmp_path_factory):
    """A tiny LangFlow baselines report (every sampler on its own frontier) with its samples file beside it."""
    folder = tmp_path_factory.mktemp("first")
    command = "untied-sc benchmark tiny-langflow --experiment baselines"
    _tiny_baselines_report(pipes["langflow"], "langflow", evaluator, folder, command)
    return folder / "tiny.json"


@pytest.fixture(scope="module")
def second_evaluator(tmp_path_factory):
    """Another tiny evaluator of the same vocabulary (other random weights), saved as a model folder."""
    folder = tmp_path_factory.mktemp("second-evaluator")
    for part in tiny_evaluator(seed=1):
        part.save_pretrained(folder)
    return folder


def _dumped(tree) -> str:
    """A JSON tree as text: NaN compares equal to NaN."""
    return json.dumps(tree, sort_keys=True)


def test_kendall_tau_b_counts_concordant_pairs_and_ties():
    from untied_sc_lab.experiments.rescore import kendall_tau

    assert kendall_tau([1, 2, 3, 4], [10, 30, 20, 40]) == pytest.approx(4 / 6)  # 5 concordant, 1 discordant
    assert kendall_tau([1, 2, 3], [3, 2, 1]) == -1.0
    assert kendall_tau([1, 1, 2], [1, 2, 3]) == pytest.approx(2 / (2 * 3) ** 0.5)  # tau-b: a's tie in the denominator
    assert kendall_tau([1.0], [2.0]) is None and kendall_tau([1, 1], [1, 2]) is None


def test_rescore_scores_the_same_runs_under_a_second_evaluator_and_sets_the_headlines_side_by_side(
    tiny_report, second_evaluator, tmp_path, capsys
):
    first = json.loads(tiny_report.read_text())
    out = tmp_path / "rescored"
    argv = ["benchmark", "--rescore", str(tiny_report), "--evaluator", str(second_evaluator), "--dtype", "float32"]
    assert main([*argv, "--output-dir", str(out), "--num-resamples", "50", "--no-progress"]) == 0
    assert "## Evaluator control: LlamaForCausalLM and second-evaluator" in capsys.readouterr().out
    name = f"tiny-{second_evaluator.name}"
    second = json.loads((out / f"{name}.json").read_text())
    # (c) the samples are stored once: the new report names the first one's file, and writes none of its own
    assert sorted(path.name for path in out.iterdir()) == [f"{name}.{ext}" for ext in ("json", "md", "png")]
    assert (out / second["samples_file"]).resolve() == (tiny_report.parent / "tiny.samples.jsonl.gz").resolve()
    source = second["rescored_from"]
    assert (out / source.pop("report")).resolve() == tiny_report.resolve()
    assert source == {"evaluator": first["evaluator"], "evaluator_description": first["evaluator_description"]}
    # (b) the same samplers, knobs and runs (timings too); the knobs chosen under the first evaluator, kept
    structure = ("sampler", "nfe", "seed", "temperature", "seconds", "num_samples")
    assert [[run[k] for k in structure] for run in second["runs"]] == [
        [run[k] for k in structure] for run in first["runs"]
    ]
    for key in ("samplers", "coefficients", "knob_tuning", "nfe", "seeds", "diversity_values", "diversity_samplers"):
        assert second[key] == first[key], key
    assert second["evaluator"] == str(second_evaluator) and second["protocol"] == first["protocol"]
    # (a) every run's scores are the samples scored directly with the second evaluator (`untied-sc evaluate`)
    direct = tmp_path / "direct.json"
    samples = tiny_report.parent / "tiny.samples.jsonl.gz"
    evaluate = ["evaluate", str(samples), "--evaluator", str(second_evaluator), "--dtype", "float32"]
    assert main([*evaluate, "--output", str(direct)]) == 0
    runs = json.loads(direct.read_text())["runs"]
    assert len(runs) == len(second["runs"])
    for scored, run in zip(runs, second["runs"], strict=True):
        assert scored["run"]["sampler"] == run["sampler"] and scored["run"]["seed"] == run["seed"]
        assert run["per_sample"]["nll_sum"] == pytest.approx([s["nll_sum"] for s in scored["per_sample"]], rel=1e-6)
        assert run["gen_ppl"] == pytest.approx(scored["gen_ppl"], rel=1e-6)
    assert [run["per_sample"]["nll_sum"] for run in second["runs"]] != [
        run["per_sample"]["nll_sum"] for run in first["runs"]
    ]  # another evaluator: other scores
    # (d) the control: both evaluators' headlines, the rank agreement and the NLL correlation
    control = second["evaluator_control"]
    # every rival was switched off by its tuning here (official's samples) and untied's frontier does not reach
    # official's entropy: the headline reads official's curve at each sampler's entropy
    assert all(
        row["switched_off"]
        for name, by in first["frontiers"]["by_sampler"].items()
        if name != "untied"
        for row in by.values()
    )
    assert control["reading"] == "baseline curve"
    assert set(control["by_sampler"]) == set(first["aggregates"]["paired"])
    for sampler, by_nfe in control["by_sampler"].items():
        for report, side in ((first, "first"), (second, "second")):
            row = by_nfe["8"][side]
            curve = report["equal_entropy"].get(sampler, {}).get("8") or {}
            assert row["ratio"] == curve.get("ratio") and row["ratio_ci"] == curve.get("ratio_ci")
            assert row["raw_ratio"] == report["aggregates"]["paired"][sampler]["8"]["gen_ppl_ratio"]
    for kind, key in (("equal_entropy", "ratio"), ("raw", "raw_ratio")):
        agreement = control["rank_agreement"][kind]["8"]
        both = [
            s
            for s, by_nfe in control["by_sampler"].items()
            if None not in (by_nfe["8"]["first"][key], by_nfe["8"]["second"][key])
        ]
        assert agreement["ranked"] == both and agreement["num_ranked"] == len(both)
    raw = control["rank_agreement"]["raw"]["8"]
    assert raw["num_ranked"] == len(first["aggregates"]["paired"]) and -1 <= raw["kendall_tau"] <= 1
    correlation = control["nll_correlation"]
    distinct = {_dumped(run["per_sample"]["mean_nll"]) for run in first["runs"]}
    assert correlation["num_samples"] == 4 * len(distinct) and -1 <= correlation["pearson"] <= 1
    markdown = (out / f"{name}.md").read_text()
    assert "These knobs were chosen under the first report's evaluator (LlamaForCausalLM)" in markdown
    assert "- NFE 8: at equal entropy τ" in markdown and "Per-sample NLL per token under" in markdown
    # the recorded command reproduces the report
    assert second["scoring_command"].startswith(f"untied-sc benchmark --evaluator {second_evaluator}")
    assert main([*shlex.split(second["scoring_command"])[1:], "--overwrite"]) == 0
    again = json.loads((out / f"{name}.json").read_text())
    assert _dumped([run["per_sample"] for run in again["runs"]]) == _dumped(
        [run["per_sample"] for run in second["runs"]]
    )
    assert _dumped(again["evaluator_control"]) == _dumped(control)


def test_a_rescore_with_a_store_reads_back_what_it_scored(tiny_report, second_evaluator, tmp_path, capsys):
    store, out = tmp_path / "store", tmp_path / "rescored"
    argv = ["benchmark", "--rescore", str(tiny_report), "--evaluator", str(second_evaluator), "--dtype", "float32"]
    argv += ["--output-dir", str(out), "--num-resamples", "50", "--no-progress", "--store", str(store)]
    assert main(argv) == 0
    name = f"tiny-{second_evaluator.name}"
    first = json.loads((out / f"{name}.json").read_text())
    written = first["store"]["scores_written"]
    assert first["store"]["scores_read"] == 0 and written == len(list((store / "scores").iterdir())) > 0
    assert main([*argv, "--overwrite"]) == 0  # as a resumed run would: every run read back, none scored
    again = json.loads((out / f"{name}.json").read_text())
    assert (again["store"]["scores_read"], again["store"]["scores_written"]) == (written, 0)
    assert _dumped(again["runs"]) == _dumped(first["runs"])
    markdown = (out / f"{name}.md").read_text()
    assert f"Samples of 0 runs and scores of {written} runs were read from the run store {store}" in markdown


def test_rescore_with_the_report_s_own_evaluator_gives_back_the_report(tiny_report, evaluator, tmp_path):
    from untied_sc_lab.experiments.rescore import rescore_report

    first = json.loads(tiny_report.read_text())
    scoring = ScoringSettings(evaluator, num_resamples=50)
    again = rescore_report(tiny_report, scoring, name="again", output_dir=tmp_path, progress=False)
    written = json.loads((tmp_path / "again.json").read_text())
    for key in ("runs", "aggregates", "diversity_curves", "equal_entropy", "frontiers", "knob_tuning", "samplers"):
        assert _dumped(written[key]) == _dumped(first[key]), key
    control = again["evaluator_control"]
    assert control["nll_correlation"]["pearson"] == pytest.approx(1.0)
    for kind in ("equal_entropy", "raw"):
        tau = control["rank_agreement"][kind]["8"]["kendall_tau"]
        assert tau is None or tau == pytest.approx(1.0)  # one ranking: every untied pair concordant


def test_rescore_refusals_come_before_any_scoring(tiny_report, second_evaluator, tmp_path, capsys):
    rescore = ["benchmark", "--rescore", str(tiny_report), "--output-dir", str(tmp_path)]
    with pytest.raises(SystemExit, match="nothing to control. Give another --evaluator"):
        main([*rescore, "--evaluator", "LlamaForCausalLM", "--dtype", "float32"])
    with pytest.raises(SystemExit, match="would replace .*tiny.json itself"):
        main([*rescore[:-1], str(tiny_report.parent), "--evaluator", str(second_evaluator), "--name", "tiny"])
    for extra in (["tiny-langflow"], ["--nfe", "8"], ["--samplers", "HiGS"], ["--protocol", "elf"], ["--main-only"]):
        with pytest.raises(SystemExit, match=f"drop {extra[0]}"):
            main([*rescore, "--evaluator", str(second_evaluator), *extra])
    with pytest.raises(SystemExit):  # one source of runs: argparse refuses the pair
        main([*rescore, "--generate-only"])
    assert "not allowed with argument" in capsys.readouterr().err
    (tmp_path / f"tiny-{second_evaluator.name}.md").write_text("taken")
    assert main([*rescore, "--evaluator", str(second_evaluator)]) == 2
    assert "already exists: pass --overwrite" in capsys.readouterr().err
    lone = tmp_path / "lone"
    lone.mkdir()
    (lone / "tiny.json").write_text(tiny_report.read_text())  # without its samples file
    sweep = {"format": "untied-sc run store 1", "sweep": {"runs": []}, "keys": []}  # a run store's sweep part
    (lone / "sweep.json").write_text(json.dumps(sweep))
    for path, message in (
        (tmp_path / "missing.json", "no such file"),
        (lone / "tiny.json", "has no samples file beside it"),
        (lone / "sweep.json", "is not a benchmark report"),
    ):
        assert main(["benchmark", "--rescore", str(path), "--evaluator", str(second_evaluator)]) == 2
        assert message in capsys.readouterr().err
