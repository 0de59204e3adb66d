"""`untied-sc diagnose`: the paper's quantities as pure functions against hand computations, and each diagnostic end
to end on the tiny pipelines (outputs, refusal to overwrite, known cases)."""

import json
import math

import pytest
import torch

from untied_sc import ELFPipeline, LangFlowPipeline
from untied_sc.cli import main
from untied_sc.schedulers import ELFScheduler, LangFlowScheduler
from untied_sc_lab.diagnostics import coupling as coupling_module
from untied_sc_lab.diagnostics.bootstrap import BootstrapEstimate
from untied_sc_lab.diagnostics.coupling import (
    CouplingResult,
    coupled_noise,
    coupling_experiment,
    optimal_coefficient,
    quadratic_risk_terms,
    risk_ratio,
)
from untied_sc_lab.diagnostics.family import corrupt, solver_time, time_of
from untied_sc_lab.diagnostics.innovation import (
    InnovationResult,
    InnovationRow,
    alignment,
    innovation_experiment,
    normalized_energy_decrease,
    overlap_energy,
    overlap_energy_gradient,
)
from untied_sc_lab.diagnostics.outputs import write_outputs
from untied_sc_lab.diagnostics.step_scaling import (
    fitted_exponent,
    latent_contribution,
    nested_prefixes,
    step_average_correction,
    step_average_weights,
    step_scaling_experiment,
    within_step_exponent,
)

from .tiny import random_statistics, tiny_tokenizer


# ---------------------------------------------------------------------------------------------------------------
# Pure functions


def test_coupled_noise_follows_the_gaussian_coupling():
    previous, fresh = torch.tensor([1.0, -2.0]), torch.tensor([0.5, 3.0])
    assert torch.equal(coupled_noise(None, fresh, 0.7), fresh)  # ε_0 = ξ_0
    assert torch.equal(coupled_noise(previous, fresh, 1.0), previous)  # ρ = 1: the same noise
    assert torch.equal(coupled_noise(previous, fresh, 0.0), fresh)  # ρ = 0: a fresh one
    assert torch.allclose(coupled_noise(previous, fresh, 0.6), torch.tensor([0.6 + 0.4, -1.2 + 2.4]))
    # unit variance kept, correlation ρ between successive noises
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(200_000, generator=generator)
    b = coupled_noise(a, torch.randn(200_000, generator=generator), 0.5)
    assert abs(b.var().item() - 1) < 0.02 and abs(torch.corrcoef(torch.stack([a, b]))[0, 1].item() - 0.5) < 0.01
    with pytest.raises(ValueError, match="ρ must lie in"):
        coupled_noise(previous, fresh, 1.5)


def test_optimal_coefficient_and_risk_ratio_by_hand():
    base = torch.tensor([[[1.0, 0.0]]])
    modified = torch.tensor([[[2.0, 1.0]]])
    target = torch.zeros(1, 1, 2)
    ed, dd, ee = quadratic_risk_terms(base, modified, target)  # d = (1, 1), e = (1, 0)
    assert (ed.item(), dd.item(), ee.item()) == (1.0, 2.0, 1.0)
    assert optimal_coefficient(ed, dd) == -0.5
    assert risk_ratio(ee, ed, dd) == 5.0  # ‖e + d‖² = ‖(2, 1)‖² = 5
    assert math.isnan(optimal_coefficient(0.0, 0.0))  # no self-conditioning effect: no optimum
    # α* minimises the quadratic risk along d
    generator = torch.Generator().manual_seed(1)
    base, modified, target = (torch.randn(3, 4, 5, generator=generator) for _ in range(3))
    ed, dd, ee = (t.sum() for t in quadratic_risk_terms(base, modified, target))
    best = optimal_coefficient(ed, dd)

    def risk(a):
        return (base + a * (modified - base) - target).pow(2).sum().item()

    assert risk(best) < min(risk(best - 0.05), risk(best + 0.05))
    assert risk_ratio(ee, ed, dd) == pytest.approx(risk(1.0) / risk(0.0), rel=1e-6)


def a1(h):
    return (h - 1 + math.exp(-h)) / (1 - math.exp(-h))


