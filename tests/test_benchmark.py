"""The matched benchmark sweep and the diversity knobs, on the tiny golden pipelines under a tiny evaluator."""

import json
import math
from dataclasses import replace

import pytest
import torch

from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler
from untied_sc.generation import SamplerSpec
from untied_sc.generation.sampling import batch_seed, build_scheduler
from untied_sc_lab.evaluation.aggregates import Aggregates, CurvePoint, MeanSE
from untied_sc_lab.experiments import ScoringSettings, SweepSettings, aggregate, run_sweep
from untied_sc_lab.experiments.aggregation import equal_entropy_comparison, gen_ppl_at_entropy, genppl_ratio_ci
from untied_sc_lab.experiments.definitions import experiment_samplers
from untied_sc_lab.experiments.records import RunRecord

from .conftest import elf_from_golden, langflow_from_golden
from .tiny import scored_run, tiny_evaluator, tiny_tokenizer


ZERO_STRENGTH = {"eta_r": 0.0, "eta_t": 0.0, "eta_o": 0.0, "alpha": 1.0}
TINY = SweepSettings(nfe=[8], seeds=[0, 1], num_samples=4, batch_size=2)


@pytest.fixture(scope="module")
def evaluator():
    return tiny_evaluator()


@pytest.fixture(scope="module")
def pipes(elf_golden, langflow_golden):
    elf = ELFPipeline(elf_from_golden(elf_golden), ELFScheduler(), tiny_tokenizer())
    langflow = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    for pipe in (elf, langflow):
        pipe.set_progress_bar_config(disable=True)
        pipe.calibrate(nfe=[8], bank_size=4, batch_size=4, progress=False)
    return {"elf": elf, "langflow": langflow}


def _aggregates(by_sampler: dict) -> Aggregates:
    """Aggregates holding the given means only (what the equal-entropy reading needs), NFEs keyed as in JSON."""
    typed = {
        sampler: {
            int(nfe): {name: MeanSE(stat["mean"], None, 1) for name, stat in m.items()} for nfe, m in by_nfe.items()
        }
        for sampler, by_nfe in by_sampler.items()
    }
    return Aggregates(typed, {})


def sweep(pipe, evaluator, tmp_path=None, **changes):
    """The tiny sweep with `changes` to its settings, scored under `evaluator`."""
    scoring = ScoringSettings(evaluator, num_resamples=50)
    options = {"output_dir": tmp_path, "progress": False, "name": "tiny", "command": "pytest"}
    return run_sweep(pipe, replace(TINY, **changes), scoring, **options)


def test_scoring_reuses_the_scores_of_a_run_whose_samples_were_already_scored(pipes, evaluator):
    from untied_sc_lab.experiments import generate_sweep, score_sweep

    settings = replace(TINY, seeds=[0])
    generation = generate_sweep(pipes["langflow"], settings, command="pytest", progress=False, name="tiny")
    official = next(run for run in generation.runs if run.sampler == "official")
    # As the baselines report holds a comparison sampler that chose its neutral knob: official's samples, own name.
    twin = replace(official, sampler="twin", samples=[replace(s, sampler="twin") for s in official.samples])
    samplers = {**generation.samplers, "twin": SamplerSpec.of({"scheduler": "official"})}
    doubled = replace(generation, samplers=samplers, runs=(*generation.runs, twin))
    calls = []
    # the scorer runs the model's body and projects only the scored positions onto the vocabulary
    hook = evaluator[0].model.register_forward_hook(lambda module, args, output: calls.append(1))
    try:
        once = score_sweep(generation, ScoringSettings(evaluator, num_resamples=20), progress=False)
        single = len(calls)
        both = score_sweep(doubled, ScoringSettings(evaluator, num_resamples=20), progress=False)
    finally:
        hook.remove()
    assert single > 0 and len(calls) == 2 * single  # the twin run cost no evaluator call
    records = {run["sampler"]: run for run in both["runs"]}
    assert {k: v for k, v in records["twin"].items() if k != "sampler"} == {
        k: v for k, v in records["official"].items() if k != "sampler"
    }
    assert records["official"] == next(run for run in once["runs"] if run["sampler"] == "official")


def test_plot_puts_every_sampler_on_the_genppl_entropy_plane_without_a_diversity_sweep(pipes, evaluator):
    from untied_sc_lab.evaluation.plots import benchmark_figure, pyplot
    from untied_sc_lab.experiments.report_record import Report

    results = sweep(pipes["langflow"], evaluator)
    report = Report.from_json(results)
    settings = report.settings
    figure = benchmark_figure(
        report.aggregates,
        report.diversity_curves,
        knob=settings.diversity_knob,
        model=settings.model,
        evaluator=settings.evaluator,
        protocol=settings.protocol,
    )
    try:
        plane = figure.axes[1]
        assert plane.get_xlabel() == "unigram entropy (nats)" and plane.get_ylabel() == "GenPPL"
        drawn = sorted(tuple(point) for c in plane.collections for point in c.get_offsets().tolist())
        by_sampler = results["aggregates"]["by_sampler"]
        expected = sorted(
            (m["entropy"]["mean"], m["gen_ppl"]["mean"]) for by_nfe in by_sampler.values() for m in by_nfe.values()
        )
        assert len(drawn) == 2  # official and untied at NFE 8
        assert [x for point in drawn for x in point] == pytest.approx([x for point in expected for x in point])
        assert plane.get_legend_handles_labels()[1] == ["official", "untied"]  # one NFE: no colour key
        # one NFE: each sampler's point has its colour in the left panel
        from matplotlib.colors import to_rgba

        left_colours = [to_rgba(bars.lines[0].get_color()) for bars in figure.axes[0].containers]
        point_colours = [to_rgba(c.get_facecolor()[0]) for c in plane.collections if len(c.get_offsets())]
        assert point_colours == left_colours and len(set(point_colours)) == 2
    finally:
        pyplot().close(figure)


