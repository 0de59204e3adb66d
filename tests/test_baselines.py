"""The comparison samplers (Momentum, HiGS, ACE, DPM-Solver++(2M)): their pure math against hand computations, the
neutral strengths as exact identities, ACE's offline direction, and (below) the schedulers built on them.

Hand computations are written out in the comments; the numbers are chosen so that every intermediate is exact in
binary floating point where the test asserts equality.
"""

import copy
import math

import pytest
import torch

from untied_sc.calibration.ace import (
    ACEStatistics,
    contrast_direction,
    estimate_ace_direction,
    trajectory_features,
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
from untied_sc.schedulers.solvers import ELFSolver, LangFlowSolver

from .conftest import Golden, elf_from_golden
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
    from untied_sc import ELFPipeline, ELFScheduler

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
    assert carried.config.estimated_fingerprint == statistics.config.model_fingerprint
    assert torch.equal(carried.direction, statistics.direction)