def test_step_average_weights_by_hand():
    h = 0.8
    e = math.exp(-h)
    # one interval: to p_0 (1 − e^{−h})/h − e^{−h}, to p_1 1 − (1 − e^{−h})/h, both over 1 − e^{−h}
    weights = step_average_weights(torch.tensor([0.0, h]))
    assert weights.tolist() == pytest.approx([((1 - e) / h - e) / (1 - e), (1 - (1 - e) / h) / (1 - e)])
    nodes = torch.cat([torch.zeros(1), (torch.rand(6) + 0.1).cumsum(0)])
    assert step_average_weights(nodes).sum().item() == pytest.approx(1.0)
    with pytest.raises(ValueError, match="Nodes must be"):
        step_average_weights(torch.tensor([0.0, 0.3, 0.3]))
    with pytest.raises(ValueError, match="Nodes must be"):
        step_average_weights(torch.tensor([0.1, 0.3]))


def test_step_average_correction_matches_the_paper_expansion():
    v, h = torch.tensor([1.0, -2.0], dtype=torch.float64), 0.6
    # a linear prediction p(u_k + s) = p_k + s·v: C*(h) = a_1(h)·v (eq. second_order_interval_expansion), exactly
    for nodes in ([0.0, h], [0.0, 0.1, 0.25, h]):
        nodes = torch.tensor(nodes, dtype=torch.float64)
        correction = step_average_correction([s * v for s in nodes], step_average_weights(nodes))
        assert torch.allclose(correction, a1(h) * v, rtol=1e-10)
    # a quadratic one: C*(h) = a_1(h)·ṗ + a_2(h)/2·p̈ (here exactly), reached as the nodes get denser
    a2 = (h * h - 2 * h + 2 - 2 * math.exp(-h)) / (1 - math.exp(-h))
    nodes = torch.linspace(0, h, 401, dtype=torch.float64)
    correction = step_average_correction([s * v + s * s * v for s in nodes], step_average_weights(nodes))
    assert torch.allclose(correction, (a1(h) + a2) * v, rtol=1e-5)
    constant = step_average_correction([v, v, v], step_average_weights(torch.tensor([0.0, 1.0, 2.0])))
    assert torch.allclose(constant, torch.zeros(2, dtype=torch.float64))  # a constant prediction needs no correction
    assert torch.allclose(latent_contribution(torch.tensor([2.0]), h), torch.tensor([2 * (1 - math.exp(-h))]))


def test_fitted_exponents_recover_a_power_law():
    widths = torch.tensor([0.1, 0.2, 0.4, 0.8])
    assert fitted_exponent(widths, 3 * widths**1.5) == pytest.approx(1.5)
    with pytest.raises(ValueError, match="two different step widths"):
        fitted_exponent(torch.tensor([0.2, 0.2]), torch.tensor([1.0, 2.0]))
    # within steps: each step its own constant, one shared order; a pooled fit would mix the constants
    groups = [torch.tensor([0.4, 0.2, 0.1]), torch.tensor([0.05, 0.025])]
    values = [7 * groups[0] ** 2, 0.01 * groups[1] ** 2]
    assert within_step_exponent(groups, values) == pytest.approx(2.0)
    assert fitted_exponent(torch.cat(groups), torch.cat(values)) != pytest.approx(2.0, abs=0.1)
    assert nested_prefixes(32) == [32, 16, 8, 4, 2] and nested_prefixes(6) == [6, 3]


def test_overlap_energy_by_hand():
    basis, rho_sq = torch.eye(2), torch.tensor([1.0, 0.25])
    m = torch.tensor([[[2.0, 2.0]]])
    # E = ½(1·⟨m, q_1⟩² + 0.25·⟨m, q_2⟩²) = ½(4 + 1) = 2.5 = ½⟨m, K m⟩
    assert overlap_energy(m, basis, rho_sq).item() == 2.5
    gradient = overlap_energy_gradient(m, basis, rho_sq)
    assert gradient.tolist() == [[[2.0, 0.5]]]
    assert alignment(-gradient, gradient).item() == pytest.approx(1.0)
    assert alignment(torch.tensor([[[0.5, -2.0]]]), gradient).item() == pytest.approx(0.0)
    # Δ = (−1, 0): m̃ = (1, 2), E = ½(1 + 1) = 1, RMS(Δ) = √(1/2)
    decrease = normalized_energy_decrease(torch.tensor([2.5]), torch.tensor([1.0]), torch.tensor([[[-1.0, 0.0]]]))
    assert decrease.item() == pytest.approx(-1.5 / math.sqrt(0.5))
    assert math.isnan(normalized_energy_decrease(torch.tensor([1.0]), torch.tensor([1.0]), torch.zeros(1, 1, 2)))