@pytest.mark.parametrize("family", ["langflow", "elf"])
def test_sweep_writes_json_markdown_and_plot_with_a_diversity_curve(tmp_path, pipes, evaluator, family):
    values = [0.5, 2.0]
    results = sweep(pipes[family], evaluator, tmp_path, diversity_values=values)
    saved = json.loads((tmp_path / "tiny.json").read_text())
    assert saved["command"] == "pytest" and saved["wall_seconds"] > 0
    assert saved["protocol"] == family and saved["diversity_knob"] == (
        "temperature" if family == "langflow" else "decode_temperature"
    )
    assert len(saved["runs"]) == 2 * 2 + 2 * 2  # (official, untied) × 2 seeds + 2 values × 2 seeds (official)
    assert (tmp_path / "tiny.png").stat().st_size > 1000
    markdown = (tmp_path / "tiny.md").read_text()
    assert "| 8 |" in markdown and "official GenPPL | official entropy" in markdown and "```\npytest\n```" in markdown
    curve = results["diversity_curves"]["official"]["8"]
    default = 1.0 if family == "langflow" else 0.0  # x̂ temperature 1; decode temperature 0 (argmax)
    assert saved["diversity_default"] == default and "untied" not in results["diversity_curves"]
    assert [point[saved["diversity_knob"]] for point in curve] == sorted([default, *values])
    assert [point["default"] for point in curve] == [point[saved["diversity_knob"]] == default for point in curve]
    for run in saved["runs"]:
        assert len(run["per_sample"]["mean_nll"]) == 4 and run["samples_per_second"] > 0
        assert math.isfinite(run["gen_ppl"])
    # the untied point read against the official curve at its own entropy
    row = saved["equal_entropy"]["untied"]["8"]
    untied = results["aggregates"]["by_sampler"]["untied"]["8"]
    assert row["entropy"] == untied["entropy"]["mean"] and row["gen_ppl"] == untied["gen_ppl"]["mean"]
    points = [CurvePoint.from_json(point, saved["diversity_knob"]) for point in curve]
    assert row["baseline_gen_ppl_at_entropy"] == gen_ppl_at_entropy(points, row["entropy"])
    assert (row["ratio"] is None) == (row["ratio_ci"] is None)  # an interval exactly where the curve brackets
    if row["ratio_ci"] is not None:
        assert row["ratio_ci"][0] <= row["ratio_ci"][1]
    assert "## At equal entropy" in markdown


def _point(value, default, ppl, entropy) -> CurvePoint:
    """A curve point holding its means only (what the readings need)."""
    return CurvePoint(value, default, MeanSE(ppl, None, 1), MeanSE(entropy, None, 1))


def test_gen_ppl_at_entropy_interpolates_log_gen_ppl_and_never_extrapolates():
    curve = [_point(t, t == 1.0, ppl, e) for t, ppl, e in ((1.0, 400.0, 5.0), (0.9, 100.0, 4.0), (0.8, 25.0, 3.0))]
    assert gen_ppl_at_entropy(curve, 4.5) == pytest.approx(200.0)  # geometric mean of the neighbours
    assert gen_ppl_at_entropy(curve, 3.0) == pytest.approx(25.0)
    assert gen_ppl_at_entropy(curve, 2.9) is None and gen_ppl_at_entropy(curve, 5.1) is None
    by_sampler = {"official": {"8": {}}, "untied": {"8": {"entropy": {"mean": 3.5}, "gen_ppl": {"mean": 40.0}}}}
    row = equal_entropy_comparison(_aggregates(by_sampler), {"official": {8: curve}})["untied"][8]
    assert row.baseline_gen_ppl_at_entropy == pytest.approx(50.0) and row.ratio == pytest.approx(0.8)
    assert row.ratio_ci is None and row.fraction_outside is None  # no runs: no interval
    outside = {"untied": {"8": {"entropy": {"mean": 6.0}, "gen_ppl": {"mean": 40.0}}}}
    assert equal_entropy_comparison(_aggregates(outside), {"official": {8: curve}})["untied"][8].ratio is None


