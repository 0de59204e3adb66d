"""`untied-sc benchmark --experiment baselines`: the comparison samplers in the matched sweep, their knobs
chosen on the tuning bank, ACE's direction as a pipeline component; tiny golden pipelines under a tiny evaluator."""

import copy
import json
import math
import subprocess
import sys

import pytest

from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler
from untied_sc.calibration import baseline_knobs
from untied_sc.calibration.ace import estimate_ace_direction
from untied_sc.calibration.baseline_knobs import KNOB_GRIDS, KnobGrid, choose_knob
from untied_sc.calibration.tune import Candidate
from untied_sc.cli import main
from untied_sc.evaluation.sampling import build_scheduler
from untied_sc.experiments import run_sweep
from untied_sc.experiments.baseline_generation import (
    CANDIDATES_KEY,
    generate_baseline_candidates,
    score_baseline_candidates,
)
from untied_sc.experiments.baselines import tune_baselines
from untied_sc.experiments.definitions import BASELINE_METHODS, experiment_samplers, with_preset
from untied_sc.experiments.generation_files import (
    merge_generations,
    read_generation,
    read_generations,
    write_generation,
)
from untied_sc.pipelines import load_pipeline
from untied_sc.schedulers.comparison_names import comparison_scheduler_class

from .conftest import elf_from_golden, langflow_from_golden
from .test_tune import per_sample
from .tiny import tiny_evaluator, tiny_tokenizer


TUNING = {"tune_num_samples": 4, "progress": False}
SWEEP = {"nfe": [8], "seeds": [0, 1], "num_samples": 4, "batch_size": 2}


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
    assert {spec["scheduler"] for name, spec in samplers.items() if name in BASELINE_METHODS} == set(KNOB_GRIDS)
    assert with_preset(samplers, "langflow-lm1b")["Momentum"] == {"scheduler": "momentum"}  # no coefficients
    for family, pipe in pipes.items():
        for name, method in BASELINE_METHODS.items():
            grid = KNOB_GRIDS[method]
            spec = {"scheduler": method, "knobs_by_steps": {"8": grid.candidates()[0]}}
            scheduler = build_scheduler(pipe, spec, None, 8)
            assert type(scheduler) is comparison_scheduler_class(method, family), name
            assert {key: scheduler.config[key] for key in grid.knobs} == grid.candidates()[0]
            with pytest.raises(ValueError, match="knobs for NFE \\['8'\\] only, not 16"):
                build_scheduler(pipe, spec, None, 16)
    with pytest.raises(ValueError, match="has no config keys \\['eta_r'\\]"):
        build_scheduler(pipes["elf"], {"scheduler": "momentum", "eta_r": 1.0}, None, 8)


GRID = KnobGrid(("momentum_beta",), (1.0,), ((0.9,), (0.8,)), "test")
OFFICIAL = Candidate({}, 100.0, 5.0, True, per_sample(100.0))


def _scores(by_beta):
    """`score(knobs)` from `{β: (gen_ppl, entropy)}`, consistent per-sample NLLs (no noise)."""
    return lambda knobs: (*by_beta[knobs["momentum_beta"]], per_sample(by_beta[knobs["momentum_beta"]][0]))


def test_knob_tuning_keeps_the_neutral_value_when_the_entropy_guard_rejects_every_candidate():
    # both values lower GenPPL by losing 0.1 nats of entropy (the guard allows 0.05): the official sampler runs
    choice = choose_knob("momentum", 8, GRID, OFFICIAL, _scores({0.9: (90.0, 4.9), 0.8: (80.0, 4.9)}))
    assert choice.outcome == "no admissible candidate" and choice.best_vs_official is None
    assert choice.chosen == {"momentum_beta": 1.0}
    assert choice.chosen_scores == {"gen_ppl": 100.0, "entropy": 5.0}
    assert [c.admissible for c in choice.candidates] == [False, False]
    # a looser guard admits them: the lowest GenPPL wins
    loose = choose_knob("momentum", 8, GRID, OFFICIAL, _scores({0.9: (90.0, 4.9), 0.8: (80.0, 4.9)}), 0.2)
    assert loose.outcome == "accepted" and loose.chosen == {"momentum_beta": 0.8}
    assert loose.best_vs_official.mean_delta == pytest.approx(math.log(80.0 / 100.0))


