"""Algorithm 1 re-derived from the paper in float64, compared with the untied schedulers (ELF, LangFlow).

What it checks: `UntiedELFScheduler` and `UntiedLangFlowScheduler`, driven as a pipeline drives them over a
deterministic toy denoiser, give at every network evaluation the same time input, latent input z (ELF: re-noised),
self-conditioning input m̃_k and prediction p_k, and on every update step the same solver input q_k and next latent
z_{k+1} as the reference below, to float64 rounding. The untied step that the schedulers run is checked (on the lab's
`AblationUntiedELFScheduler` / `AblationUntiedLangFlowScheduler` for an ablation switch), and so is the oracle it is
tested against elsewhere, the lab's scheduler with `reference_chain` (the functions of each quantity chained), over
both families, the routings, the ablation switches, the mask, the online cosine distance and several coefficient
settings.

Independence: the reference shares no code with the scheduler. It is written here from the paper (Algorithm 1; App.
A.2 eqs. (16)-(19) for κ_k; App. B.1 eq. (34) for the retention; App. B.3 eqs. (36)-(39) for H_k, G_k, U_k, Δu_k;
eq. (11) and App. B.5 for Π_k; App. B.4, below eq. (40), for the token cosine distance) and from the official
samplers as docs/algorithm.md §2 describes them (ELF's logit-normal grid, churn and clamped Euler step; LangFlow's
Gumbel-quantile γ grid and float64 DDIM step). This file imports from untied_sc only the public classes
it checks and `SamplerStatistics`, to hand the scheduler statistics with a known, non-trivial overlap spectrum: no
solver, grid, transform or correction function of the library is used, so a slip in one of them (ρ for ρ² in the
retention, κ_{k+1} for κ_k, the EMA or the self-conditioning input fed p + A) cannot pass by being on both sides.

Random numbers: the reference draws its own, from generators seeded like the scheduler's, in the official order
(ELF: the grid's N − 1 normals from a generator seeded alike, as the official CPU run draws them from the global RNG;
then z_0 and one re-noising tensor per SDE step from the sampling generator; LangFlow: z_0 only). Nothing is read
back from the scheduler except its outputs, which are what is compared.
"""

import math
from dataclasses import dataclass, field

import pytest
import torch

from untied_sc import SamplerStatistics, UntiedELFScheduler, UntiedLangFlowScheduler
from untied_sc_lab.ablations import AblationUntiedELFScheduler, AblationUntiedLangFlowScheduler


DTYPE = torch.float64
BATCH, LENGTH, WIDTH, RANK = 3, 7, 12, 8
STEPS = 8  # N, the NFE
SEED = 123
INACTIVE_STEPS = (0, 3)  # σ_k = 0 there: H_k = 0 and A_k = η_T μ_k (App. B.3, eq. (36))

# The official solvers' settings (docs/algorithm.md §2.1, §2.2): ELF's training grid, noise scale, velocity clamp and
# the paper's churn for 8 NFE; LangFlow's proposal (the model defaults) and quantile range.
ELF_P_MEAN, ELF_P_STD = -1.5, 0.8
ELF_NOISE_SCALE = 2.0
ELF_T_EPS = 0.05
ELF_SDE_GAMMA = 2.0
LANGFLOW_PROPOSAL = (4.723, 0.852, 1e-5)  # (loc, scale, cutoff) of the Gumbel proposal
LANGFLOW_QUANTILE_EPS = 1e-5

BASE_SCALES = (0.8, 0.9)  # λ_R^(0), g_T^(0)
COEFFICIENTS = {"eta_r": 2.0, "eta_t": 1.5, "eta_o": 1.2, "alpha": 0.7}
EPS_FP, DEGENERACY_EPS = 0.01, 1e-12  # the schedulers' defaults (docs/algorithm.md §3.1, §3.5)


pytestmark = pytest.mark.usefixtures("one_thread")  # tiny tensors: a second thread only contends


# ----------------------------------------------------------------------------------------------------------------
# Fixtures: a deterministic toy denoiser and statistics with a non-trivial overlap spectrum.
# ----------------------------------------------------------------------------------------------------------------