def test_equal_entropy_interval_resamples_the_candidate_and_the_whole_curve_together():
    # official T = 0.9 (entropy 4) and T = 1 (the main runs, entropy 5), log-linear in entropy; untied at entropy 4.5
    # is 2× better than the curve there (200). Every sample of a seed moves with its pairs, so every resample gives
    # the same ratio and the interval collapses onto 0.5.
    tokens = [[10.0, 30.0, 20.0], [25.0, 5.0, 15.0]]

    def run(sampler, seed, temperature, ppl, entropy, per_sample_entropy=True):
        nll_sum = [n * math.log(ppl) for n in tokens[seed]]
        sample_entropy = [entropy] * 3 if per_sample_entropy else None
        return scored_run(
            nll_sum,
            tokens[seed],
            sampler=sampler,
            seed=seed,
            value=temperature,
            entropy=entropy,
            sample_entropy=sample_entropy,
        )

    def sweep_runs(per_sample_entropy=True):
        runs = [run("official", s, None, 400.0, 5.0, per_sample_entropy) for s in (0, 1)]
        runs += [run("official", s, 0.9, 100.0, 4.0, per_sample_entropy) for s in (0, 1)]
        return runs + [run("untied", s, None, 100.0, 4.5, per_sample_entropy) for s in (0, 1)]

    runs = sweep_runs()
    curves = {"official": {8: [_point(0.9, False, 100.0, 4.0), _point(1.0, True, 400.0, 5.0)]}}
    by_sampler = {"official": {}, "untied": {"8": {"entropy": {"mean": 4.5}, "gen_ppl": {"mean": 100.0}}}}
    row = equal_entropy_comparison(_aggregates(by_sampler), curves, runs=runs, num_resamples=100)["untied"][8]
    assert row.ratio == pytest.approx(0.5)
    assert row.ratio_ci == pytest.approx([0.5, 0.5])
    assert row.entropy_resampled and row.fraction_outside == 0.0
    # Records without per-sample entropies (some committed reports): the entropies are held, the interval computed.
    runs = sweep_runs(per_sample_entropy=False)
    row = equal_entropy_comparison(_aggregates(by_sampler), curves, runs=runs, num_resamples=100)["untied"][8]
    assert row.ratio_ci == pytest.approx([0.5, 0.5]) and row.entropy_resampled is False


def test_equal_entropy_gives_no_interval_when_resamples_leave_the_curve():
    # The candidate sits on the curve's upper end: about half of the resamples put its entropy above the last point.
    generator = torch.Generator().manual_seed(0)

    def run(sampler, seed, temperature, ppl, entropy):
        noise = torch.randn(32, generator=generator, dtype=torch.float64) * 0.3
        nll_sum = [10 * math.log(ppl) for _ in range(32)]
        mean = float(entropy + noise.mean())
        return scored_run(
            nll_sum,
            [10.0] * 32,
            sampler=sampler,
            seed=seed,
            value=temperature,
            entropy=mean,
            sample_entropy=(entropy + noise).tolist(),
        )

    runs = [
        run("official", 0, None, 400.0, 5.0),
        run("official", 0, 0.9, 100.0, 4.0),
        run("untied", 0, None, 300.0, 5.0),
    ]
    by_entropy = {r.value: r.scores.entropy for r in runs if r.sampler == "official"}
    curves = {
        "official": {8: [_point(0.9, False, 100.0, by_entropy[0.9]), _point(1.0, True, 400.0, by_entropy[None])]}
    }
    candidate = runs[2].scores.entropy
    by_sampler = {"official": {}, "untied": {"8": {"entropy": {"mean": candidate}, "gen_ppl": {"mean": 300.0}}}}
    row = equal_entropy_comparison(_aggregates(by_sampler), curves, runs=runs, num_resamples=200)["untied"][8]
    assert row.fraction_outside > 0.025 and row.ratio_ci is None


def test_elf_intervals_resample_whole_batches(tmp_path, pipes, evaluator):
    # ELF draws one time grid per pipeline call: the report names the batch as its resampling unit, and its
    # intervals are those of a cluster bootstrap over (seed, batch).
    results = sweep(pipes["elf"], evaluator, tmp_path)
    assert results["resampling_unit"]["unit"] == "batch"
    assert "resampling whole batches" in (tmp_path / "tiny.md").read_text()
    knob = results["diversity_knob"]
    runs = {(r["sampler"], r["seed"]): RunRecord.from_json(r, knob) for r in results["runs"]}
    a, b = [runs["official", s] for s in (0, 1)], [runs["untied", s] for s in (0, 1)]
    ratio, interval = genppl_ratio_ci(a, b, [0, 0, 1, 1], num_resamples=50, generator=0)
    assert results["aggregates"]["paired"]["untied"]["8"]["gen_ppl_ratio_ci"] == list(interval)
    assert sweep(pipes["langflow"], evaluator)["resampling_unit"]["unit"] == "sample"


@pytest.mark.parametrize("family", ["langflow", "elf"])
def test_report_samples_round_trip_through_evaluate_to_the_reports_numbers(tmp_path, pipes, evaluator, family):
    from untied_sc.generation import read_samples
    from untied_sc_lab.evaluation import evaluate_runs

    results = sweep(pipes[family], evaluator, tmp_path, diversity_values=[0.5])
    path = tmp_path / "tiny.samples.jsonl.gz"
    assert results["files"]["samples"] == str(path) and results["samples_file"] == path.name
    samples = read_samples(path)
    assert len(samples) == 6 * 4 and {s.batch for s in samples} == {0, 1}  # batch size 2
    knob = results["diversity_knob"]
    rescored = evaluate_runs(path, evaluator=evaluator, protocol=family)
    assert len(rescored) == len(results["runs"])
    for run, again in zip(results["runs"], rescored, strict=True):
        assert again["run"] == {k: run[k] for k in ("sampler", "nfe", "seed", knob) if run[k] is not None}
        for metric in ("gen_ppl", "entropy", "rep_4", "token_rep_4", "longest_repeat"):
            assert again[metric] == run[metric]
        assert [r["nll_sum"] for r in again["per_sample"]] == run["per_sample"]["nll_sum"]


def test_reanalysing_a_report_reproduces_its_statistics(tmp_path, pipes, evaluator):
    from untied_sc_lab.experiments.aggregation import analyse

    results = sweep(pipes["langflow"], evaluator, tmp_path, diversity_values=[0.5, 2.0])
    saved = json.loads((tmp_path / "tiny.json").read_text())
    again = analyse(json.loads((tmp_path / "tiny.json").read_text()), num_resamples=50)
    for key in ("aggregates", "diversity_curves", "equal_entropy", "resampling_unit"):
        assert json.loads(json.dumps(again[key])) == saved[key]
    assert results["equal_entropy_fit"].startswith("monotone cubic")