def test_knob_tuning_keeps_the_lowest_admissible_genppl_only_when_it_beats_official_beyond_noise():
    # 0.8 is lower but inadmissible; 0.9 admissible and better on every pair: kept
    choice = choose_knob("momentum", 8, GRID, OFFICIAL, _scores({0.9: (95.0, 5.0), 0.8: (80.0, 4.0)}))
    assert choice.outcome == "accepted" and choice.chosen == {"momentum_beta": 0.9}
    # admissible but worse than official: neutral
    worse = choose_knob("momentum", 8, GRID, OFFICIAL, _scores({0.9: (105.0, 5.0), 0.8: (110.0, 5.0)}))
    assert worse.outcome == "no win beyond noise" and worse.chosen == {"momentum_beta": 1.0}
    assert worse.best_vs_official.mean_delta > 0


def test_missing_ace_statistics_fail_up_front_with_the_command_that_estimates_them(langflow_golden, evaluator):
    bare = _pipe("langflow", langflow_golden, ace=False)
    calls = []
    bare.transformer.register_forward_hook(lambda *args: calls.append(1))
    samplers = experiment_samplers("baselines")
    with pytest.raises(ValueError, match=r"'ACE', 'HiGS \+ ACE' need ACE's .*`untied-sc ace my-pipe`"):
        tune_baselines(bare, samplers, evaluator=evaluator, source="my-pipe", **SWEEP, **TUNING)
    with pytest.raises(ValueError, match="untied-sc ace PIPELINE_DIR"):
        run_sweep(bare, samplers={"official": {}, "ACE": {"scheduler": "ace"}}, evaluator=evaluator, **SWEEP)
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
            tune_baselines(pipe, samplers, evaluator=evaluator, **{**SWEEP, "seeds": [0, 3000]}, **TUNING)
        with pytest.raises(ValueError, match="--tune-seed must lie in"):
            tune_baselines(pipe, samplers, evaluator=evaluator, tune_seed=-1, **SWEEP, **TUNING)
    finally:
        pipe.register_modules(ace_statistics=original)
        hook.remove()
    assert not calls  # refused before any sampling


@pytest.mark.parametrize("family", ["langflow", "elf"])
def test_baselines_run_end_to_end_with_every_method_and_its_chosen_knob_in_the_report(
    family, pipes, evaluator, tmp_path
):
    pipe = pipes[family]
    samplers, record = tune_baselines(pipe, experiment_samplers("baselines"), evaluator=evaluator, **SWEEP, **TUNING)
    results = run_sweep(
        pipe,
        samplers=samplers,
        evaluator=evaluator,
        knob_tuning=record,
        num_resamples=50,
        progress=False,
        name="tiny",
        command="pytest",
        output_dir=tmp_path,
        **SWEEP,
    )
    saved = json.loads((tmp_path / "tiny.json").read_text())
    assert {run["sampler"] for run in saved["runs"]} == set(experiment_samplers("baselines"))
    assert set(saved["aggregates"]["paired"]) == set(experiment_samplers("baselines")) - {"official"}
    tuning = saved["knob_tuning"]
    assert (
        tuning["seed"] == 10_000
        and tuning["seed_space"] == "tuning"
        and tuning["num_samples"] == 4
        and set(tuning["samplers"]) == set(BASELINE_METHODS)
    )
    assert tuning["untied"] == {"untied": {"8": None}}  # calibrated coefficients, not tuned
    markdown = (tmp_path / "tiny.md").read_text()
    assert "## Knobs chosen on the tuning bank" in markdown
    by_run = {(run["sampler"], run["seed"]): run for run in results["runs"]}
    for name, method in BASELINE_METHODS.items():
        entry = tuning["samplers"][name]["by_steps"]["8"]
        grid = KNOB_GRIDS[method]
        assert entry["grid"] == grid.candidates() and len(entry["candidates"]) == len(grid.values)
        assert entry["outcome"] in ("accepted", "no admissible candidate", "no win beyond noise")
        # the knob chosen on the bank is the knob the benchmark ran
        assert saved["samplers"][name]["knobs_by_steps"]["8"] == entry["chosen"]
        assert f"| {name} | 8 |" in markdown
        if entry["outcome"] != "accepted":  # the neutral value: the official sampler's samples, bit for bit
            assert entry["chosen"] == grid.neutral_knobs()
            for seed in SWEEP["seeds"]:
                assert by_run[name, seed]["per_sample"] == by_run["official", seed]["per_sample"]
        else:
            admissible = [c["gen_ppl"] for c in entry["candidates"] if c["admissible"]]
            assert entry["chosen_scores"]["gen_ppl"] == min(admissible)
            assert entry["best_vs_official"]["mean_delta_nll_ci"][1] < 0