def test_corruptions_and_solver_time(tiny_elf, tiny_langflow):
    elf = ELFPipeline(tiny_elf, ELFScheduler(), tiny_tokenizer())
    langflow = LangFlowPipeline(tiny_langflow, LangFlowScheduler(), tiny_tokenizer())
    clean, noise = torch.ones(1, 2, 3), torch.full((1, 2, 3), 2.0)
    assert torch.allclose(corrupt(elf, clean, 0.25, noise), torch.full((1, 2, 3), 0.25 + 0.75 * 2.0 * 2.0))
    half = math.sqrt(0.5)  # γ = 0: α² = σ² = ½
    assert torch.allclose(corrupt(langflow, clean, 0.0, noise), torch.full((1, 2, 3), half + 2 * half))
    for family, t in (("elf", 0.3), ("langflow", -1.5)):
        assert time_of(family, solver_time(family, t)) == pytest.approx(t)
    assert solver_time("elf", 0.5) == pytest.approx(math.log(2)) and solver_time("langflow", 4.0) == -2.0


# ---------------------------------------------------------------------------------------------------------------
# End to end on the tiny pipelines


def awake(model):
    """The official initialisation zeroes the self-conditioning projection and heads: give them random weights."""
    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if (parameter == 0).all():
                parameter.normal_(0, 0.3, generator=generator)
    return model


@pytest.fixture
def pipes(tiny_elf, tiny_langflow):
    elf, langflow = awake(tiny_elf), awake(tiny_langflow)
    return {
        "elf": ELFPipeline(elf, ELFScheduler(), tiny_tokenizer(), random_statistics(elf, "elf", steps=(4, 6))),
        "langflow": LangFlowPipeline(
            langflow, LangFlowScheduler(), tiny_tokenizer(), random_statistics(langflow, "langflow", steps=(4, 6))
        ),
    }


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_coupling_noises_are_identical_at_rho_1_and_fresh_at_rho_0(family, pipes, monkeypatch):
    pipe, seen = pipes[family], []

    def spy(pipe, clean, timestep, noise):
        seen.append(noise.clone())
        return corrupt(pipe, clean, timestep, noise)

    monkeypatch.setattr(coupling_module, "corrupt", spy)
    clean = torch.randn(3, *pipe.latent_shape, generator=torch.Generator().manual_seed(2))
    coupling_experiment(pipe, clean, [4], rhos=(0.0, 1.0), batch_size=3, bootstrap=0, progress=False)
    at_zero, at_one = seen[:4], seen[4:]
    assert all(torch.equal(noise, at_one[0]) for noise in at_one)  # ρ = 1: one noise for every step
    assert torch.equal(at_zero[0], at_one[0])  # the same fresh draws for every ρ (paired)
    flat = torch.stack([n.flatten() for n in at_zero])
    correlation = torch.corrcoef(flat)[~torch.eye(4, dtype=torch.bool)]
    assert correlation.abs().max() < 0.3  # ρ = 0: independent draws (3·12·dim numbers each)