@pytest.mark.parametrize("family", ["langflow", "elf"])
def test_pairs_share_latent_and_stream_so_zero_strength_untied_reproduces_official(pipes, evaluator, family):
    samplers = {"official": {}, "untied": ZERO_STRENGTH}
    results = sweep(pipes[family], evaluator, samplers=samplers)
    runs = {(run["sampler"], run["seed"]): run for run in results["runs"]}
    for seed in (0, 1):
        assert runs["official", seed]["per_sample"] == runs["untied", seed]["per_sample"]
    assert runs["official", 0]["per_sample"] != runs["official", 1]["per_sample"]
    paired = results["aggregates"]["paired"]["untied"]["8"]
    assert paired["num_pairs"] == 8 and paired["mean_delta"] == 0.0 and paired["fraction_b_worse"] == 0.0
    assert paired["gen_ppl_ratio"] == pytest.approx(1.0) and paired["gen_ppl_ratio_ci"] == pytest.approx([1.0, 1.0])


def test_batches_are_seeded_independently_of_the_sampler_and_nfe():
    assert batch_seed(0, 0) == 0 and batch_seed(0, 1) == 1 and batch_seed(1, 0) != batch_seed(0, 1)


def test_aggregates_are_computed_from_the_recorded_runs(pipes, evaluator):
    results = sweep(pipes["langflow"], evaluator)
    runs = {(run["sampler"], run["seed"]): run for run in results["runs"]}
    stats = results["aggregates"]["by_sampler"]["untied"]["8"]
    values = [runs["untied", s]["gen_ppl"] for s in (0, 1)]
    assert stats["gen_ppl"]["mean"] == pytest.approx(sum(values) / 2)
    assert stats["gen_ppl"]["se"] == pytest.approx(abs(values[0] - values[1]) / 2)
    paired = results["aggregates"]["paired"]["untied"]["8"]
    nll_a = [x for s in (0, 1) for x in runs["official", s]["per_sample"]["mean_nll"]]
    nll_b = [x for s in (0, 1) for x in runs["untied", s]["per_sample"]["mean_nll"]]
    deltas = [b - a for a, b in zip(nll_a, nll_b, strict=True)]
    assert paired["mean_delta"] == pytest.approx(sum(deltas) / len(deltas))
    assert paired["fraction_b_worse"] == pytest.approx(sum(d > 0 for d in deltas) / len(deltas))

    def pooled(sampler):
        nll = sum(sum(runs[sampler, s]["per_sample"]["nll_sum"]) for s in (0, 1))
        tokens = sum(sum(runs[sampler, s]["per_sample"]["num_tokens"]) for s in (0, 1))
        return math.exp(nll / tokens)

    assert paired["gen_ppl_ratio"] == pytest.approx(pooled("untied") / pooled("official"))
    low, high = paired["gen_ppl_ratio_ci"]
    assert low <= high
    retained = [runs["untied", s]["samples_per_second"] / runs["official", s]["samples_per_second"] for s in (0, 1)]
    assert paired["retained_throughput"]["mean"] == pytest.approx(sum(retained) / 2)
    again = aggregate([RunRecord.from_json(r, results["diversity_knob"]) for r in results["runs"]], num_resamples=50)
    assert again.paired["untied"][8].mean_delta == paired["mean_delta"]


def test_genppl_ratio_of_identical_runs_is_one():
    run = scored_run([2.0, 3.0], [2, 3])
    ratio, interval = genppl_ratio_ci([run], [run], num_resamples=20)
    assert ratio == 1.0 and interval == (1.0, 1.0)


def test_sweep_requires_the_official_baseline(pipes, evaluator):
    with pytest.raises(ValueError, match="baseline"):
        sweep(pipes["langflow"], evaluator, samplers={"untied": {}})


# ---- diversity knobs ----------------------------------------------------------------------------------------------


def sample_latents(pipe, **kwargs):
    generator = torch.Generator().manual_seed(0)
    return pipe(batch_size=2, num_inference_steps=8, generator=generator, output_type="latent", **kwargs).latents


def test_langflow_temperature_one_is_bitwise_the_default_and_other_temperatures_change_the_trajectory(pipes):
    pipe = pipes["langflow"]
    default = sample_latents(pipe)
    assert torch.equal(sample_latents(pipe, temperature=1.0), default)
    assert not torch.allclose(sample_latents(pipe, temperature=0.5), default)
    assert torch.equal(sample_latents(pipe), default)  # the knob was passed, not stored
    with pytest.raises(ValueError, match="temperature"):
        sample_latents(pipe, temperature=0.0)


def test_langflow_low_temperature_sharpens_the_clean_prediction(pipes):
    pipe = pipes["langflow"]
    captured = {}

    for temperature in (0.1, 1.0):

        def capture(pipe_, step, timestep, kwargs, temperature=temperature):
            captured.setdefault(temperature, []).append(kwargs["prediction"].norm())
            return {}

        generator = torch.Generator().manual_seed(0)
        pipe(
            batch_size=2,
            num_inference_steps=8,
            generator=generator,
            output_type="latent",
            temperature=temperature,
            callback_on_step_end=capture,
            callback_on_step_end_tensor_inputs=["prediction"],
        )
    # x̂ is a convex combination of unit-norm rows: sharper weights give a longer vector at the first step.
    assert captured[0.1][0] > captured[1.0][0]