def test_benchmark_command_tunes_samples_and_scores_the_baselines(pipes, evaluator, tmp_path, capsys):
    pipes["elf"].save_pretrained(tmp_path / "tiny-elf")
    assert load_pipeline(tmp_path / "tiny-elf").ace_statistics is not None  # the component round-trips
    evaluator[0].save_pretrained(tmp_path / "evaluator")
    evaluator[1].save_pretrained(tmp_path / "evaluator")
    argv = ["benchmark", str(tmp_path / "tiny-elf"), "--experiment", "baselines", "--nfe", "8", "--seeds", "0"]
    argv += ["--num-samples", "2", "--batch-size", "2", "--tune-num-samples", "2", "--no-progress"]
    argv += ["--output-dir", str(tmp_path / "gen"), "--generate-only"]
    assert main(argv) == 0  # no evaluator on the sampling machine: every grid value and the tuning bank are sampled
    generation = json.loads((tmp_path / "gen" / "tiny-elf-baselines.generation.json").read_text())
    assert "knob_tuning" not in generation and "--evaluator" not in generation["command"]
    assert "--tune-num-samples 2" in generation["command"]
    assert generation[CANDIDATES_KEY]["bank"]["num_samples"] == 2
    grid_runs = sum(len(KNOB_GRIDS[method].values) for method in BASELINE_METHODS.values())
    assert len(generation["runs"]) == (2 + grid_runs) + (1 + grid_runs)  # benchmark runs, then the bank's
    with pytest.raises(SystemExit, match="drop --tune-seed"):
        main(["benchmark", "--from", str(tmp_path / "gen" / "tiny-elf-baselines.generation.json"), "--tune-seed", "5"])
    score = ["benchmark", "--from", str(tmp_path / "gen" / "tiny-elf-baselines.generation.json")]
    score += ["--evaluator", str(tmp_path / "evaluator"), "--output-dir", str(tmp_path / "results")]
    assert main([*score, "--num-resamples", "20", "--no-progress"]) == 0
    saved = json.loads((tmp_path / "results" / "tiny-elf-baselines.json").read_text())
    assert set(saved["knob_tuning"]["samplers"]) == set(BASELINE_METHODS)
    assert saved["knob_tuning"]["evaluator"] == str(tmp_path / "evaluator")
    assert {run["sampler"] for run in saved["runs"]} == set(experiment_samplers("baselines"))
    assert "## Knobs chosen on the tuning bank" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="--tune-seed tune the comparison samplers' knobs"):
        main(["benchmark", str(tmp_path / "tiny-elf"), "--tune-seed", "5", "--generate-only"])

    # --tune-here: the evaluator is here, so only the chosen knob values are sampled; --from scores it the same
    here = [*argv[:-3], "--output-dir", str(tmp_path / "here"), "--generate-only", "--tune-here"]
    assert main([*here, "--evaluator", str(tmp_path / "evaluator")]) == 0
    tuned = json.loads((tmp_path / "here" / "tiny-elf-baselines.generation.json").read_text())
    sampled = tuned["tuned_when_sampled"]["sampled"]["8"]
    assert tuned["tuned_when_sampled"]["evaluator"] == str(tmp_path / "evaluator")
    assert {run["sampler"] for run in tuned["runs"] if run["seed"] == 0} == set(sampled)
    chosen = {name: spec.get("knobs_by_steps", {}).get("8") for name, spec in saved["samplers"].items()}
    expected = {"official", "untied"} | {
        variant
        for variant, entry in tuned[CANDIDATES_KEY]["variants"].items()
        if chosen[entry["sampler"]] == entry["knobs"]
    }
    assert set(sampled) == expected
    score_here = [*score[:2], str(tmp_path / "here" / "tiny-elf-baselines.generation.json"), *score[3:-1]]
    assert main([*score_here, str(tmp_path / "results-here"), "--num-resamples", "20", "--no-progress"]) == 0
    again = json.loads((tmp_path / "results-here" / "tiny-elf-baselines.json").read_text())
    assert again["knob_tuning"] == saved["knob_tuning"]
    assert [run["per_sample"] for run in again["runs"]] == [run["per_sample"] for run in saved["runs"]]
    # --reuse-scores: the runs take the first report's scores (one scored again as the check), the same report
    reuse = [*score_here, str(tmp_path / "results-reuse"), "--num-resamples", "20", "--no-progress"]
    reuse += ["--reuse-scores", str(tmp_path / "results" / "tiny-elf-baselines.json")]
    assert main(reuse) == 0
    lent = json.loads((tmp_path / "results-reuse" / "tiny-elf-baselines.json").read_text())
    assert lent["runs"] == again["runs"] and lent["knob_tuning"] == again["knob_tuning"]
    assert lent["reused_scores"]["runs"] > 0 and "--reuse-scores" in lent["scoring_command"]
    assert lent["bank_scores"] == again["bank_scores"] == saved["bank_scores"]  # the bank lent too, one run checked
    assert lent["bank_scores_reused"]["runs"] == len(saved["bank_scores"]) - 1
    assert lent["bank_scores_reused"]["checked_difference"] == 0.0
    assert main([*reuse, "--overwrite", "--protocol", "langflow"]) == 2  # refused before the bank is scored
    assert "was scored with protocol 'elf' (here 'langflow')" in capsys.readouterr().err
    part = read_generation(tmp_path / "here" / "tiny-elf-baselines.generation.json")
    part["runs"] = [run for run in part["runs"] if run["sampler"] != "untied"]  # as if the part had not sampled it
    part["tuned_when_sampled"]["sampled"]["8"].remove("untied")
    with pytest.raises(ValueError, match="no benchmark run of 'untied' at NFE 8.*sampled with --tune-here, which"):
        score_baseline_candidates(part, evaluator=evaluator, num_resamples=20, progress=False)
    with pytest.raises(SystemExit, match="--tune-here chooses the comparison samplers' knobs before sampling"):
        main([*argv[:-1], "--tune-here"])  # without --generate-only
    with pytest.raises(SystemExit, match="drop --tune-here"):
        main([*score, "--tune-here"])


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
    assert "not a local pipeline folder" in capsys.readouterr().err


