"""The comparison samplers (Momentum, HiGS, ACE, DPM-Solver++(2M)): their pure math against hand computations, the
neutral strengths as exact identities, ACE's offline direction, and (below) the schedulers built on them.

Hand computations are written out in the comments; the numbers are chosen so that every intermediate is exact in
binary floating point where the test asserts equality.
"""

import copy
import json
import math

import pytest
import torch

from untied_sc import ELFPipeline, LangFlowPipeline
from untied_sc.calibration.ace import (
    ACEStatistics,
    contrast_direction,
    estimate_ace_direction,
    save_ace_statistics,
    trajectory_features,
)
from untied_sc.schedulers import (
    ACEELFScheduler,
    ACELangFlowScheduler,
    ELFScheduler,
    HiGSACEELFScheduler,
    HiGSACELangFlowScheduler,
    HiGSELFScheduler,
    HiGSLangFlowScheduler,
    LangFlowScheduler,
    MomentumELFScheduler,
    MomentumLangFlowScheduler,
    MultistepELFScheduler,
    MultistepLangFlowScheduler,
    UntiedELFScheduler,
    UntiedLangFlowScheduler,
    model_fingerprint,
)
from untied_sc.schedulers.baseline_functions import (
    dct_high_pass_matrix,
    elf_log_snr,
    flow_matching_time,
    heavy_ball_velocity,
    higs_weight,
    history_average,
    history_guidance,
    langflow_log_snr,
    multistep_coefficient,
    multistep_prediction,
    project_history_difference,
    remove_repetition_direction,
)
from untied_sc.schedulers.comparison_names import comparison_scheduler_class
from untied_sc.schedulers.solvers import ELFSolver, LangFlowSolver

from .conftest import Golden, elf_from_golden, golden_call, langflow_from_golden, replay_official_network
from .test_scheduler_config import _public, diffusers_warnings
from .tiny import tiny_tokenizer


def _t(*rows) -> torch.Tensor:
    """A (1, L, D) tensor from L rows of D numbers."""
    return torch.tensor([list(rows)], dtype=torch.float32)


# --- Momentum ------------------------------------------------------------------------------------------------------


def test_heavy_ball_velocity_by_hand():
    # v = (1 − β)·v_prev + β·d with β = 3/4:
    #   0.25·[1, 2] + 0.75·[3, −1] = [0.25 + 2.25, 0.5 − 0.75] = [2.5, −0.25]
    velocity = heavy_ball_velocity(_t([1.0, 2.0]), _t([3.0, -1.0]), beta=0.75)
    assert torch.equal(velocity, _t([2.5, -0.25]))


def test_heavy_ball_starts_from_the_first_direction_and_beta_one_is_the_identity():
    direction = torch.randn(2, 3, 4)
    assert heavy_ball_velocity(None, direction, beta=0.8) is direction  # v_0 = d_0
    assert heavy_ball_velocity(torch.randn(2, 3, 4), direction, beta=1.0) is direction  # β = 1: no momentum
    with pytest.raises(ValueError, match="β"):
        heavy_ball_velocity(None, direction, beta=0.0)


# --- HiGS ----------------------------------------------------------------------------------------------------------


def test_higs_weight_schedule_by_hand():
    # w(t) = w·sqrt((t − t_min)/(t_max − t_min)) on t_min < t ≤ t_max: w = 2, window (0.2, 1.0]
    assert higs_weight(0.6, 2.0, 0.2, 1.0) == pytest.approx(2.0 * math.sqrt(0.5))  # sqrt(0.4/0.8)
    assert higs_weight(1.0, 2.0, 0.2, 1.0) == 2.0  # the top of the window: the full weight
    assert higs_weight(0.2, 2.0, 0.2, 1.0) == 0.0  # t_min itself is outside
    assert higs_weight(0.1, 2.0, 0.2, 1.0) == 0.0
    assert higs_weight(0.6, 0.0, 0.2, 1.0) == 0.0
    with pytest.raises(ValueError, match="window"):
        higs_weight(0.5, 1.0, 0.6, 0.4)


def test_history_average_by_hand():
    # g_0 = α·D_0 (g_{−1} = 0, no bias correction): 0.75·[2, 4] = [1.5, 3]
    first = history_average(None, _t([2.0, 4.0]), alpha=0.75)
    assert torch.equal(first, _t([1.5, 3.0]))
    # g_1 = α·D_1 + (1 − α)·g_0 = 0.75·[4, 0] + 0.25·[1.5, 3] = [3 + 0.375, 0.75]
    assert torch.equal(history_average(first, _t([4.0, 0.0]), alpha=0.75), _t([3.375, 0.75]))