def test_coupling_without_self_conditioning_effect_has_ratio_one(tiny_langflow):
    # the official initialisation zeroes the self-conditioning projection: SC changes nothing, d = 0
    pipe = LangFlowPipeline(tiny_langflow, LangFlowScheduler(), tiny_tokenizer())
    clean = tiny_langflow.embed(torch.randint(40, (4, 12), generator=torch.Generator().manual_seed(3)))
    result = coupling_experiment(pipe, clean, [4], rhos=(0.0, 1.0), batch_size=2, bootstrap=0, progress=False)
    assert result.risk_ratio[4] == [1.0, 1.0] and all(math.isnan(a) for a in result.alpha_star[4])


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_coupling_is_reproducible_and_consistent(family, pipes):
    pipe = pipes[family]
    clean = torch.randn(5, *pipe.latent_shape, generator=torch.Generator().manual_seed(4))

    def run():
        return coupling_experiment(
            pipe, clean, [4, 6], generator=torch.Generator().manual_seed(0), batch_size=2, bootstrap=20, progress=False
        )

    first, second = run(), run()
    assert first == second
    for n in (4, 6):
        assert len(first.alpha_star[n]) == 5 and all(math.isfinite(a) for a in first.alpha_star[n])
        assert len(first.alpha_star_by_step[n][0]) == n - 1  # steps k ≥ 1
        difference = first.paired_difference[n]
        assert difference.value == pytest.approx(first.alpha_star[n][0] - first.alpha_star[n][-1])
        assert difference.ci[0] <= difference.ci[1] and difference.resamples == 20
    with pytest.raises(ValueError, match="shape"):
        coupling_experiment(pipe, clean[:, :3], [4], progress=False)


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_step_scaling_end_to_end(family, pipes):
    pipe = pipes[family]
    result = step_scaling_experiment(
        pipe, [4, 6], num_trajectories=3, substeps=4, batch_size=2, bootstrap=20, progress=False
    )
    assert result.prefixes == [4, 2]
    for n in (4, 6):  # ELF: its final step to t = 1 is left out; LangFlow's final evaluation updates nothing
        rows = [row for row in result.steps if row.nfe == n]
        assert {row.call for row in rows} == {0, 1} and len(rows) <= 2 * (n - 1)
    for row in result.steps:
        assert row.widths[1] == pytest.approx(row.width / 2)  # m = 2 of 4 equal substeps
        assert all(v > 0 for v in row.correction_rms)
        for width, correction, contribution in zip(
            row.widths, row.correction_rms, row.latent_contribution_rms, strict=True
        ):  # the latent contribution is (1 − e^{−h})·C*, width by width
            assert contribution == pytest.approx(-math.expm1(-width) * correction, rel=1e-6)
    if family == "elf":
        assert {(e.nfe, e.step) for e in result.excluded} >= {(4, 3), (6, 5)}
    else:
        assert max(row.step for row in result.steps if row.nfe == 4) == 2
    for exponents in (result.exponents, result.pooled_exponents):
        for key in ("correction", "latent_contribution"):
            assert math.isfinite(exponents[key].value) and exponents[key].ci[0] <= exponents[key].ci[1]
    # the latent contribution's extra factor 1 − e^{−h} adds between 0 and 1 to the order (≈ 1 for small h)
    assert 0 < result.exponents["latent_contribution"].value - result.exponents["correction"].value < 1
    with pytest.raises(ValueError, match="substeps"):
        step_scaling_experiment(pipe, [4], substeps=3, progress=False)


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_innovation_end_to_end(family, pipes):
    pipe = pipes[family]
    result = innovation_experiment(pipe, [4, 6], num_trajectories=3, batch_size=2, progress=False)
    rho_sq = pipe.sampler_statistics.rho_sq
    assert result.rho_sq_range == [float(rho_sq.min()), float(rho_sq.max())]
    for n in (4, 6):
        rows = {row.configuration: row for row in result.rows[n]}
        assert list(rows) == ["official", "overlap", "reversed", "random"]
        assert rows["official"].transformed_steps == 0 and rows["official"].alignment is None
        for name in ("overlap", "reversed", "random"):
            row = rows[name]
            assert row.transformed_steps > 0
            # every retention is ≤ 1 along an orthonormal basis: a transform can only lower E
            assert row.energy_transformed < row.energy and row.normalized_decrease < 0
            assert -1 <= row.alignment <= 1
        assert set(result.by_step[n]) == set(rows) and len(result.by_step[n]["overlap"]) == n - 1
    # the official sampler's steps are the same for every run of the same seeds
    again = innovation_experiment(pipe, [4], num_trajectories=3, batch_size=2, assignments=(), progress=False)
    assert again.rows[4][0] == result.rows[4][0]
    pipe.sampler_statistics = None
    with pytest.raises(ValueError, match="calibrate it first"):
        innovation_experiment(pipe, [4], progress=False)


def test_innovation_refuses_an_uncalibrated_nfe(pipes):
    with pytest.raises(ValueError, match="No sampler statistics for 8 steps"):
        innovation_experiment(pipes["langflow"], [8], progress=False)


# ---------------------------------------------------------------------------------------------------------------
# The command


@pytest.fixture
def saved(pipes, tmp_path):
    folder = tmp_path / "tiny-langflow"
    pipes["langflow"].save_pretrained(folder)
    text = tmp_path / "text.txt"
    generator = torch.Generator().manual_seed(5)
    lines = [" ".join(f"w{i}" for i in torch.randint(3, 40, (30,), generator=generator).tolist()) for _ in range(8)]
    text.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return folder, text


def _written_result(result, tmp_path) -> str:
    """The `result` entry of the JSON payload that `write_outputs` writes, as text."""
    paths = {suffix: tmp_path / f"m-d.{suffix}" for suffix in ("json", "md", "png")}
    write_outputs(paths, {"result": result.to_json()}, "", lambda path: path.write_bytes(b""))
    return paths["json"].read_text()


def _expected_result(result: dict) -> str:
    return json.dumps({"result": result}, indent=2, ensure_ascii=False) + "\n"