def test_elf_sc_cfg_scale_override(pipes):
    pipe = pipes["elf"]
    default = sample_latents(pipe)
    assert torch.equal(sample_latents(pipe, sc_cfg_scale=pipe.config.sc_cfg_scale), default)
    assert torch.equal(sample_latents(pipe, sc_cfg_scale=None), default)
    if pipe.transformer.config.num_sc_cfg_tokens > 0:
        assert not torch.allclose(sample_latents(pipe, sc_cfg_scale=7.0), default)
    assert torch.equal(sample_latents(pipe), default) and pipe.sc_cfg_scale == pipe.config.sc_cfg_scale


def test_sample_tokens_follows_the_tempered_softmax():
    from untied_sc.pipelines.pipeline_elf import sample_tokens

    logits = torch.tensor([[[0.0, 1.0, 2.0]]]).expand(1, 20000, 3)
    generator = torch.Generator().manual_seed(0)
    for temperature in (0.5, 1.0, 4.0):
        ids = sample_tokens(logits, temperature, generator)
        frequencies = torch.bincount(ids.flatten(), minlength=3).double() / ids.numel()
        expected = torch.softmax(logits[0, 0].double() / temperature, dim=-1)
        assert torch.allclose(frequencies, expected, atol=0.015), (temperature, frequencies, expected)
    # a near-zero temperature is the argmax; the draw is a function of the generator's state
    assert torch.equal(sample_tokens(logits, 1e-6, generator), torch.full((1, 20000), 2))
    first = sample_tokens(logits, 1.0, torch.Generator().manual_seed(3))
    assert torch.equal(first, sample_tokens(logits, 1.0, torch.Generator().manual_seed(3)))


def test_elf_decode_temperature(pipes):
    pipe = pipes["elf"]

    def ids(**kwargs):
        return pipe(
            batch_size=4, num_inference_steps=8, generator=torch.Generator().manual_seed(0), **kwargs
        ).sequences

    argmax = ids()
    assert torch.equal(ids(decode_temperature=0.0), argmax) and torch.equal(ids(decode_temperature=0), argmax)
    hot = ids(decode_temperature=5.0)
    assert torch.equal(ids(decode_temperature=5.0), hot) and not torch.equal(hot, argmax)
    # the trajectory is untouched: the draws come after the last step
    latents = pipe(
        batch_size=4, num_inference_steps=8, generator=torch.Generator().manual_seed(0), output_type="latent"
    )
    hot_latents = pipe(
        batch_size=4,
        num_inference_steps=8,
        generator=torch.Generator().manual_seed(0),
        output_type="latent",
        decode_temperature=5.0,
    )
    assert torch.equal(latents.latents, hot_latents.latents)
    assert torch.equal(ids(), argmax)  # the knob was passed, not stored
    for bad in (-1.0, "hot"):  # None: the stored or default value
        with pytest.raises(ValueError, match="decode_temperature must be a number ≥ 0"):
            pipe(batch_size=1, num_inference_steps=8, decode_temperature=bad)


def test_benchmark_command_line_writes_the_results_of_a_saved_pipeline(tmp_path, pipes, evaluator):
    from untied_sc.cli import main

    pipes["langflow"].save_pretrained(tmp_path / "tiny-langflow")
    evaluator[0].save_pretrained(tmp_path / "evaluator")
    evaluator[1].save_pretrained(tmp_path / "evaluator")
    argv = ["benchmark", str(tmp_path / "tiny-langflow"), "--nfe", "8", "--seeds", "0", "--num-samples", "2"]
    argv += ["--batch-size", "2", "--evaluator", str(tmp_path / "evaluator"), "--temperatures", "0.7"]
    argv += ["--output-dir", str(tmp_path / "results"), "--num-resamples", "20", "--no-progress"]
    assert main(argv) == 0
    saved = json.loads((tmp_path / "results" / "tiny-langflow.json").read_text())
    assert saved["command"].startswith(f"untied-sc benchmark {tmp_path / 'tiny-langflow'} --nfe 8 --seeds 0 ")
    assert "--temperatures 0.7" in saved["command"] and saved["diversity_values"] == [0.7]
    assert (tmp_path / "results" / "tiny-langflow.md").is_file() and (
        tmp_path / "results" / "tiny-langflow.png"
    ).is_file()


def test_sampling_and_scoring_apart_give_the_numbers_of_one_sweep(tmp_path, pipes, evaluator):
    from untied_sc_lab.experiments import generate_sweep, read_stored_sweeps, score_sweep, store_sweep
    from untied_sc_lab.runs.store import RunStore

    settings, scoring = replace(TINY, diversity_values=[0.5]), ScoringSettings(evaluator, num_resamples=50)
    whole = run_sweep(pipes["langflow"], settings, scoring, progress=False)
    generation = generate_sweep(pipes["langflow"], settings, name="tiny", command="sample", progress=False)
    path = store_sweep(RunStore(tmp_path / "store"), generation)
    assert path.parent == tmp_path / "store" / "sweeps"
    loaded = read_stored_sweeps(RunStore(tmp_path / "store"))  # another process, as on the scoring machine
    assert loaded == generation  # settings, runs and samples
    apart = score_sweep(loaded, scoring, output_dir=tmp_path, command="score")
    assert len(apart["runs"]) == len(whole["runs"]) == 2 * 2 + 2
    for one, other in zip(whole["runs"], apart["runs"], strict=True):
        assert {k: v for k, v in one.items() if "second" not in k} == {
            k: v for k, v in other.items() if "second" not in k
        }
    untimed = [  # the throughput of two samplings differs; every score is the same
        {k: v for k, v in r["aggregates"]["paired"]["untied"]["8"].items() if k != "retained_throughput"}
        for r in (whole, apart)
    ]
    assert untimed[0] == untimed[1] and "gen_ppl_ratio_ci" in untimed[0]
    assert apart["equal_entropy"] == whole["equal_entropy"]
    markdown = (tmp_path / "tiny.md").read_text()
    assert "```\nsample\nscore\n```" in markdown and "then scored in" in markdown