def test_the_record_says_how_the_untied_coefficients_were_chosen(langflow_golden, evaluator):
    from untied_sc.calibration.tune import tune_coefficients
    from untied_sc.experiments.baselines import untied_tuning_record

    pipe = _pipe("langflow", langflow_golden, ace=False)
    assert untied_tuning_record(pipe, [8]) == {"8": None}
    result = tune_coefficients(pipe, [8], num_samples=4, batch_size=2, evaluator=evaluator, progress=False)[0]
    record = untied_tuning_record(pipe, [8, 16])
    assert record["16"] is None and record["8"]["seed"] == 10_000 and record["8"]["num_samples"] == 4
    assert record["8"]["seed_space"] == "tuning"
    assert record["8"]["chosen"] == result.best.coefficients
    assert record["8"]["chosen_scores"]["gen_ppl"] == pytest.approx(result.best.gen_ppl)
    comparison = result.best_vs_official
    expected = (
        "no admissible candidate"
        if comparison is None
        else ("accepted" if comparison.mean_delta_ci[1] < 0 else "no win beyond noise")
    )
    assert record["8"]["outcome"] == expected


def _without_timings(tree):
    """Aggregates without the wall-time figures (samples per second, retained throughput): they differ run to run."""
    if not isinstance(tree, dict):
        return tree
    return {k: _without_timings(v) for k, v in tree.items() if k not in ("samples_per_second", "retained_throughput")}


@pytest.mark.parametrize("family", ["langflow", "elf"])
@pytest.mark.parametrize("keep", ["rule", "every best value"])
def test_sampling_every_grid_value_then_choosing_elsewhere_gives_the_one_machine_report(
    family, keep, pipes, evaluator, tmp_path, monkeypatch
):
    if keep == "every best value":  # the tiny bank wins nothing beyond noise: make the chosen grid values run too
        monkeypatch.setattr(baseline_knobs, "beats_official", lambda comparison: comparison is not None)
    pipe = pipes[family]
    options = {"num_resamples": 50, "progress": False}
    samplers, record = tune_baselines(pipe, experiment_samplers("baselines"), evaluator=evaluator, **SWEEP, **TUNING)
    one = run_sweep(pipe, samplers=samplers, evaluator=evaluator, knob_tuning=record, name="one", **SWEEP, **options)
    generation = generate_baseline_candidates(
        pipe, experiment_samplers("baselines"), tune_num_samples=4, progress=False, name="two", **SWEEP
    )
    write_generation(generation, tmp_path)  # through the files, as between two machines
    two = score_baseline_candidates(read_generation(tmp_path / "two.generation.json"), evaluator=evaluator, **options)
    assert two["knob_tuning"] == one["knob_tuning"] and two["samplers"] == one["samplers"]
    outcomes = {entry["by_steps"]["8"]["outcome"] for entry in two["knob_tuning"]["samplers"].values()}
    assert "accepted" in outcomes or keep == "rule"
    key = ("sampler", "nfe", "seed")
    assert [tuple(run[k] for k in key) for run in two["runs"]] == [tuple(run[k] for k in key) for run in one["runs"]]
    for mine, theirs in zip(two["runs"], one["runs"], strict=True):
        assert mine["per_sample"] == theirs["per_sample"], (mine["sampler"], mine["seed"])
    assert _without_timings(two["aggregates"]) == _without_timings(one["aggregates"])