class ToyDenoiser:
    """p = tanh(h + ½·mean over positions of h), h = W_z z + W_m m̃ + 0.3·t·c: smooth, nonlinear, mixes positions."""

    def __init__(self, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.w_z = torch.randn(WIDTH, WIDTH, generator=g, dtype=DTYPE) / WIDTH**0.5
        self.w_m = torch.randn(WIDTH, WIDTH, generator=g, dtype=DTYPE) / WIDTH**0.5
        self.time = torch.randn(WIDTH, generator=g, dtype=DTYPE)

    def __call__(self, z: torch.Tensor, m: torch.Tensor | None, t: float) -> torch.Tensor:
        t = torch.tensor(t, dtype=torch.float32).item()  # a network's time input is float32, as `timesteps`
        h = z @ self.w_z + t * 0.3 * self.time
        if m is not None:  # the network's "no self-conditioning yet" is m = 0
            h = h + m @ self.w_m
        return torch.tanh(h + 0.5 * h.mean(dim=1, keepdim=True))


@dataclass(frozen=True)
class Statistics:
    """The precomputed quantities of Algorithm 1, float64: Q, ρ², λ_R^(0), and per update step μ_k, σ_k, δ̄_k."""

    basis: torch.Tensor  # Q (D, r), orthonormal columns
    rho_sq: torch.Tensor  # ρ_i² (r,), descending
    base_exponent: float  # λ_R^(0)
    mean: torch.Tensor  # μ_k (K_u, D)
    rms: torch.Tensor  # σ_k (K_u,)
    cosine_distance: torch.Tensor  # δ̄_k (K_u,)


def num_updates(family: str) -> int:
    """K_u: N for ELF (the last, ODE step updates too), N − 1 for LangFlow (then a final evaluation); Alg. 1 note."""
    return STEPS if family == "elf" else STEPS - 1


def make_statistics(family: str, seed: int = 1) -> Statistics:
    """
    ρ² spread over [0, 1] with one fully shared direction (ρ² = 1) and one unseen one (ρ² = 0), so that ρ and ρ²
    differ; σ_k = 0 on `INACTIVE_STEPS` with μ_k ≠ 0 on one of them; δ̄_k in (0.1, 0.9) after step 0, so that â_k
    depends on it.
    """
    g = torch.Generator().manual_seed(seed)
    updates = num_updates(family)
    basis = torch.linalg.qr(torch.randn(WIDTH, RANK, generator=g, dtype=DTYPE)).Q
    rho_sq = torch.rand(RANK, generator=g, dtype=DTYPE)
    rho_sq[0], rho_sq[-1] = 1.0, 0.0
    rho_sq = torch.sort(rho_sq, descending=True).values
    rms = 0.1 + torch.rand(updates, generator=g, dtype=DTYPE)
    mean = 0.05 * torch.randn(updates, WIDTH, generator=g, dtype=DTYPE)
    rms[list(INACTIVE_STEPS)] = 0.0
    mean[0] = 0.0  # the calibration's first step: nothing to correct (μ = σ = 0)
    cosine_distance = 0.1 + 0.8 * torch.rand(updates, generator=g, dtype=DTYPE)
    cosine_distance[0] = 0.0  # as calibrated (no correction at step 0): â_1 = κ_0, 1 for ELF, so b = 1 − ρ² hits ε_fp
    return Statistics(basis, rho_sq, BASE_SCALES[0], mean, rms, cosine_distance)


def to_sampler_statistics(family: str, stats: Statistics) -> SamplerStatistics:
    """The same numbers as the scheduler's `SamplerStatistics` (its public buffers; float64 throughout)."""
    statistics = SamplerStatistics(
        solver=family, latent_dim=WIDTH, rank=RANK, calibrated_steps=[STEPS], model_fingerprint="toy"
    )
    # Assigning a tensor to a buffer's name replaces the buffer, dtype included.
    statistics.basis, statistics.rho_sq = stats.basis.clone(), stats.rho_sq.clone()
    statistics.base_scales = torch.tensor(BASE_SCALES, dtype=DTYPE)
    setattr(statistics, f"mean_nfe{STEPS}", stats.mean.clone())
    setattr(statistics, f"rms_nfe{STEPS}", stats.rms.clone())
    setattr(statistics, f"cosine_distance_nfe{STEPS}", stats.cosine_distance.clone())
    return statistics


def make_mask() -> torch.Tensor:
    """Active positions: sample 0 all, sample 1 a padded tail, sample 2 a clamped prefix and a gap."""
    mask = torch.ones(BATCH, LENGTH, dtype=torch.bool)
    mask[1, 4:] = False
    mask[2, :2] = False
    mask[2, 5] = False
    return mask


# ----------------------------------------------------------------------------------------------------------------
# The official base solvers, from docs/algorithm.md §2 and the upstream code's description.
# ----------------------------------------------------------------------------------------------------------------


class ELFReference:
    r"""
    ELF (docs/algorithm.md §2.1): t_0 = 0 < sorted(sigmoid(P_mean + P_std·ξ)) < t_N = 1; SDE steps k < N − 1 re-noise
    z_b = a_k z_k + (1 − a_k)·2ε_k with a_k = clip(1 − γ_sde (t_{k+1} − t_k), 0, 1), evaluate at s_k = a_k t_k, and
    step z_{k+1} = z_b + (t_{k+1} − s_k)(q − z_b)/max(1 − s_k, 0.05); the last step is the same with a = 1.
    """

    family = "elf"

    def __init__(self, seed: int):
        # The official CPU run draws ξ (float32) from the global RNG seeded like the sampling generator, before
        # anything else: a second generator with the same seed. The grid is float32, read as Python floats.
        normals = torch.randn(STEPS - 1, generator=torch.Generator().manual_seed(seed), dtype=torch.float32)
        inner = torch.sort(torch.sigmoid(normals * ELF_P_STD + ELF_P_MEAN)).values
        self.t = [0.0, *inner.tolist(), 1.0]
        self.a = [
            min(1.0, max(0.0, 1.0 - ELF_SDE_GAMMA * (self.t[k + 1] - self.t[k]))) if self.renoises(k) else 1.0
            for k in range(STEPS)
        ]
        self.s = [a * t for a, t in zip(self.a, self.t, strict=False)]  # the time after re-noising

    @staticmethod
    def renoises(k: int) -> bool:
        return k < STEPS - 1  # every step but the final ODE step, which draws nothing

    def eval_time(self, k: int) -> float:
        return self.s[k]

    def network_input(self, k: int, z: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        if not self.renoises(k):
            return z
        noise = torch.randn(z.shape, generator=generator, dtype=DTYPE)  # drawn even when a_k is 0 or 1
        return self.a[k] * z + (1.0 - self.a[k]) * ELF_NOISE_SCALE * noise

    def update(self, k: int, z_in: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        s, t_next = self.s[k], self.t[k + 1]
        return z_in + (t_next - s) * (q - z_in) / max(1.0 - s, ELF_T_EPS)

    def kappa(self, k: int) -> float:
        """κ_k = β_k / t_{k+1}, β_k = (t_{k+1} − s_k)/max(1 − s_k, ε) (App. A.2, eqs. (17), (18), the solver's clamp)."""
        beta = (self.t[k + 1] - self.s[k]) / max(1.0 - self.s[k], ELF_T_EPS)
        return beta / self.t[k + 1]

    def delta_u(self, k: int) -> float:
        """Δu_k = c̃(t_{k+1}) − c̃(t_k), t_k before re-noising, c̃ = c/c(1) (App. B.3, eq. (39))."""

        def clock(t: float) -> float:  # c_ε(t): −log(1 − t), continued linearly above 1 − ε
            if t <= 1.0 - ELF_T_EPS:
                return -math.log(1.0 - t)
            return -math.log(ELF_T_EPS) + (t - (1.0 - ELF_T_EPS)) / ELF_T_EPS

        return (clock(self.t[k + 1]) - clock(self.t[k])) / clock(1.0)


class LangFlowReference:
    r"""
    LangFlow (docs/algorithm.md §2.2): γ_i = clamp(Gumbel(loc, scale) quantile of q_i, γ_min, γ_max), q from 1 − 10⁻⁵
    to 10⁻⁵; the DDIM step in O = z/α, α² = sigmoid(−γ): O_{k+1} = r_k O_k + (1 − r_k) q, r_k = e^{(γ_{k+1} − γ_k)/2}
    (App. A.2, eq. (19)). No re-noising.
    """

    family = "langflow"

    def __init__(self):
        loc, scale, cutoff = LANGFLOW_PROPOSAL
        loc32, scale32 = torch.tensor(loc), torch.tensor(scale)  # the official proposal's float32 parameters
        quantiles = torch.linspace(1.0 - LANGFLOW_QUANTILE_EPS, LANGFLOW_QUANTILE_EPS, STEPS)
        # torch's Gumbel quantile, which the official proposal calls, all float32: its monotonising step computes
        # (q − 0.5) + 0.5 (the sign of tensor-valued transforms is a tensor), which rounds q near 0 to a multiple of
        # 2^-25 (≈ 1e-4 in γ_{N−1}); then q goes into the base Uniform(tiny, 1 − eps), then γ = loc − scale·log(−log u).
        finfo = torch.finfo(torch.float32)
        low, high = torch.tensor(finfo.tiny), torch.tensor(1.0 - finfo.eps)
        u = ((quantiles - 0.5) + 0.5) * (high - low) + low
        gammas = loc32 + (-scale32) * torch.log(-torch.log(u))
        self.gamma_min = (loc32 - math.log(-math.log(cutoff)) * scale32).item()
        self.gamma_max = (loc32 - math.log(cutoff) * scale32).item()
        self.gamma = gammas.clamp(min=self.gamma_min, max=self.gamma_max).tolist()

    def eval_time(self, k: int) -> float:
        return self.gamma[k]

    def network_input(self, k: int, z: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
        return z

    def _ratio(self, k: int) -> float:
        return math.exp((self.gamma[k + 1] - self.gamma[k]) / 2)  # r_k

    def update(self, k: int, z_in: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
        def signal(gamma: float) -> float:  # α(γ) = sqrt(sigmoid(−γ))
            return math.sqrt(1.0 / (1.0 + math.exp(gamma)))

        r = self._ratio(k)
        return signal(self.gamma[k + 1]) * (r * z_in / signal(self.gamma[k]) + (1.0 - r) * q)

    def kappa(self, k: int) -> float:
        return 1.0 - self._ratio(k)  # eq. (19)

    def delta_u(self, k: int) -> float:
        return (self.gamma[k] - self.gamma[k + 1]) / (self.gamma_max - self.gamma_min)  # App. B.3, eq. (39)


def base_solver(family: str, seed: int) -> ELFReference | LangFlowReference:
    return ELFReference(seed) if family == "elf" else LangFlowReference()


def initial_latent(family: str, generator: torch.Generator) -> torch.Tensor:
    """z_0: ELF 2.0·ε, LangFlow ε (the pipeline's draw from the sampling generator)."""
    noise = torch.randn(BATCH, LENGTH, WIDTH, generator=generator, dtype=DTYPE)
    return noise * ELF_NOISE_SCALE if family == "elf" else noise


# ----------------------------------------------------------------------------------------------------------------
# Algorithm 1, per sample and per token, in float64.
# ----------------------------------------------------------------------------------------------------------------


def retention_factors(
    rho_sq: torch.Tensor, a_hat: float, strength: float, eps_fp: float, global_scaling: bool
) -> torch.Tensor:
    """ℓ_{k,i} = (g_k b_{k,i})^{λ_R}, b_{k,i} = max(1 − â_k ρ_i², ε_fp), g_k = (∏_i b_{k,i})^{1/r} (App. B.1, eq. (34))."""
    b = [max(1.0 - a_hat * rho, eps_fp) for rho in rho_sq.tolist()]
    g = math.prod(b) ** (1.0 / len(b))  # r = 8 factors ≥ ε_fp: the product does not underflow here
    # Without global scaling, g_k is set to one (App. B.1, the ablation of Table 10).
    return torch.tensor([(g * bi if global_scaling else bi) ** strength for bi in b], dtype=DTYPE)


def transform_matrix(basis: torch.Tensor, ell: torch.Tensor) -> torch.Tensor:
    """F_k = I − Q(I − diag ℓ_k)Qᵀ (eqs. (7), (35)); symmetric, so a token row m maps to m F_k."""
    return torch.eye(WIDTH, dtype=DTYPE) - basis @ torch.diag(1.0 - ell) @ basis.T


def per_sample_correction(
    p: torch.Tensor,
    ema: torch.Tensor,
    average: torch.Tensor,
    active: torch.Tensor,
    mu: torch.Tensor,
    sigma: float,
    eta_t: float,
    eta_o: float,
    delta_u: float,
) -> tuple[torch.Tensor, float]:
    """
    One sample's (A_k, δ̄_k): p, E_k, O_k are (L, D), `active` (L,) its active positions I (docs/algorithm.md §3.5: the
    correction, its norms, centring and RMS run over I, and A_k = 0 elsewhere).
    """
    p_i, e_i, o_i = p[active], ema[active], average[active]
    n = p_i.shape[0]
    # H_k = 1[σ_k > 0](p_k − E_k) (App. B.3, eq. (36)).
    h = p_i - e_i if sigma > 0 else torch.zeros_like(p_i)
    # G_k = ‖H_k‖ (p_k − O_k)/‖p_k − O_k‖ when both norms exceed ε (eq. (37)); ε is relative to ‖p_k‖ (docs §3.5).
    d = p_i - o_i
    norm_h, norm_d, norm_p = (math.sqrt(float((x * x).sum())) for x in (h, d, p_i))
    nondegenerate = norm_h > DEGENERACY_EPS * norm_p and norm_d > DEGENERACY_EPS * norm_p
    g = norm_h * d / norm_d if nondegenerate else torch.zeros_like(p_i)
    # U_k = H_k + η_O Δu_k (H_k − G_k) (eqs. (10), (38)).
    u = h + eta_o * delta_u * (h - g)
    # Π_k(U_k) = μ_k + σ_k C U_k / RMS(C U_k), C the per-channel token centring over I (eq. (11), App. B.5); Π_k = μ_k
    # where C U_k = 0 (docs §3.5). A_k = η_T Π_k(U_k).
    centred = u - u.sum(dim=0) / n
    rms = math.sqrt(float((centred * centred).sum()) / (n * WIDTH))
    projection = mu + sigma * centred / rms if rms > 0 else mu.expand(n, WIDTH)
    correction = torch.zeros_like(p)
    correction[active] = eta_t * projection
    # δ̃_{k,n} = min{1, 1 − cos(H_{k,n}, G_{k,n})} over D for nondegenerate tokens, else 0, and δ̄_k its mean over I
    # (App. B.4, below eq. (40), and eq. (41); docs §3.6, the online δ̄). Rounding may put 1 − cos a hair below 0.
    distances = []
    for h_n, g_n in zip(h, g, strict=True):
        nh, ng = math.sqrt(float(h_n @ h_n)), math.sqrt(float(g_n @ g_n))
        distances.append(min(1.0, max(0.0, 1.0 - float(h_n @ g_n) / (nh * ng))) if nh > 0 and ng > 0 else 0.0)
    return correction, sum(distances) / n


@dataclass
class Record:
    """One network evaluation: what the network sees and what the solver gets and gives (update steps only)."""

    compared: dict[str, torch.Tensor]
    a_hat: list[float] = field(default_factory=list)  # â_k per sample
    kappa: float | None = None  # κ_k
    correction: torch.Tensor | None = None  # A_k


def reference_algorithm(
    family: str,
    model: ToyDenoiser,
    stats: Statistics,
    coefficients: dict[str, float],
    seed: int = SEED,
    routing: str = "solver",
    global_scaling: bool = True,
    mask: torch.Tensor | None = None,
    online: bool = False,
    assignment: str = "overlap",
    transform_seed: int = 0,
    eps_fp: float = EPS_FP,
) -> list[Record]:
    """
    Algorithm 1 with the official base solver S_k: one record per network evaluation (N in all), with the network's
    inputs (t, z, m̃_k), its prediction p_k and, on update steps, the solver input q_k and z_{k+1}.
    """
    eta_r, eta_t, eta_o, alpha = (coefficients[name] for name in ("eta_r", "eta_t", "eta_o", "alpha"))
    solver = base_solver(family, seed)
    generator = torch.Generator().manual_seed(seed)
    z = initial_latent(family, generator)
    active = mask if mask is not None else torch.ones(BATCH, LENGTH, dtype=torch.bool)

    # ρ² as the assignment ablations hand it out (App. C.6, Tables 8 and 9; docs/algorithm.md §3.6): reversed, or
    # permuted by randperm(r) from a generator seeded with the transform seed.
    rho_sq = stats.rho_sq
    if assignment == "reversed":
        rho_sq = rho_sq.flip(0)
    elif assignment == "random":
        rho_sq = rho_sq[torch.randperm(RANK, generator=torch.Generator().manual_seed(transform_seed))]
    strength = stats.base_exponent * eta_r  # λ_R = λ_R^(0) η_R (paper §4.1)

    # Initialise: m_0 = E_0 = O_0 = 0, κ_{−1} = 0, δ̄_{−1} = 0 (Alg. 1).
    m = torch.zeros_like(z)
    ema = torch.zeros_like(z)
    average = torch.zeros_like(z)
    previous_kappa = 0.0
    previous_distance = [0.0] * BATCH  # δ̄_{k−1} per sample (all equal unless online)

    records = []
    for k in range(STEPS):
        # Alg. 1 line 1: m̃_k = F_k m_k, â_k = κ_{k−1}(1 − δ̄_{k−1}) (eq. (13)); F_k acts on all positions.
        a_hat = [previous_kappa * (1.0 - previous_distance[b]) for b in range(BATCH)]
        m_tilde = torch.empty_like(m)
        for b in range(BATCH):
            ell = retention_factors(rho_sq, a_hat[b], strength, eps_fp, global_scaling)
            m_tilde[b] = m[b] @ transform_matrix(stats.basis, ell)

        # Alg. 1 line 2: p_k = f(z_k, m̃_k, t_k); ELF evaluates the re-noised z_b at s_k.
        z_in = solver.network_input(k, z, generator)
        t_k = solver.eval_time(k)
        p = model(z_in, m_tilde, t_k)
        record = Record(
            {
                "time": torch.tensor(t_k, dtype=torch.float32).to(DTYPE),
                "model_input": z_in,
                "self_conditioning": m_tilde,
                "prediction": p,
            },
            a_hat=a_hat,
        )
        records.append(record)
        if k == num_updates(family):
            break  # LangFlow's final evaluation: its logits give the tokens; no correction, no update

        # Alg. 1 lines 3-4: H_k, G_k, U_k and A_k = η_T Π_k(U_k), per sample over its active positions.
        sigma, mu = float(stats.rms[k]), stats.mean[k]
        correction = torch.zeros_like(p)
        distance = [float(stats.cosine_distance[k])] * BATCH
        for b in range(BATCH):
            correction[b], online_distance = per_sample_correction(
                p[b], ema[b], average[b], active[b], mu, sigma, eta_t, eta_o, solver.delta_u(k)
            )
            if online:
                distance[b] = online_distance

        # Routing (eq. (12); the placements of Table 1(a), Table 11): the solver and O get q_k, self-conditioning
        # gets m_{k+1}. Alg. 1 (the `solver` routing): q_k = p_k + A_k, m_{k+1} = p_k.
        q = p + correction if routing in ("solver", "both") else p
        next_m = p + correction if routing in ("self_conditioning", "both") else p

        # Alg. 1 line 5: z_{k+1} = S_k(z_k, q_k); O_{k+1} = (1 − κ_k) O_k + κ_k q_k (eq. (8)).
        kappa = solver.kappa(k)
        z = solver.update(k, z_in, q)
        average = (1.0 - kappa) * average + kappa * q
        # Alg. 1 line 6: m_{k+1}; E_{k+1} = (1 − α) E_k + α p_k, the raw prediction (eq. (6)).
        m = next_m
        ema = (1.0 - alpha) * ema + alpha * p

        previous_kappa, previous_distance = kappa, distance
        record.compared.update(solver_input=q, next_sample=z)
        record.kappa, record.correction = kappa, correction
    return records


# ----------------------------------------------------------------------------------------------------------------
# The scheduler under test, driven as a pipeline drives it.
# ----------------------------------------------------------------------------------------------------------------


def scheduler_trajectory(
    family: str,
    model: ToyDenoiser,
    stats: Statistics,
    coefficients: dict[str, float],
    chained: bool,
    seed: int = SEED,
    mask: torch.Tensor | None = None,
    **options,
) -> list[dict[str, torch.Tensor]]:
    ablation = chained or any(key in ABLATION_SWITCHES for key in options)
    if ablation:
        scheduler_cls = AblationUntiedELFScheduler if family == "elf" else AblationUntiedLangFlowScheduler
    else:
        scheduler_cls = UntiedELFScheduler if family == "elf" else UntiedLangFlowScheduler
    scheduler = scheduler_cls(**coefficients, **options)
    if chained:
        scheduler.reference_chain = True
    statistics = to_sampler_statistics(family, stats)
    generator = torch.Generator().manual_seed(seed)
    if family == "elf":
        scheduler.set_timesteps(STEPS, generator=generator, statistics=statistics, mask=mask)
    else:
        scheduler.set_timesteps(STEPS, proposal=LANGFLOW_PROPOSAL, statistics=statistics, mask=mask)
    latents = initial_latent(family, generator)
    records = []
    for k, t in enumerate(scheduler.timesteps):
        model_input = scheduler.scale_model_input(latents, t)
        self_conditioning = scheduler.self_conditioning
        prediction = model(model_input, self_conditioning, t.item())
        out = scheduler.step(prediction, t, latents)
        if self_conditioning is None:  # before the first step the network gets no SC input: m̃_0 = 0
            self_conditioning = torch.zeros_like(prediction)
        record = {
            "time": t.to(DTYPE),
            "model_input": model_input,
            "self_conditioning": self_conditioning,
            "prediction": prediction,
        }
        if k < num_updates(family):
            record.update(solver_input=out.pred_original_sample, next_sample=out.prev_sample)
        records.append(record)
        latents = out.prev_sample
    return records


# The lab's switches: a case that sets one runs on the lab's scheduler (written out here, not imported).
ABLATION_SWITCHES = (
    "correction_routing",
    "transform_assignment",
    "transform_seed",
    "global_scaling",
    "cosine_distance",
    "correction_direction",
    "direction_seed",
)

# Scheduler options (and the mask), each checked on both families, on the step and on the chained functions.
OPTION_CASES = {
    "solver_routing": {},
    "self_conditioning_routing": {"correction_routing": "self_conditioning"},
    "both_routing": {"correction_routing": "both"},
    "no_global_scaling": {"global_scaling": False},
    "reversed_assignment": {"transform_assignment": "reversed"},
    "random_assignment": {"transform_assignment": "random", "transform_seed": 5},
    "retention_floor": {"eps_fp": 0.6},  # b_{k,i} = ε_fp on the directions with large â_k ρ_i²
    "mask": {"mask": True},
    "online_distance": {"cosine_distance": "online"},
    "online_distance_mask_both_routing": {"cosine_distance": "online", "mask": True, "correction_routing": "both"},
}
# Coefficient settings that switch parts of the step on and off (different code paths of the scheduler).
COEFFICIENT_CASES = {
    "no_disagreement": ({"eta_o": 0.0}, {}),  # U_k = H_k
    "no_disagreement_mask": ({"eta_o": 0.0}, {"mask": True}),
    "correction_only": ({"eta_r": 0.0}, {}),  # F_k = I
    "transform_only": ({"eta_t": 0.0}, {}),  # A_k = 0
    "transform_only_online": ({"eta_t": 0.0}, {"cosine_distance": "online"}),  # H_k, G_k formed for δ̄_k only
    "alpha_one": ({"alpha": 1.0, "eta_r": 3.3, "eta_t": 3.3, "eta_o": 6.0}, {}),  # E_{k+1} = p_k; Table 6's largest η
    "official": ({"eta_r": 0.0, "eta_t": 0.0}, {}),  # the official sampler (docs/algorithm.md §3.7)
}
CASES = {
    **{name: (COEFFICIENTS, options) for name, options in OPTION_CASES.items()},
    **{name: ({**COEFFICIENTS, **change}, options) for name, (change, options) in COEFFICIENT_CASES.items()},
}


def reference_options(options: dict) -> dict:
    """The reference's keywords for a case's scheduler options."""
    return {
        "routing": options.get("correction_routing", "solver"),
        "global_scaling": options.get("global_scaling", True),
        "online": options.get("cosine_distance") == "online",
        "assignment": options.get("transform_assignment", "overlap"),
        "transform_seed": options.get("transform_seed", 0),
        "eps_fp": options.get("eps_fp", EPS_FP),
    }


@pytest.mark.parametrize("chained", [False, True], ids=["step", "chained"])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_scheduler_matches_algorithm_1(family: str, case: str, chained: bool):
    coefficients, options = CASES[case]
    options = dict(options)
    mask = make_mask() if options.pop("mask", False) else None
    model, stats = ToyDenoiser(), make_statistics(family)

    expected = reference_algorithm(family, model, stats, coefficients, mask=mask, **reference_options(options))
    got = scheduler_trajectory(family, model, stats, coefficients, chained, mask=mask, **options)

    assert len(got) == len(expected) == STEPS
    for k, (g, e) in enumerate(zip(got, expected, strict=True)):
        assert g.keys() == e.compared.keys(), f"step {k}"
        for name, value in e.compared.items():
            assert g[name].dtype == DTYPE, f"{name} at step {k}"
            # Observed agreement is ≤ 1e-13 (summation order); an algorithmic slip is many orders larger.
            torch.testing.assert_close(
                g[name], value, rtol=1e-10, atol=1e-12, msg=lambda m, name=name, k=k: f"{name} at k = {k}: {m}"
            )


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_reference_is_not_trivially_satisfied(family: str):
    """
    The compared runs exercise what they are meant to catch: corrections are nonzero, the transform acts, the
    options matter, and ρ vs ρ², κ_k vs κ_{k+1}, p_k vs p_k + A_k are different numbers on the compared steps.
    """
    model, stats = ToyDenoiser(), make_statistics(family)
    default = reference_algorithm(family, model, stats, COEFFICIENTS)
    official = reference_algorithm(family, model, stats, {**COEFFICIENTS, "eta_r": 0.0, "eta_t": 0.0})
    updates = num_updates(family)
    for k in range(1, updates):
        # A_k ≠ 0 (μ_3 ≠ 0 on the inactive step 3), and m̃_k ≠ m_k = p_{k−1} from k = 1 on (â_k > 0).
        assert default[k].correction.abs().max() > 1e-3, k
        assert all(a > 0.01 for a in default[k].a_hat), k
        assert not torch.allclose(default[k].compared["self_conditioning"], default[k - 1].compared["prediction"])
        assert abs(default[k].kappa - default[k - 1].kappa) > 1e-3, k  # κ_k ≠ κ_{k−1}
    rho_sq = stats.rho_sq
    assert ((rho_sq.sqrt() - rho_sq).abs() > 0.05).sum() >= RANK // 2  # ρ and ρ² differ on most directions
    # Step 0 has no history (σ_0 = 0, μ_0 = 0) and F_0 = I: it is the official step.
    torch.testing.assert_close(default[0].compared["next_sample"], official[0].compared["next_sample"], rtol=0, atol=0)
    assert not torch.allclose(default[-1].compared["prediction"], official[-1].compared["prediction"])
    variants = [
        {"routing": "self_conditioning"},
        {"routing": "both"},
        {"global_scaling": False},
        {"mask": make_mask()},
        {"online": True},
        {"assignment": "reversed"},
        {"assignment": "random", "transform_seed": 5},
        {"eps_fp": 0.6},
    ]
    for variant in variants:
        other = reference_algorithm(family, model, stats, COEFFICIENTS, **variant)
        assert not torch.allclose(other[-1].compared["prediction"], default[-1].compared["prediction"]), variant
    for change in ({"eta_o": 0.0}, {"eta_r": 0.0}, {"eta_t": 0.0}, {"alpha": 1.0}):
        other = reference_algorithm(family, model, stats, {**COEFFICIENTS, **change})
        assert not torch.allclose(other[-1].compared["prediction"], default[-1].compared["prediction"]), change


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_reference_grid_is_the_official_one(family: str):
    """
    The reference's grid is the official one without the scheduler's help: ELF's evaluation times s_k and LangFlow's
    γ_k equal the scheduler's `timesteps` bit for bit (float32), and both lie in the official ranges.
    """
    solver = base_solver(family, SEED)
    if family == "elf":
        scheduler = UntiedELFScheduler(eta_r=0.0, eta_t=0.0, eta_o=0.0, alpha=1.0)
        scheduler.set_timesteps(STEPS, generator=torch.Generator().manual_seed(SEED))
        assert solver.t[0] == 0.0 and solver.t[-1] == 1.0 and solver.t == sorted(solver.t)
        assert solver.kappa(0) == 1.0  # s_0 = 0: O_1 = q_0 (App. A.2)
    else:
        scheduler = UntiedLangFlowScheduler(eta_r=0.0, eta_t=0.0, eta_o=0.0, alpha=1.0)
        scheduler.set_timesteps(STEPS, proposal=LANGFLOW_PROPOSAL)
        assert solver.gamma == sorted(solver.gamma, reverse=True)  # noisy → clean
        assert solver.gamma_min <= solver.gamma[-1] < solver.gamma[0] <= solver.gamma_max
    expected = torch.tensor([solver.eval_time(k) for k in range(STEPS)], dtype=torch.float32)
    torch.testing.assert_close(scheduler.timesteps, expected, rtol=0, atol=0)
    assert all(0.0 <= solver.delta_u(k) <= 1.0 for k in range(num_updates(family)))
    assert all(0.0 <= solver.kappa(k) <= 1.0 for k in range(num_updates(family)))