def test_parts_sampled_at_different_nfes_merge_into_the_one_command_sweep(tmp_path, langflow_golden, evaluator):
    from untied_sc_lab.experiments import (
        generate_sweep,
        merge_generations,
        read_stored_sweeps,
        score_sweep,
        store_sweep,
    )
    from untied_sc_lab.runs.store import RunStore

    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[4, 8], bank_size=4, batch_size=4, progress=False)
    settings = replace(TINY, diversity_values=[0.5])
    whole = generate_sweep(pipe, replace(settings, nfe=[4, 8]), name="tiny", command="both", progress=False)
    parts = {  # in either order
        n: generate_sweep(pipe, replace(settings, nfe=[n]), name="tiny", command=f"nfe {n}", progress=False)
        for n in (8, 4)
    }
    merged = merge_generations([parts[8], parts[4]])
    assert merged.nfe == (4, 8) and merged.command == "nfe 8 ; nfe 4"
    assert [r.key for r in merged.runs] == [r.key for r in whole.runs]
    assert [r.samples for r in merged.runs] == [r.samples for r in whole.runs]
    assert merged.coefficients == whole.coefficients
    scoring = ScoringSettings(evaluator, num_resamples=50)
    scored = [score_sweep(g, scoring, progress=False) for g in (whole, merged)]
    untimed = [
        {k: v for k, v in r["aggregates"]["paired"]["untied"]["8"].items() if "throughput" not in k} for r in scored
    ]
    assert untimed[0] == untimed[1] and scored[0]["equal_entropy"] == scored[1]["equal_entropy"]
    assert merged.device == whole.device and merged.torch == whole.torch  # one machine: named once

    # Parts from two machines merge (pairs stay within an NFE); the merged sweep names each machine with its NFEs.
    on_gpu = replace(parts[8], device="cuda:0 (NVIDIA H200)", torch="2.11.0+cu130")
    mixed = merge_generations([on_gpu, parts[4]])
    assert mixed.device == f"{whole.device} at NFE 4; cuda:0 (NVIDIA H200) at NFE 8"
    assert mixed.torch == f"{whole.torch} at NFE 4; 2.11.0+cu130 at NFE 8"
    assert [(part.nfe, part.device) for part in mixed.parts] == [((8,), "cuda:0 (NVIDIA H200)"), ((4,), whole.device)]
    report = score_sweep(mixed, scoring, progress=False, output_dir=tmp_path / "mixed")
    markdown = (tmp_path / "mixed" / "tiny.md").read_text()
    assert (
        report["parts"] == [part.to_json() for part in mixed.parts]
        and "NFE 8: sampled in" in markdown
        and "cuda:0 (NVIDIA H200)" in markdown
    )

    # An NFE sampled by two parts of a store, or a part of another sweep: refused, naming both parts.
    store = RunStore(tmp_path / "store")
    paths = {n: store_sweep(store, parts[n]) for n in (8, 4)}
    paths["both"] = store_sweep(store, whole)
    with pytest.raises(ValueError, match="both sampled NFE (4|8): merge parts with disjoint --nfe") as refused:
        read_stored_sweeps(store)
    assert sum(str(path) in str(refused.value) for path in paths.values()) == 2
    other = generate_sweep(pipe, replace(settings, nfe=[4], seeds=[5]), name="tiny", command="seed 5", progress=False)
    with pytest.raises(ValueError, match="seed 5 and nfe 8 are not parts of one sweep: they differ in seeds"):
        merge_generations([parts[8], other], ["nfe 8", "seed 5"])