def test_coupling_results_are_keyed_by_int_nfe_and_written_with_string_keys_in_nfe_order(tmp_path):
    nan = float("nan")
    result = CouplingResult(nfe=[16, 8], rhos=[0.0, 1.0], num_examples=3)
    result.alpha_star = {16: [0.5, 0.25], 8: [nan, 0.125]}
    result.risk_ratio = {16: [0.9, 1.1], 8: [1.0, 1.0]}
    result.alpha_star_by_step = {16: [[0.5], [0.25]], 8: [[nan], [0.125]]}
    result.control_alpha_star = {16: [0.75, 0.5], 8: [0.5, 0.25]}
    result.control_risk_ratio = {16: [0.8, 0.9], 8: [0.7, 0.6]}
    result.paired_difference = {
        16: BootstrapEstimate(0.25, (0.125, 0.375), 0.95, 10),
        8: BootstrapEstimate(nan, None, 0.9, 0),
    }
    expected = {
        "nfe": [16, 8],
        "rhos": [0.0, 1.0],
        "num_examples": 3,
        "alpha_star": {"16": [0.5, 0.25], "8": [None, 0.125]},
        "risk_ratio": {"16": [0.9, 1.1], "8": [1.0, 1.0]},
        "alpha_star_by_step": {"16": [[0.5], [0.25]], "8": [[None], [0.125]]},
        "control_alpha_star": {"16": [0.75, 0.5], "8": [0.5, 0.25]},
        "control_risk_ratio": {"16": [0.8, 0.9], "8": [0.7, 0.6]},
        "paired_difference": {
            "16": {"estimate": 0.25, "ci": [0.125, 0.375], "confidence": 0.95, "resamples": 10},
            "8": {"estimate": None, "ci": None, "confidence": 0.9, "resamples": 0},
        },
    }
    assert _written_result(result, tmp_path) == _expected_result(expected)  # byte for byte: key order included


def test_innovation_results_are_keyed_by_int_nfe_and_written_with_string_keys_in_nfe_order(tmp_path):
    result = InnovationResult(nfe=[8, 16], num_trajectories=2, rho_sq_range=[0.25, 0.5])
    result.eta_r = {8: 0.5, 16: 0.25}
    result.rows = {
        8: [InnovationRow("official", 2.0, None, None, None, 0), InnovationRow("overlap", 2.0, 1.5, 0.75, -3.0, 4)],
        16: [InnovationRow("official", 1.0, None, None, float("nan"), 0)],
    }
    result.by_step = {8: {"official": [2.0, 1.0], "overlap": [1.5, 0.5]}, 16: {"official": [1.0]}}
    official = {"configuration": "official", "energy": 2.0, "energy_transformed": None, "alignment": None}
    expected = {
        "nfe": [8, 16],
        "num_trajectories": 2,
        "rho_sq_range": [0.25, 0.5],
        "eta_r": {"8": 0.5, "16": 0.25},
        "rows": {
            "8": [
                {**official, "normalized_decrease": None, "transformed_steps": 0},
                {
                    "configuration": "overlap",
                    "energy": 2.0,
                    "energy_transformed": 1.5,
                    "alignment": 0.75,
                    "normalized_decrease": -3.0,
                    "transformed_steps": 4,
                },
            ],
            "16": [{**official, "energy": 1.0, "normalized_decrease": None, "transformed_steps": 0}],
        },
        "by_step": {"8": {"official": [2.0, 1.0], "overlap": [1.5, 0.5]}, "16": {"official": [1.0]}},
    }
    assert _written_result(result, tmp_path) == _expected_result(expected)
    assert result.rows[8][1].to_json() == expected["rows"]["8"][1]