@pytest.mark.parametrize("keep", ["rule", "every best value"])
def test_tuning_here_samples_only_the_chosen_values_and_scores_as_the_whole_grid(
    keep, pipes, evaluator, tmp_path, monkeypatch
):
    if keep == "every best value":  # the tiny bank wins nothing beyond noise: make chosen grid values run too
        monkeypatch.setattr(baseline_knobs, "beats_official", lambda comparison: comparison is not None)
    pipe, samplers = pipes["langflow"], experiment_samplers("baselines")
    options = {**SWEEP, "tune_num_samples": 4, "progress": False, "name": "m"}
    whole = generate_baseline_candidates(pipe, samplers, **options)
    here = generate_baseline_candidates(pipe, samplers, evaluator=evaluator, evaluator_name="tiny", **options)
    assert here[CANDIDATES_KEY] == whole[CANDIDATES_KEY] and here["samplers"] == whole["samplers"]
    write_generation(here, tmp_path)
    scored = [
        score_baseline_candidates(g, evaluator=evaluator, num_resamples=50, progress=False)
        for g in (whole, read_generation(tmp_path / "m.generation.json"))
    ]
    assert scored[1]["knob_tuning"] == scored[0]["knob_tuning"]
    assert [r["per_sample"] for r in scored[1]["runs"]] == [r["per_sample"] for r in scored[0]["runs"]]
    assert _without_timings(scored[1]["aggregates"]) == _without_timings(scored[0]["aggregates"])
    chosen = {
        variant
        for variant, entry in here[CANDIDATES_KEY]["variants"].items()
        if scored[0]["samplers"][entry["sampler"]]["knobs_by_steps"]["8"] == entry["knobs"]
    }
    assert bool(chosen) == (keep == "every best value")
    benchmark = {run["sampler"] for run in here["runs"] if run["seed"] in SWEEP["seeds"]}
    assert benchmark == {"official", "untied", *chosen} == set(here["tuned_when_sampled"]["sampled"]["8"])
    bank = [run for run in here["runs"] if run["sampler"].startswith("tuning bank: ")]
    assert [r["samples"] for r in bank] == [
        r["samples"] for r in whole["runs"] if r["sampler"] in {r["sampler"] for r in bank}
    ]


def test_candidate_parts_sampled_per_nfe_merge_into_the_one_command_comparison(langflow_golden, evaluator, tmp_path):
    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[4, 8], bank_size=4, batch_size=4, progress=False)
    pipe.register_modules(
        ace_statistics=estimate_ace_direction(
            pipe, num_trajectories=6, num_inference_steps=4, batch_size=3, progress=False
        )
    )
    options = {"seeds": [0], "num_samples": 4, "batch_size": 2, "tune_num_samples": 4, "progress": False}
    whole = generate_baseline_candidates(pipe, experiment_samplers("baselines"), nfe=[4, 8], name="m", **options)
    paths = [
        write_generation(
            generate_baseline_candidates(pipe, experiment_samplers("baselines"), nfe=[n], name="m", **options),
            tmp_path / str(n),
        )["generation"]
        for n in (8, 4)
    ]
    merged = read_generations(paths)
    assert merged[CANDIDATES_KEY] == whole[CANDIDATES_KEY]
    assert [(r["sampler"], r["nfe"]) for r in merged["runs"]] == [(r["sampler"], r["nfe"]) for r in whole["runs"]]
    scored = [
        score_baseline_candidates(g, evaluator=evaluator, num_resamples=50, progress=False) for g in (whole, merged)
    ]
    assert scored[0]["knob_tuning"] == scored[1]["knob_tuning"]
    assert [r["per_sample"] for r in scored[0]["runs"]] == [r["per_sample"] for r in scored[1]["runs"]]
    assert _without_timings(scored[0]["aggregates"]) == _without_timings(scored[1]["aggregates"])
    assert scored[1]["knob_tuning"]["ace"]["direction_sha256"] == merged[CANDIDATES_KEY]["ace"]["direction_sha256"]
    parts = [read_generation(path) for path in paths]
    parts[1][CANDIDATES_KEY]["ace"]["direction_sha256"] = "another direction"
    with pytest.raises(ValueError, match="differ in baseline_candidates.ace"):
        merge_generations(parts)