def test_project_history_difference_by_hand():
    # D = [1, 1] (two positions, one channel), ΔD = [3, 1]: ⟨ΔD, D⟩ = 4, ⟨D, D⟩ = 2, ΔD∥ = 2·D = [2, 2],
    # ΔD − ΔD∥ = [1, −1]; η = ½ adds back ½·[2, 2]: [2, 0].
    prediction, difference = _t([1.0], [1.0]), _t([3.0], [1.0])
    assert torch.equal(project_history_difference(difference, prediction, eta=0.0), _t([1.0], [-1.0]))
    assert torch.equal(project_history_difference(difference, prediction, eta=0.5), _t([2.0], [0.0]))
    assert project_history_difference(difference, prediction, eta=1.0) is difference  # no projection
    # A zero prediction has no direction to project on: the difference is kept.
    assert torch.equal(project_history_difference(difference, torch.zeros_like(prediction), eta=0.0), difference)


def test_project_history_difference_is_per_sample():
    prediction, difference = torch.randn(3, 5, 4, dtype=torch.float64), torch.randn(3, 5, 4, dtype=torch.float64)
    orthogonal = project_history_difference(difference, prediction, eta=0.0)
    assert torch.allclose((orthogonal * prediction).sum(dim=(1, 2)), torch.zeros(3, dtype=torch.float64), atol=1e-12)
    alone = project_history_difference(difference[1:2], prediction[1:2], eta=0.0)
    assert torch.equal(alone, orthogonal[1:2])


def test_dct_high_pass_matrix_by_hand():
    # L = 2: C = [[1, 1], [1, −1]]/√2; R = (0, ½); with R_c = ¼, λ_f = 4: H = (sigmoid(−1), sigmoid(1)).
    # M = Cᵀ diag(H) C = ½·[[H0 + H1, H0 − H1], [H0 − H1, H0 + H1]], H0 + H1 = 1, H0 − H1 = −tanh(½).
    matrix = dct_high_pass_matrix(2, cutoff=0.25, sharpness=4.0)
    off = -math.tanh(0.5) / 2
    expected = torch.tensor([[0.5, off], [off, 0.5]], dtype=torch.float64)
    assert torch.allclose(matrix, expected, atol=1e-15)


def test_dct_high_pass_keeps_high_frequencies_and_damps_a_constant_sequence():
    matrix = dct_high_pass_matrix(16, cutoff=0.05, sharpness=50.0)
    # A constant sequence is the DCT's k = 0 vector: it is scaled by H(0) = sigmoid(−50·0.05) ≈ 0.076.
    constant = torch.ones(16, dtype=torch.float64)
    assert torch.allclose(matrix @ constant, torch.sigmoid(torch.tensor(-2.5, dtype=torch.float64)) * constant)
    # A pass-everything filter is the identity (C is orthonormal).
    identity = dct_high_pass_matrix(16, cutoff=-1.0, sharpness=1e4)
    assert torch.allclose(identity, torch.eye(16, dtype=torch.float64), atol=1e-12)


def test_history_guidance_by_hand():
    # D = [1, 1], g = [−2, 0]: ΔD = [3, 1], orthogonal part [1, −1] (η = 0, above); w = ½: D̃ = [1.5, 0.5].
    prediction, average = _t([1.0], [1.0]), _t([-2.0], [0.0])
    assert torch.equal(history_guidance(prediction, average, weight=0.5, eta=0.0), _t([1.5], [0.5]))
    # With the L = 2 filter above: M·[1, −1] = (½ + tanh(½)/2)·[1, −1], so D̃ = D + ½·that.
    matrix = dct_high_pass_matrix(2, cutoff=0.25, sharpness=4.0)
    gain = 0.5 * (0.5 + math.tanh(0.5) / 2)
    expected = _t([1.0 + gain], [1.0 - gain])
    assert torch.allclose(history_guidance(prediction, average, 0.5, 0.0, matrix), expected, atol=1e-7)


def test_history_guidance_is_the_identity_at_zero_weight_and_without_history():
    prediction, average = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    assert history_guidance(prediction, average, weight=0.0, eta=0.0) is prediction
    assert history_guidance(prediction, None, weight=1.75, eta=0.0) is prediction  # the first step seeds g only


def test_higs_with_unit_alpha_no_projection_no_filter_is_self_guidance_on_the_previous_prediction():
    # α = 1 makes g_{k−1} = D_{k−1}; η = 1 keeps all of ΔD: D̃ = D + w(D − D_prev), SG-prev (research notes §5).
    previous, prediction = torch.randn(2, 3, 4), torch.randn(2, 3, 4)
    average = history_average(None, previous, alpha=1.0)
    guided = history_guidance(prediction, average, weight=0.7, eta=1.0)
    assert torch.equal(guided, prediction + 0.7 * (prediction - previous))


