"""The pure math of the comparison samplers of the paper's Table 13: Momentum, HiGS, ACE, and a second-order multistep
solver (docs/algorithm.md §9 "Comparison samplers", which states the sources and every choice they leave open).

Every function here is stateless: it takes the tensors of one step and returns a tensor (or a float), never mutates
its inputs and never draws random numbers. The comparison schedulers hold the trajectory state (velocity, history
average, previous prediction) and call these. Each function with a strength returns its input itself (the same tensor,
bit for bit) at its neutral strength, so that a comparison sampler at zero strength is the official sampler.

Conventions:

- Predictions have shape (B, L, D): batch, positions, width. p_k is the raw clean prediction of evaluation k (ELF: x̂;
  LangFlow: softmax(logits)·E_norm), the "data prediction" / "denoised" / x_0-prediction of the sources.
- Log signal-to-noise ratios λ = log(α/σ) follow DPM-Solver++ (Lu et al., arXiv 2211.01095): ELF's interpolant
  z_t = t·x + s(1 − t)·ε has α_t = t, σ_t = s(1 − t) (s the noise scale, 2.0); LangFlow's variance-preserving γ
  parametrisation has α² = sigmoid(−γ), σ² = sigmoid(γ), so λ = −γ/2.
"""

import math

import torch


# ---------------------------------------------------------------------------------------------------------------------
# Log-SNR of each family and the noise level a source's schedule is written in.


def elf_log_snr(t: float, noise_scale: float) -> float:
    """
    λ(t) = log(α_t/σ_t) = log t − log(s(1 − t)) of ELF's interpolant z_t = t·x + s(1 − t)·ε (s = `noise_scale`).

    −∞ at t ≤ 0 (pure noise) and +∞ at t ≥ 1 (clean data). Differences of λ do not depend on s.
    """
    if t <= 0.0:
        return -math.inf
    if t >= 1.0:
        return math.inf
    return math.log(t) - math.log(noise_scale * (1.0 - t))


def langflow_log_snr(gamma: float) -> float:
    """λ(γ) = ½·log(sigmoid(−γ)/sigmoid(γ)) = −γ/2 of LangFlow's variance-preserving parametrisation."""
    return -gamma / 2.0


def flow_matching_time(log_snr: float) -> float:
    """
    The noise level t ∈ [0, 1] (1 = noise) of the linear flow-matching interpolant x_t = (1 − t)·x + t·ε with the same
    signal-to-noise ratio: α/σ = (1 − t)/t = e^λ, so t = sigmoid(−λ) = σ/(α + σ).

    HiGS's weight schedule is written in this time (its headline model, SiT, is this interpolant); for ELF with noise
    scale 1 it is 1 − t_ELF. λ = −∞ gives 1, λ = +∞ gives 0.
    """
    if log_snr >= 0.0:
        e = math.exp(-log_snr)
        return e / (1.0 + e)
    return 1.0 / (1.0 + math.exp(log_snr))


# ---------------------------------------------------------------------------------------------------------------------
# Momentum: Wizadwongsa et al., "Diffusion Sampling with Momentum for Mitigating Divergence Artifacts", ICLR 2024
# (arXiv 2307.11118), heavy-ball (HB) momentum.


def heavy_ball_velocity(velocity: torch.Tensor | None, direction: torch.Tensor, beta: float) -> torch.Tensor:
    r"""
    The heavy-ball velocity of Momentum (Wizadwongsa et al. 2024: Polyak's heavy ball on the solver's data-prediction
    combination, as their official `MomentumDPMSolverMultistepScheduler` computes it):

        v_0 = d_0,        v_k = (1 − β)·v_{k−1} + β·d_k      (k ≥ 1),

    where d_k is what the solver would step with (the source: DPM-Solver++(2M)'s D_0 + ½D_1; a first-order solver:
    the clean prediction p_k itself, since ELF's and LangFlow's steps are DPM-Solver++(1), docs/algorithm.md §9.1).
    The solver then steps with v_k in place of d_k. β = 1 is no momentum: `direction` itself is returned.

    Args:
        velocity (`torch.Tensor`, *optional*): v_{k−1}; `None` at the first step (then v_0 = d_0 is returned).
        direction (`torch.Tensor`): d_k.
        beta (`float`): β ∈ (0, 1], the weight of the new direction (the source's `momentum`; its configs use 0.9
            and 0.8).

    Returns:
        `torch.Tensor`: v_k, in `direction`'s dtype.
    """
    if not 0.0 < beta <= 1.0:
        raise ValueError(f"The heavy-ball weight β must lie in (0, 1] (1: no momentum), got {beta}.")
    if velocity is None or beta == 1.0:
        return direction
    return (1.0 - beta) * velocity + beta * direction


# ---------------------------------------------------------------------------------------------------------------------
# HiGS: Sadat, Salehi, Weber, "History-Guided Sampling" (ICLR 2026, arXiv 2509.22300). No official code or paper text
# was available: the equations are those two independent reimplementations state (UR-al/sam-extra `history.py`, which
# cites the paper's Eqs. 5, 6, 8, 9, Appendix F and Algorithms 2–3, and comfy-cfg-megapack; they agree).