def test_an_earlier_report_read_into_a_store_lends_its_scores_to_the_runs_whose_samples_it_holds(
    tmp_path, langflow_golden, evaluator, monkeypatch, capsys
):
    from untied_sc.cli import main
    from untied_sc_lab.experiments import generate_sweep, merge_generations, run_sweep, score_sweep, sweep
    from untied_sc_lab.experiments.report_import import import_report
    from untied_sc_lab.runs.store import RunStore

    pipe = LangFlowPipeline(langflow_from_golden(langflow_golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    pipe.calibrate(nfe=[4, 8], bank_size=4, batch_size=4, progress=False)
    options = {"progress": False, "name": "tiny"}
    settings = replace(TINY, diversity_values=[0.5])
    parts = [generate_sweep(pipe, replace(settings, nfe=[n]), command=f"nfe {n}", **options) for n in (8, 4)]
    under = ScoringSettings(evaluator, num_resamples=50)
    score_sweep(parts[0], under, output_dir=tmp_path / "nfe8", progress=False)  # the first part's report and samples
    report = tmp_path / "nfe8" / "tiny.json"
    merged = merge_generations(parts)
    calls = []
    scoring = sweep.evaluate_samples
    monkeypatch.setattr(sweep, "evaluate_samples", lambda *args, **kwargs: calls.append(1) or scoring(*args, **kwargs))
    fresh = score_sweep(merged, under, progress=False)
    every = len(calls)

    def store_of(name: str, **scoring_options) -> RunStore:
        store = RunStore(tmp_path / name)
        import_report(store, report, eval_batch_size=8, **scoring_options)
        return store

    reused = score_sweep(merged, under, store=store_of("store"), output_dir=tmp_path, progress=False)
    assert reused["runs"] == fresh["runs"]  # the same records, so the same tables
    assert reused["aggregates"] == fresh["aggregates"]
    # The 6 runs at NFE 8 (4 main, 2 at temperature 0.5) are read, the first of them scored again as the check.
    assert every >= 10 and len(calls) - every == every - 5
    assert reused["store"]["scores_read"] == 6 and reused["store"]["imported"][0]["runs"] == 6
    # (the tiny model may draw the same texts at NFE 4: those runs read the same scores)
    [checked] = reused["store"]["checked_runs"]
    assert checked.startswith("official at NFE ") and checked.endswith(f", seed 0 (scores of {report})")
    assert "scores of 6 runs were read from the run store" in (tmp_path / "tiny.md").read_text()

    with pytest.raises(ValueError, match="differs from its scores imported from .*relative NLL"):  # another length
        score_sweep(parts[0], replace(under, max_length=3), store=store_of("short", max_length=3), progress=False)
    elf = score_sweep(parts[0], replace(under, protocol="elf"), store=store_of("elf"), progress=False)
    assert elf["store"]["scores_read"] == 0
    edited = [replace(run, samples=[replace(s, text=s.text + " x") for s in run.samples]) for run in parts[0].runs]
    edited_report = score_sweep(replace(parts[0], runs=tuple(edited)), under, store=store_of("edited"), progress=False)
    assert edited_report["store"]["scores_read"] == 0
    # a report scored before per-sample entropies were kept lends none of its scores
    older = json.loads(report.read_text())
    del older["runs"][1]["per_sample"]["entropy"]
    (tmp_path / "nfe8" / "older.json").write_text(json.dumps(older))
    with pytest.raises(ValueError, match=r"older.json's run \S+ at NFE 8, seed \d holds no per-sample entropies"):
        import_report(RunStore(tmp_path / "older"), tmp_path / "nfe8" / "older.json", eval_batch_size=8)
    (tmp_path / "nfe8" / "tiny.samples.jsonl.gz").unlink()
    with pytest.raises(ValueError, match="has no samples file beside it"):
        store_of("no-samples")
    # sampling again with one temperature more: the runs the report holds take its samples and scores (a batch of
    # each sampler sampled again, a run scored again), the new ones are sampled and scored
    calls.clear()
    store = RunStore(tmp_path / "again")
    import_report(store, tmp_path / "tiny.json", eval_batch_size=8)
    again = run_sweep(pipe, replace(TINY, diversity_values=[0.5, 2.0]), under, store=store, **options)
    assert again["store"]["scores_read"] == 6 and len(calls) == 1 + 2  # the check, and the 2 runs at 2.0
    assert again["store"]["samples_read"] == 6 and again["store"]["samples_written"] == 2

    def by_run(runs):  # the scores and metrics of the runs both hold (the sampling times are the report's)
        timing = ("seconds", "samples_per_second")
        return {
            (r["sampler"], r["seed"], r["temperature"]): {k: v for k, v in r.items() if k not in timing}
            for r in runs
            if r["nfe"] == 8 and r["temperature"] != 2
        }

    assert by_run(again["runs"]) == by_run(reused["runs"])
    # before any sampling: a report without a store, or none at all, is refused
    with pytest.raises(SystemExit, match="give the store with --store DIR"):
        main(["benchmark", str(tmp_path / "any"), "--store-from", str(tmp_path / "tiny.json")])
    argv = ["benchmark", str(tmp_path / "any"), "--store", str(tmp_path / "s"), "--store-from"]
    assert main([*argv, str(tmp_path / "missing.json")]) == 2
    assert "missing.json: no such file; give a benchmark report" in capsys.readouterr().err


def test_benchmark_command_line_samples_and_scores_apart(tmp_path, pipes, evaluator):
    from untied_sc.cli import main
    from untied_sc_lab.runs.store import RunStore

    pipes["elf"].save_pretrained(tmp_path / "tiny-elf")
    evaluator[0].save_pretrained(tmp_path / "evaluator")
    evaluator[1].save_pretrained(tmp_path / "evaluator")
    argv = ["benchmark", str(tmp_path / "tiny-elf"), "--nfe", "8", "--seeds", "0", "--num-samples", "2"]
    argv += ["--batch-size", "2", "--output-dir", str(tmp_path / "gen"), "--generate-only", "--no-progress"]
    with pytest.raises(SystemExit, match="--generate-only samples a sweep to score elsewhere: give the run store"):
        main([*argv, "--temperatures", "1"])  # nothing would carry the sweep
    store = tmp_path / "store"
    assert main([*argv, "--temperatures", "1", "--store", str(store)]) == 0
    assert not (tmp_path / "gen").exists()
    [(_, sweep, _)] = RunStore(store).sweeps()
    assert "--evaluator" not in sweep["command"]  # scoring options come with the scoring command
    with pytest.raises(SystemExit, match="drop --nfe"):
        main(["benchmark", "--store", str(store), "--nfe", "8"])
    argv = ["benchmark", "--store", str(store), "--evaluator", str(tmp_path / "evaluator")]
    assert main([*argv, "--output-dir", str(tmp_path / "results"), "--num-resamples", "20", "--no-progress"]) == 0
    saved = json.loads((tmp_path / "results" / "tiny-elf.json").read_text())
    assert not saved["main_only"] and len(saved["runs"]) == 2 + 1
    argv = [*argv, "--output-dir", str(tmp_path / "main"), "--num-resamples", "20", "--no-progress", "--main-only"]
    assert main(argv) == 0
    main_only = json.loads((tmp_path / "main" / "tiny-elf.json").read_text())
    assert main_only["main_only"] and main_only["diversity_curves"] == {} and len(main_only["runs"]) == 2
    assert main_only["runs"] == saved["runs"][:2]  # the same scores, the diversity run left out
    assert "(`--main-only`)" in (tmp_path / "main" / "tiny-elf.md").read_text()
    assert saved["scoring_command"].startswith("untied-sc benchmark --evaluator ")
    assert f"--store {store}" in saved["scoring_command"]
    assert saved["num_samples"] == 2


@pytest.mark.parametrize("experiment", ["placement", "components", "sensitivity", "directions"])
def test_controlled_experiments_run_as_matched_sampler_sets(pipes, evaluator, experiment):
    samplers = experiment_samplers(experiment)
    assert next(iter(samplers)) == "official"
    if experiment == "sensitivity":
        samplers = {name: spec for name, spec in samplers.items() if name in ("official", "untied (eta_t x0.5)")}
    results = sweep(pipes["langflow"], evaluator, samplers=samplers, seeds=[0])
    assert {run["sampler"] for run in results["runs"]} == set(samplers)
    assert set(results["aggregates"]["paired"]) == set(samplers) - {"official"}


def test_coefficient_scales_multiply_the_resolved_coefficients(pipes):
    pipe = pipes["langflow"]
    base = build_scheduler(pipe, {"scheduler": "untied"}).resolve_coefficients(8)
    scaled = build_scheduler(pipe, {"scheduler": "untied", "eta_t_scale": 0.5, "alpha_scale": 2.0}, None, 8)
    coefficients = scaled.resolve_coefficients(8)
    assert coefficients["eta_t"] == base["eta_t"] * 0.5 and coefficients["alpha"] == min(base["alpha"] * 2, 1.0)
    assert coefficients["eta_r"] == base["eta_r"]
    with pytest.raises(ValueError, match="only apply to the untied sampler"):
        build_scheduler(pipe, {"scheduler": "official", "eta_t_scale": 0.5})
    with pytest.raises(ValueError, match="Unknown experiment"):
        experiment_samplers("ablations")


@pytest.mark.parametrize("family", ["langflow", "elf"])
def test_the_directions_experiment_builds_one_untied_sampler_per_direction_control(pipes, family):
    samplers = experiment_samplers("directions")
    assert list(samplers) == [
        "official",
        "untied (history)",
        "untied (common)",
        "untied (permuted)",
        "untied (random)",
    ]
    pipe = pipes[family]
    official = build_scheduler(pipe, samplers["official"].with_scheduler("official"))
    assert type(official) is type(pipe.scheduler) and "correction_direction" not in official.config
    latents = {}
    for name, spec in list(samplers.items())[1:]:
        scheduler = build_scheduler(pipe, spec.with_scheduler("untied"), None, 8)
        assert scheduler.config.correction_direction == name.removeprefix("untied (").removesuffix(")")
        pipe.scheduler, kept = scheduler, pipe.scheduler
        try:
            generator = torch.Generator().manual_seed(0)
            out = pipe(batch_size=3, num_inference_steps=8, generator=generator, output_type="latent").latents
        finally:
            pipe.scheduler = kept
        assert torch.isfinite(out).all()
        latents[name] = out
    history = latents["untied (history)"]
    assert all(not torch.allclose(history, got) for name, got in latents.items() if name != "untied (history)")


def test_results_record_the_coefficients_each_untied_sampler_ran_with(tmp_path, pipes, evaluator):
    pipe = pipes["langflow"]
    base = build_scheduler(pipe, {"scheduler": "untied"}).resolve_coefficients(8)
    samplers = {"official": {}, "untied": {}, "untied (alpha x4)": {"alpha_scale": 4.0}}
    results = sweep(pipe, evaluator, tmp_path, samplers=samplers, seeds=[0])
    assert set(results["coefficients"]) == {"untied", "untied (alpha x4)"}  # the official sampler has none
    assert results["coefficients"]["untied"]["8"] == base
    capped = results["coefficients"]["untied (alpha x4)"]["8"]
    assert base["alpha"] * 4 > 1 and capped == {**base, "alpha": 1.0}
    markdown = (tmp_path / "tiny.md").read_text()
    assert "a scaled α above 1 runs at 1" in markdown
    assert (
        f"| untied (alpha x4) | 8 | {base['eta_r']:.4g} | {base['eta_t']:.4g} | {base['eta_o']:.4g} | 1 |" in markdown
    )


def test_a_preset_applies_to_every_untied_sampler_and_names_the_results(pipes):
    from untied_sc.schedulers.coefficients import paper_coefficients
    from untied_sc_lab.experiments.definitions import experiment_name, with_preset

    samplers = with_preset(experiment_samplers("components"), "langflow-lm1b")
    assert samplers["official"] == SamplerSpec() and all(
        spec.overrides["coefficients"] == "langflow-lm1b" for name, spec in samplers.items() if name != "official"
    )
    pipe = pipes["langflow"]
    spec = samplers["untied (correction only)"].with_scheduler("untied")
    coefficients = build_scheduler(pipe, spec, None, 8).resolve_coefficients(8)
    assert coefficients == {**paper_coefficients()["langflow-lm1b"][8], "eta_r": 0.0}
    assert experiment_name("hub/x", "components", "langflow-lm1b") == "x-components-langflow-lm1b"
    assert experiment_name("hub/x", "main") is None