# --- ACE -----------------------------------------------------------------------------------------------------------


def test_remove_repetition_direction_by_hand():
    # m − λ·d with d = [0.6, 0.8], λ = 2, at every position: [−1.2, −1.6].
    direction = torch.tensor([0.6, 0.8])
    steered = remove_repetition_direction(torch.zeros(1, 2, 2), direction, scale=2.0)
    assert torch.equal(steered, torch.tensor([[[-1.2, -1.6], [-1.2, -1.6]]]))
    m = torch.randn(2, 3, 2)
    assert remove_repetition_direction(m, direction, scale=0.0) is m
    with pytest.raises(ValueError, match="latent width"):
        remove_repetition_direction(m, torch.ones(3), scale=1.0)


def test_contrast_direction_by_hand():
    # Labels sorted ascending: rows 0 (0.0), 2 (0.1), 4 (0.2), 1 (0.5), 5 (0.8), 3 (0.9); a third is 2 rows:
    # bottom = {0, 2}, top = {5, 3}. Bottom features average [1, 1], top [4, 5]: d = [3, 4], ‖d‖ = 5.
    features = torch.tensor([[1.0, 0.0], [9.0, 9.0], [1.0, 2.0], [5.0, 5.0], [9.0, 9.0], [3.0, 5.0]])
    labels = torch.tensor([0.0, 0.5, 0.1, 0.9, 0.2, 0.8])
    direction, top, bottom = contrast_direction(features, labels)
    assert torch.allclose(direction, torch.tensor([0.6, 0.8]) * 5 / (5 + 1e-8))
    assert top == pytest.approx(0.85) and bottom == pytest.approx(0.05)
    with pytest.raises(ValueError, match="no contrast"):
        contrast_direction(features[:2], labels[:2])


# --- DPM-Solver++(2M) ----------------------------------------------------------------------------------------------


def test_log_snr_and_flow_matching_time():
    assert elf_log_snr(0.5, 2.0) == pytest.approx(math.log(0.5))  # log(0.5/(2·0.5))
    assert elf_log_snr(0.0, 2.0) == -math.inf and elf_log_snr(1.0, 2.0) == math.inf
    assert langflow_log_snr(3.0) == -1.5
    # sigmoid(−λ): the flow-matching time with the same SNR; for noise scale 1 it is 1 − t.
    assert flow_matching_time(elf_log_snr(0.3, 1.0)) == pytest.approx(0.7)
    assert flow_matching_time(0.0) == 0.5
    assert flow_matching_time(-math.inf) == 1.0 and flow_matching_time(math.inf) == 0.0


def test_multistep_coefficient_by_hand():
    # λ_{k−1} = 0, λ_k = 1, λ_next = 3: h_{k−1} = 1, h_k = 2, 1/(2r) = h_k/(2h_{k−1}) = 1.
    assert multistep_coefficient(0.0, 1.0, 3.0) == 1.0
    assert multistep_coefficient(-math.inf, 1.0, 3.0) == 0.0  # previous evaluation at pure noise
    assert multistep_coefficient(0.0, 1.0, math.inf) == 0.0  # a step to clean data: first order
    assert multistep_coefficient(1.0, 1.0, 3.0) == 0.0  # repeated evaluation point
    assert multistep_coefficient(2.0, 1.0, 3.0) == 0.0  # re-noised below the previous evaluation


def test_multistep_prediction_by_hand():
    # D = p + strength·c·(p − p_prev) = 2 + ½·1·(2 − 1) = 2.5
    assert torch.equal(multistep_prediction(_t([2.0]), _t([1.0]), coefficient=1.0, strength=0.5), _t([2.5]))
    p = torch.randn(2, 3, 4)
    assert multistep_prediction(p, torch.randn(2, 3, 4), coefficient=1.0, strength=0.0) is p
    assert multistep_prediction(p, torch.randn(2, 3, 4), coefficient=0.0) is p
    assert multistep_prediction(p, None, coefficient=1.0) is p


def _dpm_solver_pp_2m(z, p, p_prev, alpha_next, sigma, sigma_next, lam_prev, lam, lam_next):
    """Lu et al. (2022), Algorithm 2, written out in float64: x_t = (σ_t/σ_s)x − α_t(e^{−h} − 1)D."""
    h, h_prev = lam_next - lam, lam - lam_prev
    r = h_prev / h
    d = (1 + 1 / (2 * r)) * p - 1 / (2 * r) * p_prev
    return (sigma_next / sigma) * z - alpha_next * (math.exp(-h) - 1) * d