def higs_weight(noise_level: float, weight: float, t_min: float, t_max: float) -> float:
    r"""
    HiGS's square-root weight schedule:

        w(t) = w_HiGS·sqrt((t − t_min)/(t_max − t_min))   for t_min < t ≤ t_max,   else 0,

    with t the noise level (1 = noise, [`flow_matching_time`]): largest at high noise, 0 at and below t_min.

    Args:
        noise_level (`float`): t ∈ [0, 1].
        weight (`float`): w_HiGS ≥ 0 (the sources' default 1.75; 0 switches HiGS off).
        t_min (`float`), t_max (`float`): the window, 0 ≤ t_min < t_max ≤ 1 (the sources' defaults 0.4 and 1.0).
    """
    if weight < 0:
        raise ValueError(f"The HiGS weight w must be ≥ 0, got {weight}.")
    if not 0.0 <= t_min < t_max <= 1.0:
        raise ValueError(f"The HiGS window needs 0 ≤ t_min < t_max ≤ 1, got t_min={t_min}, t_max={t_max}.")
    if weight == 0.0 or not t_min < noise_level <= t_max:
        return 0.0
    return weight * math.sqrt((noise_level - t_min) / (t_max - t_min))


def history_average(average: torch.Tensor | None, prediction: torch.Tensor, alpha: float) -> torch.Tensor:
    r"""
    HiGS's history, the exponential moving average of past predictions:

        g_k = α·D_k + (1 − α)·g_{k−1},   g_{−1} = 0   (no bias correction, as both reimplementations),

    updated with the *unguided* prediction D_k (the history stores what the network predicted, not HiGS's output).

    Args:
        average (`torch.Tensor`, *optional*): g_{k−1}; `None` before the first step (g_{−1} = 0, so g_0 = α·D_0).
        prediction (`torch.Tensor`): D_k.
        alpha (`float`): α ∈ (0, 1], the weight of the current prediction (the sources: 0.75, or 0.5).
    """
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"The HiGS history weight α must lie in (0, 1], got {alpha}.")
    if average is None:
        return alpha * prediction
    return alpha * prediction + (1.0 - alpha) * average


def project_history_difference(difference: torch.Tensor, prediction: torch.Tensor, eta: float) -> torch.Tensor:
    r"""
    HiGS's orthogonal projection of the history difference ΔD = D_k − g_{k−1} (against over-saturation):

        ΔD∥ = (⟨ΔD, D_k⟩/⟨D_k, D_k⟩)·D_k,      ΔD(η) = ΔD − ΔD∥ + η·ΔD∥,

    per sample over all positions and channels, the inner products in float64 (as the reimplementations). η = 0
    keeps the orthogonal part only (the sources' "FID setting"), η = 1 is no projection (`difference` is returned).
    A sample whose D_k is exactly zero has ΔD∥ = 0.
    """
    if eta == 1.0:
        return difference
    d64, p64 = difference.double(), prediction.double()
    dims = tuple(range(1, difference.ndim))
    energy = (p64 * p64).sum(dim=dims, keepdim=True)
    coefficient = (d64 * p64).sum(dim=dims, keepdim=True) / torch.where(energy > 0, energy, torch.ones_like(energy))
    parallel = torch.where(energy > 0, coefficient, torch.zeros_like(coefficient)) * p64
    return (d64 - (1.0 - eta) * parallel).to(difference.dtype)


def dct_high_pass_matrix(
    length: int, cutoff: float, sharpness: float, dtype: torch.dtype = torch.float64, device=None
) -> torch.Tensor:
    r"""
    HiGS's frequency filter (its Appendix F / Algorithm 3) along the sequence axis, as one (L, L) matrix
    M = Cᵀ·diag(H)·C; the image's 2-D index grid R = sqrt(u² + v²) becomes the sequence's 1-D one, R_k = k/L:

        C[k, n] = sqrt(2/L)·c_k·cos(π(2n + 1)k/(2L)),   c_0 = 1/√2, else 1   (orthonormal DCT-II; C⁻¹ = Cᵀ),
        H(R_k)  = sigmoid(λ_f·(R_k − R_c)),   R_k = k/L,

    a soft high-pass: H(0) = sigmoid(−λ_f R_c) ≈ 0.076 at the defaults R_c = 0.05, λ_f = 50, H(R_c) = ½. Applying
    it, M @ x (per sample and channel), mostly removes the sequence-constant part of x.
    """
    if length < 1:
        raise ValueError(f"The sequence length must be ≥ 1, got {length}.")
    k = torch.arange(length, dtype=torch.float64)[:, None]
    n = torch.arange(length, dtype=torch.float64)[None, :]
    basis = math.sqrt(2.0 / length) * torch.cos(math.pi * (2 * n + 1) * k / (2 * length))
    basis[0] /= math.sqrt(2.0)
    response = torch.sigmoid(sharpness * (torch.arange(length, dtype=torch.float64) / length - cutoff))
    return (basis.T @ (response[:, None] * basis)).to(dtype=dtype, device=device)