@pytest.mark.parametrize(
    "diagnostic, options",
    [
        ("coupling", ["--num-examples", "3", "--rhos", "0", "1", "--bootstrap", "10"]),
        ("step-scaling", ["--num-trajectories", "2", "--substeps", "4", "--bootstrap", "10"]),
        ("innovation", ["--num-trajectories", "2", "--assignments", "overlap", "reversed"]),
    ],
)
def test_diagnose_writes_its_results_and_refuses_to_overwrite(diagnostic, options, saved, tmp_path, capsys):
    folder, text = saved
    out = tmp_path / "results"
    argv = ["diagnose", diagnostic, str(folder), "--nfe", "4", "6", "--batch-size", "2", "--device", "cpu"]
    argv += ["--output-dir", str(out), "--no-progress", *options]
    if diagnostic == "coupling":
        argv += ["--text-file", str(text)]
    assert main(argv) == 0
    paths = [out / f"tiny-langflow-{diagnostic}.{suffix}" for suffix in ("json", "md", "png")]
    assert all(path.stat().st_size > 0 for path in paths)
    payload = json.loads(paths[0].read_text())
    command = payload["command"].split()
    assert command[:4] == ["untied-sc", "diagnose", diagnostic, str(folder)] and "--seed" in command
    assert main(command[1:]) == 2  # the recorded command parses, and is refused over the existing results
    assert payload["diagnostic"] == diagnostic and payload["device"] == "cpu" and payload["paper"]["model"] == "ELF-B"
    assert payload["result"]["nfe"] == [4, 6]
    assert "Command: `untied-sc diagnose" in paths[1].read_text()
    written = paths[0].read_text()
    capsys.readouterr()
    assert main(argv) == 2  # refused before any work
    assert "pass --overwrite" in capsys.readouterr().err and paths[0].read_text() == written
    assert main([*argv, "--overwrite"]) == 0
    again = json.loads(paths[0].read_text())
    assert again["result"] == payload["result"]  # same seed, same numbers


def test_diagnose_coupling_says_what_is_wrong(saved, tmp_path, capsys):
    folder, text = saved
    base = ["diagnose", "coupling", str(folder), "--output-dir", str(tmp_path), "--no-progress"]
    assert main([*base, "--text-file", str(tmp_path / "missing.txt")]) == 2
    assert "does not exist" in capsys.readouterr().err
    assert main([*base, "--text-file", str(text), "--rhos", "0", "1.2"]) == 2
    assert "--rhos must lie in [0, 1]" in capsys.readouterr().err


def test_clean_latents_from_text(pipes, tmp_path, monkeypatch):
    from transformers import BertConfig, BertModel

    from untied_sc_lab.diagnostics import data
    from untied_sc_lab.training.encoder import FrozenTextEncoder, LatentNormalization, paragraph_windows

    text = tmp_path / "text.txt"
    text.write_text("w3 w4 w5 w6 w7\n\nw8 w9 w10 w11 w12 w13 w14 w15 w16 w17 w18 w19\nw20 w21\n", encoding="utf-8")
    # LangFlow: windows of the packed stream (the text's 19 words and 3 newlines), embedded
    langflow = pipes["langflow"]
    clean = data.clean_latents_from_text(langflow, text, 4, torch.Generator().manual_seed(0))
    assert clean.shape == (4, 12, 32)
    rows = (clean[:, :, None, :] - langflow.transformer.embedding_matrix()[None, None]).abs().sum(-1).min(-1).values
    assert rows.max() < 1e-5  # every position is a token's E_norm row
    # ELF: [CLS] … [SEP] windows through a (tiny, real) frozen encoder, normalised by the folder's statistics
    elf = pipes["elf"]
    elf.tokenizer.add_special_tokens({"cls_token": "w3", "sep_token": "</s>"})
    torch.manual_seed(0)
    bert = BertModel(
        BertConfig(
            vocab_size=40,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=16,
        )
    )
    monkeypatch.setattr(data, "load_minilm_encoder", lambda path=None: FrozenTextEncoder(bert))
    with pytest.raises(FileNotFoundError, match="latent_normalization.json"):
        data.clean_latents_from_text(elf, text, 3, torch.Generator().manual_seed(1), tmp_path)
    LatentNormalization(mean=0.5, std=2.0).save(tmp_path)
    clean = data.clean_latents_from_text(elf, text, 3, torch.Generator().manual_seed(1), tmp_path)
    ids, mask = paragraph_windows(data.read_paragraphs(text), elf.tokenizer, 12)
    picked = torch.randint(len(ids), (3,), generator=torch.Generator().manual_seed(1))
    expected = (FrozenTextEncoder(bert).encode(ids[picked], mask[picked]) - 0.5) / 2.0
    assert torch.allclose(clean, expected, atol=1e-6)
    LatentNormalization(mean=0.5, std=2.0, encoder="MiniLM, weights rounded to float16").save(tmp_path)
    with pytest.raises(ValueError, match="--encoder-dir"):  # trained through another encoder: refused, not guessed
        data.clean_latents_from_text(elf, text, 3, torch.Generator().manual_seed(1), tmp_path)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        data.clean_latents_from_text(elf, tmp_path / "missing.txt", 3, torch.Generator(), tmp_path)