def test_elf_step_with_the_multistep_prediction_is_dpm_solver_pp_2m():
    # ELF: α_t = t, σ_t = s(1 − t). The official step from the re-noised s_k to t_{k+1} with q = D_k is the
    # 2M update with the previous prediction placed at its own evaluation time s_{k−1}.
    noise_scale, grid = 2.0, [0.0, 0.2, 0.35, 0.6, 1.0]
    solver = ELFSolver(grid, sde_gamma=0.5, noise_scale=noise_scale)
    k = 2
    s_prev, s, t_next = solver.eval_time(k - 1), solver.eval_time(k), grid[k + 1]
    assert 0 < s_prev < s < t_next < 1
    lam_prev, lam, lam_next = (elf_log_snr(x, noise_scale) for x in (s_prev, s, t_next))
    generator = torch.Generator().manual_seed(0)
    z, p, p_prev = (torch.randn(2, 3, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    c = multistep_coefficient(lam_prev, lam, lam_next)
    got = solver.update(k, z, multistep_prediction(p, p_prev, c))
    sigma, sigma_next = noise_scale * (1 - s), noise_scale * (1 - t_next)
    expected = _dpm_solver_pp_2m(z, p, p_prev, t_next, sigma, sigma_next, lam_prev, lam, lam_next)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)
    # The final ODE step to t = 1 is first order (λ_next = +∞): the step returns q = p.
    last = len(grid) - 2
    c_last = multistep_coefficient(
        elf_log_snr(solver.eval_time(last - 1), 2.0), elf_log_snr(grid[last], 2.0), math.inf
    )
    assert c_last == 0.0


def test_langflow_step_with_the_multistep_prediction_is_dpm_solver_pp_2m():
    # LangFlow: α² = sigmoid(−γ), σ² = sigmoid(γ), λ = −γ/2.
    gammas = torch.tensor([4.0, 2.5, 1.0, -1.0])
    solver = LangFlowSolver(gammas, -1.0, 4.0)
    k = 1
    g_prev, g, g_next = (gammas[i].item() for i in (k - 1, k, k + 1))
    lam_prev, lam, lam_next = (langflow_log_snr(x) for x in (g_prev, g, g_next))
    generator = torch.Generator().manual_seed(1)
    z, p, p_prev = (torch.randn(2, 3, 4, generator=generator, dtype=torch.float64) for _ in range(3))
    got = solver.update(k, z, multistep_prediction(p, p_prev, multistep_coefficient(lam_prev, lam, lam_next)))

    def alpha(x):
        return math.sqrt(1 / (1 + math.exp(x)))

    def sigma(x):
        return math.sqrt(1 / (1 + math.exp(-x)))

    expected = _dpm_solver_pp_2m(z, p, p_prev, alpha(g_next), sigma(g), sigma(g_next), lam_prev, lam, lam_next)
    assert torch.allclose(got, expected, rtol=1e-12, atol=1e-12)


# --- ACE's offline direction ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def golden_elf():
    """The tiny ELF of the sampler fixtures (trained-looking weights: its predictions are not zero)."""
    return elf_from_golden(Golden("elf_sample_nfe8.safetensors"))


def _tiny_elf_pipeline(model):
    pipe = ELFPipeline(model, ELFScheduler(sde_gamma=1.0), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    return pipe


def test_ace_direction_is_estimated_reproducibly_and_round_trips(golden_elf, tmp_path):
    pipe = _tiny_elf_pipeline(golden_elf)
    kwargs = {"num_trajectories": 6, "num_inference_steps": 4, "batch_size": 3, "progress": False}
    statistics = estimate_ace_direction(pipe, **kwargs)
    again = estimate_ace_direction(pipe, **kwargs)
    assert torch.equal(statistics.direction, again.direction)
    assert torch.linalg.vector_norm(statistics.direction).item() == pytest.approx(1.0, abs=1e-6)
    assert statistics.config.solver == "elf" and statistics.config.num_trajectories == 6
    assert len(statistics.batch_seeds) == 2
    assert type(pipe.scheduler).__name__ == "ELFScheduler"  # the pipeline's own scheduler is back
    statistics.check_model(golden_elf)
    statistics.save_pretrained(tmp_path / "ace_statistics")
    loaded = ACEStatistics.from_pretrained(tmp_path / "ace_statistics")
    assert torch.equal(loaded.direction, statistics.direction)
    loaded.check_model(golden_elf)


def test_save_ace_statistics_adds_the_component_to_a_pipeline_folder(golden_elf, tmp_path):
    pipe = _tiny_elf_pipeline(golden_elf)
    pipe.save_pretrained(tmp_path)
    weights = (tmp_path / "transformer" / "diffusion_pytorch_model.safetensors").read_bytes()
    statistics = estimate_ace_direction(pipe, num_trajectories=3, num_inference_steps=3, progress=False)
    save_ace_statistics(statistics, tmp_path)
    index = json.loads((tmp_path / "model_index.json").read_text())
    assert index["ace_statistics"] == ["untied_sc.calibration.ace", "ACEStatistics"]
    assert torch.equal(ACEStatistics.from_pretrained(tmp_path / "ace_statistics").direction, statistics.direction)
    assert (tmp_path / "transformer" / "diffusion_pytorch_model.safetensors").read_bytes() == weights
    with pytest.raises(FileNotFoundError, match="model_index"):
        save_ace_statistics(statistics, tmp_path / "transformer")


def test_ace_features_are_the_mean_self_conditioning_input(golden_elf):
    # u = mean over the first N − 1 evaluations of the prediction's token mean, the predictions fed back.
    pipe = _tiny_elf_pipeline(golden_elf)
    seen = []
    forward = pipe.transformer.forward

    def spy(sample, timestep, self_conditioning=None, *args, **kwargs):
        if self_conditioning is not None and not kwargs.get("decoder_step_active"):
            seen.append(self_conditioning.double().mean(dim=1))
        return forward(sample, timestep, self_conditioning, *args, **kwargs)

    pipe.transformer.forward = spy
    try:
        features, texts = trajectory_features(pipe, 4, torch.Generator().manual_seed(0), 2)
    finally:
        del pipe.transformer.forward
    assert len(seen) == 3 and len(texts) == 2
    assert torch.allclose(features, torch.stack(seen).mean(dim=0), atol=1e-12)
    assert features.abs().max() > 0


def test_ace_direction_refuses_another_model(golden_elf, tiny_langflow):
    pipe = _tiny_elf_pipeline(golden_elf)
    statistics = estimate_ace_direction(pipe, num_trajectories=3, num_inference_steps=3, progress=False)
    with pytest.raises(ValueError, match="family"):
        statistics.check_model(tiny_langflow)
    other = copy.deepcopy(golden_elf)
    with torch.no_grad():
        other.self_cond_proj.weight.mul_(1.5)
    with pytest.raises(ValueError, match="fingerprint"):
        statistics.check_model(other)
    carried = statistics.for_model(other)  # deliberate reuse, as ACE's recipe reuses ELF-B's direction
    carried.check_model(other)
    with torch.no_grad():  # matched once; a later in-place write is still caught
        other.self_cond_proj.weight.add_(1.0)
    with pytest.raises(ValueError, match="fingerprint"):
        carried.check_model(other)
    assert carried.config.estimated_fingerprint == statistics.config.model_fingerprint
    assert torch.equal(carried.direction, statistics.direction)


# --- The comparison schedulers -------------------------------------------------------------------------------------

COMPARISON = {
    "elf": {
        "momentum": MomentumELFScheduler,
        "higs": HiGSELFScheduler,
        "ace": ACEELFScheduler,
        "higs_ace": HiGSACEELFScheduler,
        "multistep": MultistepELFScheduler,
    },
    "langflow": {
        "momentum": MomentumLangFlowScheduler,
        "higs": HiGSLangFlowScheduler,
        "ace": ACELangFlowScheduler,
        "higs_ace": HiGSACELangFlowScheduler,
        "multistep": MultistepLangFlowScheduler,
    },
}
OFFICIAL = {"elf": ELFScheduler, "langflow": LangFlowScheduler}
UNTIED = {"elf": UntiedELFScheduler, "langflow": UntiedLangFlowScheduler}
ZERO_STRENGTH = {
    "momentum": {"momentum_beta": 1.0},
    "higs": {"higs_weight": 0.0},
    "ace": {"ace_strength": 0.0},
    "higs_ace": {"higs_weight": 0.0, "ace_strength": 0.0},
    "multistep": {"multistep_strength": 0.0},
}
# Away from every default, every pathway used somewhere.
CONFIGURED = {
    "momentum": {"momentum_beta": 0.8, "momentum_routing": "both"},
    "higs": {"higs_weight": 1.5, "higs_alpha": 0.5, "higs_eta": 0.5, "higs_t_min": 0.1, "higs_routing": "solver"},
    "ace": {"ace_strength": 1.5, "ace_routing": "both"},
    "higs_ace": {"higs_weight": 1.0, "higs_filter": "none", "higs_t_min": 0.1, "ace_strength": 0.5},
    "multistep": {"multistep_strength": 0.5, "multistep_routing": "both"},
}
CASES = [(family, method) for family in COMPARISON for method in COMPARISON[family]]


def _case_id(case) -> str:
    return f"{case[0]}-{case[1]}"


def _golden_pipeline(family: str, nfe_file: int = 8):
    golden = Golden(f"{family}_sample_nfe{nfe_file}.safetensors")
    if family == "elf":
        pipe = ELFPipeline(elf_from_golden(golden), ELFScheduler(), tiny_tokenizer())
    else:
        pipe = LangFlowPipeline(langflow_from_golden(golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    return pipe, golden


def _trajectory(pipe, nfe: int, seed: int = 42, batch_size: int = 3):
    latents = []

    def record(pipe, step, timestep, tensors):
        latents.append(tensors["latents"].clone())
        return {}

    generator = torch.Generator().manual_seed(seed)
    output = pipe(
        batch_size=batch_size,
        num_inference_steps=nfe,
        generator=generator,
        output_type="seq",
        callback_on_step_end=record,
    )
    return output, torch.stack(latents)


def _ace_statistics(pipe, seed: int = 0) -> ACEStatistics:
    """A random unit direction declared for `pipe`'s model (the schedulers' tests need no estimation)."""
    model = pipe.transformer
    width = pipe.latent_shape[1]
    statistics = ACEStatistics(solver=pipe.family, latent_dim=width, model_fingerprint=model_fingerprint(model))
    direction = torch.randn(width, generator=torch.Generator().manual_seed(seed))
    statistics.direction.copy_(direction / direction.norm())
    return statistics


@pytest.mark.parametrize("nfe", [8, 32])
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_zero_strength_reproduces_the_official_trajectory_bit_for_bit(case, nfe):
    family, method = case
    official, _ = _golden_pipeline(family)
    expected, expected_latents = _trajectory(official, nfe)
    pipe, _ = _golden_pipeline(family)
    pipe.scheduler = COMPARISON[family][method].from_config(pipe.scheduler.config, **ZERO_STRENGTH[method])
    got, latents = _trajectory(pipe, nfe)
    assert torch.equal(latents, expected_latents)
    assert torch.equal(got.latents, expected.latents) and torch.equal(got.sequences, expected.sequences)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_zero_strength_matches_the_official_golden_generation(case, monkeypatch):
    family, method = case
    pipe, golden = _golden_pipeline(family)
    pipe.scheduler = COMPARISON[family][method].from_config(pipe.scheduler.config, **ZERO_STRENGTH[method])
    replay_official_network(pipe, golden, monkeypatch)  # the sampler alone, bit for bit on any CPU (see conftest)
    output = pipe(**golden_call(golden), output_type="seq")
    rows = golden.outputs["trajectory_rows"]
    assert torch.equal(output.latents, golden.outputs["latents"][rows])
    assert torch.equal(output.sequences, golden.outputs["tokens"][rows])


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_each_method_changes_the_trajectory_with_one_evaluation_per_step(case):
    family, method = case
    official, _ = _golden_pipeline(family)
    _, expected_latents = _trajectory(official, 8)
    pipe, _ = _golden_pipeline(family)
    pipe.scheduler = COMPARISON[family][method].from_config(pipe.scheduler.config, **CONFIGURED[method])
    if "ace" in method:
        pipe.scheduler.ace_statistics = _ace_statistics(pipe)
    calls = []
    pipe.transformer.register_forward_hook(lambda *args: calls.append(1))
    _, latents = _trajectory(pipe, 8)
    assert len(calls) == 8 + (1 if family == "elf" else 0)  # ELF's decode pass is not an NFE
    assert torch.isfinite(latents).all()
    assert not torch.equal(latents[-1], expected_latents[-1])


def _model_fn(z: torch.Tensor, t, self_conditioning: torch.Tensor | None) -> torch.Tensor:
    """A deterministic stand-in network whose prediction depends on its self-conditioning input."""
    m = torch.zeros_like(z) if self_conditioning is None else self_conditioning
    return torch.tanh(z + 0.5 * m) + 0.1 * float(t) * torch.cos(z)


def _set_kwargs(family: str, seed: int = 3) -> dict:
    if family == "elf":
        return {"generator": torch.Generator().manual_seed(seed)}
    return {"proposal": (4.5, 0.9, 1e-5)}


def _run(scheduler, family: str, steps: int, pathways=None):
    """
    The sampling loop on `scheduler`; with `pathways(k, p) -> (q, m)` the loop hands `scheduler` (an official one)
    q and feeds m back itself: the reference a comparison scheduler must equal.
    """
    scheduler.set_timesteps(steps, **_set_kwargs(family))
    latents = torch.randn(2, 6, 4, generator=torch.Generator().manual_seed(7)) * scheduler.init_noise_sigma
    self_conditioning, records = None, []
    for k, t in enumerate(scheduler.timesteps):
        prediction = _model_fn(scheduler.scale_model_input(latents, t), t, self_conditioning)
        if pathways is None:  # the scheduler routes
            latents = scheduler.step(prediction, t, latents).prev_sample
            self_conditioning = scheduler.self_conditioning
        else:  # the loop routes: LangFlow's final evaluation gets the prediction as it is
            updates = k < scheduler.solver.num_update_steps
            q, self_conditioning = pathways(scheduler, k, prediction) if updates else (prediction, prediction)
            latents = scheduler.step(q, t, latents).prev_sample
        records.append((latents, self_conditioning))
    return records


def _reference_momentum(beta, routing):
    state = {}

    def pathways(solver_scheduler, k, p):
        state["v"] = p if "v" not in state else (1 - beta) * state["v"] + beta * p
        v = state["v"]
        return (v if routing != "self_conditioning" else p), (v if routing != "solver" else p)

    return pathways


def _noise_level(scheduler, k):
    t = scheduler.solver.eval_time(k)
    log_snr = elf_log_snr(t, 2.0) if isinstance(scheduler, ELFScheduler) else langflow_log_snr(t)
    return 1 / (1 + math.exp(log_snr)) if math.isfinite(log_snr) else (1.0 if log_snr < 0 else 0.0)


def _reference_higs(w, alpha, eta, t_min, t_max, routing, filtered, ace_strength=0.0, direction=None):
    state = {}

    def pathways(scheduler, k, p):
        weight = w * math.sqrt((_noise_level(scheduler, k) - t_min) / (t_max - t_min))
        weight = weight if t_min < _noise_level(scheduler, k) <= t_max else 0.0
        guided = p
        if "g" in state and weight > 0:
            difference = p - state["g"]
            parallel = (difference * p).sum(dim=(1, 2), keepdim=True) / (p * p).sum(dim=(1, 2), keepdim=True) * p
            guidance = difference - (1 - eta) * parallel
            if filtered:
                guidance = dct_high_pass_matrix(p.shape[1], 0.05, 50.0, p.dtype) @ guidance
            guided = p + weight * guidance
        state["g"] = alpha * p + (1 - alpha) * state["g"] if "g" in state else alpha * p
        q, m = (guided if routing != "self_conditioning" else p), (guided if routing != "solver" else p)
        return q, m - ace_strength * direction if ace_strength else m

    return pathways


def _reference_multistep(strength, routing):
    state = {}

    def pathways(scheduler, k, p):
        if isinstance(scheduler, ELFScheduler):
            lam = elf_log_snr(scheduler.solver.eval_time(k), 2.0)
            lam_next = elf_log_snr(scheduler.solver.grid[k + 1], 2.0)
        else:
            lam, lam_next = -scheduler.solver.eval_time(k) / 2, -scheduler.solver.gammas[k + 1].item() / 2
        combined = p
        if "p" in state:
            h, h_prev = lam_next - lam, lam - state["lam"]
            if math.isfinite(h) and math.isfinite(h_prev) and h_prev > 0:
                combined = p + strength * h / (2 * h_prev) * (p - state["p"])
        state["p"], state["lam"] = p, lam
        return (combined if routing != "self_conditioning" else p), (combined if routing != "solver" else p)

    return pathways


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_momentum_scheduler_is_the_heavy_ball_loop(family):
    scheduler = COMPARISON[family]["momentum"](momentum_beta=0.7, momentum_routing="both")
    _check_against_reference(family, scheduler, _reference_momentum(0.7, "both"))


@pytest.mark.parametrize("family", ["elf", "langflow"])
@pytest.mark.parametrize("filtered", [False, True])
def test_higs_scheduler_is_the_history_guidance_loop(family, filtered):
    config = {"higs_weight": 1.5, "higs_alpha": 0.6, "higs_eta": 0.25, "higs_t_min": 0.05, "higs_t_max": 1.0}
    scheduler = COMPARISON[family]["higs"](**config, higs_filter="dct" if filtered else "none", higs_routing="solver")
    reference = _reference_higs(1.5, 0.6, 0.25, 0.05, 1.0, "solver", filtered)
    _check_against_reference(family, scheduler, reference)


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_higs_ace_scheduler_steers_what_higs_routed_to_self_conditioning(family):
    direction = torch.tensor([0.5, -0.5, 0.5, 0.5])
    scheduler = COMPARISON[family]["higs_ace"](higs_weight=1.0, higs_filter="none", higs_t_min=0.05, ace_strength=0.8)
    statistics = ACEStatistics(solver=family, latent_dim=4)
    statistics.direction.copy_(direction)
    scheduler.ace_statistics = statistics
    reference = _reference_higs(1.0, 0.75, 0.0, 0.05, 1.0, "both", False, ace_strength=0.8, direction=direction)
    _check_against_reference(family, scheduler, reference)


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_multistep_scheduler_is_the_dpm_solver_pp_2m_loop(family):
    scheduler = COMPARISON[family]["multistep"](multistep_strength=1.0, multistep_routing="solver")
    _check_against_reference(family, scheduler, _reference_multistep(1.0, "solver"))


def _check_against_reference(family, scheduler, reference):
    got = _run(scheduler, family, 8)
    expected = _run(OFFICIAL[family](), family, 8, reference)
    for (latents, self_conditioning), (latents_ref, self_conditioning_ref) in zip(got, expected, strict=True):
        assert torch.allclose(latents, latents_ref, rtol=1e-5, atol=1e-6)
        assert torch.allclose(self_conditioning, self_conditioning_ref, rtol=1e-5, atol=1e-6)
    assert not torch.allclose(got[-1][0], _run(OFFICIAL[family](), family, 8)[-1][0])


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_ace_scheduler_needs_a_direction_of_its_family(family):
    scheduler = COMPARISON[family]["ace"]()
    with pytest.raises(ValueError, match="repetition direction"):
        scheduler.set_timesteps(8, **_set_kwargs(family))
    other = "langflow" if family == "elf" else "elf"
    with pytest.raises(ValueError, match="another model"):
        scheduler.set_timesteps(8, **_set_kwargs(family), ace_statistics=ACEStatistics(solver=other, latent_dim=4))
    statistics = ACEStatistics(solver=family, latent_dim=4)
    scheduler.set_timesteps(8, **_set_kwargs(family), ace_statistics=statistics)
    scheduler.set_timesteps(8, **_set_kwargs(family))  # the direction is kept for later runs
    assert scheduler.ace_statistics is statistics


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_official_comparison_official_swaps_keep_the_keys_without_warnings(case):
    family, method = case
    official_cls, comparison_cls = OFFICIAL[family], COMPARISON[family][method]
    official = official_cls()
    with diffusers_warnings() as logged:
        comparison = comparison_cls.from_config(official.config, **CONFIGURED[method])
        back = official_cls.from_config(comparison.config)
        again = comparison_cls.from_config(back.config)
        untied = UNTIED[family].from_config(comparison.config)
        from_untied = comparison_cls.from_config(untied.config)
    assert not logged, [record.getMessage() for record in logged]
    assert type(comparison) is comparison_cls and type(back) is official_cls and type(again) is comparison_cls
    assert {key: back.config[key] for key in _public(official.config)} == _public(official.config)
    assert all(back.config[key] == value for key, value in CONFIGURED[method].items())
    assert _public(again.config) == _public(comparison.config) == _public(from_untied.config)
    assert set(OFFICIAL[family]().compatibles) == set(comparison.compatibles)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_save_and_reload_gives_the_same_config_and_the_same_samples(case, tmp_path):
    family, method = case
    pipe, _ = _golden_pipeline(family)
    pipe.scheduler = COMPARISON[family][method].from_config(pipe.scheduler.config, **CONFIGURED[method])
    if "ace" in method:
        pipe.scheduler.ace_statistics = _ace_statistics(pipe)
    first, _ = _trajectory(pipe, 8)
    pipe.scheduler.save_pretrained(tmp_path)
    with diffusers_warnings() as logged:
        reloaded = COMPARISON[family][method].from_pretrained(tmp_path)
    assert not logged
    assert _public(reloaded.config) == _public(pipe.scheduler.config)
    reloaded.ace_statistics = getattr(pipe.scheduler, "ace_statistics", None)
    pipe.scheduler = reloaded
    again, _ = _trajectory(pipe, 8)
    assert torch.equal(again.latents, first.latents)


def test_comparison_schedulers_check_their_config():
    with pytest.raises(ValueError, match="momentum_beta"):
        MomentumELFScheduler(momentum_beta=0.0)
    with pytest.raises(ValueError, match="higs_routing"):
        HiGSLangFlowScheduler(higs_routing="everywhere")
    with pytest.raises(ValueError, match="window"):
        HiGSELFScheduler(higs_t_min=0.9, higs_t_max=0.5)
    with pytest.raises(ValueError, match="higs_filter"):
        HiGSACEELFScheduler(higs_filter="wavelet")
    with pytest.raises(ValueError, match="multistep_strength"):
        MultistepLangFlowScheduler(multistep_strength=-1.0)


def test_comparison_scheduler_class_names_every_scheduler():
    for family, schedulers in COMPARISON.items():
        for method, scheduler_cls in schedulers.items():
            assert comparison_scheduler_class(method, family) is scheduler_cls
            assert scheduler_cls.family == family
    with pytest.raises(ValueError, match="methods are"):
        comparison_scheduler_class("sg", "elf")