def history_guidance(
    prediction: torch.Tensor,
    average: torch.Tensor | None,
    weight: float,
    eta: float,
    filter_matrix: torch.Tensor | None = None,
) -> torch.Tensor:
    r"""
    HiGS's guided prediction, the current prediction moved away from the average of past ones:

        D̃_k = D_k + w(t)·F(ΔD(η)),      ΔD = D_k − g_{k−1},

    with F the high-pass filter M @ · along positions ([`dct_high_pass_matrix`]) or the identity (`filter_matrix`
    `None`). w(t) = 0, or no history yet (`average` `None`: HiGS's first step only seeds g), returns `prediction`.

    Args:
        prediction (`torch.Tensor`): D_k, shape (B, L, D).
        average (`torch.Tensor`, *optional*): g_{k−1} ([`history_average`]), which excludes D_k.
        weight (`float`): w(t) of this step ([`higs_weight`]).
        eta (`float`): η, the weight of ΔD's component along D_k ([`project_history_difference`]).
        filter_matrix (`torch.Tensor` of shape `(L, L)`, *optional*): the filter; `None` for none.
    """
    if weight == 0.0 or average is None:
        return prediction
    guidance = project_history_difference(prediction - average, prediction, eta)
    if filter_matrix is not None:
        guidance = filter_matrix.to(device=guidance.device, dtype=guidance.dtype) @ guidance
    return prediction + weight * guidance


# ---------------------------------------------------------------------------------------------------------------------
# ACE: Zhang, Chen, He, Du, Lan, "Attractor-Contrast-Escape" (arXiv 2607.00588), official code
# ZhangShuai1230/ACE-DLM (`steering.py`).


def remove_repetition_direction(
    self_conditioning: torch.Tensor, direction: torch.Tensor, scale: float
) -> torch.Tensor:
    r"""
    ACE's steering of the self-conditioning input (its `steering._run`): after each step, the prediction fed back as
    the next self-conditioning input is moved against the repetition direction d,

        m_{k+1} = p_k − λ·d,

    with d a unit D-vector estimated offline ([`untied_sc.calibration.ace`]), broadcast over batch and positions.
    λ = 0 returns `self_conditioning` itself (the official default is λ = 2.0).
    """
    if scale == 0.0:
        return self_conditioning
    if direction.ndim != 1 or direction.shape[0] != self_conditioning.shape[-1]:
        raise ValueError(
            f"The ACE direction must be a ({self_conditioning.shape[-1]},) vector matching the latent width, got "
            f"shape {tuple(direction.shape)}: it belongs to another model."
        )
    return self_conditioning - scale * direction.to(device=self_conditioning.device, dtype=self_conditioning.dtype)


# ---------------------------------------------------------------------------------------------------------------------
# Second-order multistep: DPM-Solver++(2M), Lu et al., "DPM-Solver++: Fast Solver for Guided Sampling of Diffusion
# Probabilistic Models" (arXiv 2211.01095), Algorithm 2.


def multistep_coefficient(previous_log_snr: float, log_snr: float, next_log_snr: float) -> float:
    r"""
    The weight 1/(2r_k) of DPM-Solver++(2M)'s backward difference (Lu et al. 2022, Algorithm 2):

        h_k = λ_next − λ_k,   h_{k−1} = λ_k − λ_{k−1},   r_k = h_{k−1}/h_k,   1/(2r_k) = h_k/(2h_{k−1}),

    where λ_{k−1}, λ_k are the log-SNRs at which the previous and the current prediction were evaluated and λ_next is
    the step's target. 0, i.e. the first-order (DDIM) step, wherever the backward difference is undefined: no finite
    positive h_{k−1} (the first step; a previous evaluation at pure noise, λ = −∞; an evaluation not less noisy than
    the previous one, which ELF's re-noising can produce; repeated grid points) or no finite h_k (a step to clean
    data, λ_next = +∞, where DDIM is exact in its last prediction: the sources' lower-order final step).
    """
    step, previous_step = next_log_snr - log_snr, log_snr - previous_log_snr
    if not (math.isfinite(step) and math.isfinite(previous_step) and previous_step > 0.0):
        return 0.0
    return step / (2.0 * previous_step)


def multistep_prediction(
    prediction: torch.Tensor, previous_prediction: torch.Tensor | None, coefficient: float, strength: float = 1.0
) -> torch.Tensor:
    r"""
    DPM-Solver++(2M)'s data-prediction combination (Lu et al. 2022, Algorithm 2):

        D_k = (1 + c_k)·p_k − c_k·p_{k−1} = p_k + c_k·(p_k − p_{k−1}),   c_k = strength·1/(2r_k),

    which the family's first-order step (DDIM, DPM-Solver++(1)) then takes in place of p_k. strength = 1 is
    DPM-Solver++(2M); strength = 0, c_k = 0 ([`multistep_coefficient`]) or no previous prediction returns
    `prediction` itself.
    """
    c = strength * coefficient
    if c == 0.0 or previous_prediction is None:
        return prediction
    return prediction + c * (prediction - previous_prediction)
