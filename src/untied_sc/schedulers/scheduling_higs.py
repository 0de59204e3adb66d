"""HiGS (Sadat, Salehi, Weber, ICLR 2026): history-guided sampling on the official solvers."""

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from .baseline_functions import (
    dct_high_pass_matrix,
    flow_matching_time,
    higs_weight,
    history_average,
    history_guidance,
)
from .comparison_mixin import (
    ComparisonMethod,
    ComparisonSamplerMixin,
    ELFComparisonMixin,
    LangFlowComparisonMixin,
    MethodStep,
    check_routing,
    route,
)
from .compatibility import CompatibleSchedulerMixin
from .scheduling_elf import DEFAULT_SDE_GAMMA, NOISE_SCALE, P_MEAN, P_STD, T_EPS
from .scheduling_langflow import QUANTILE_EPS


# The defaults of the reimplementations (UR-al/sam-extra; docs/algorithm.md §9.3).
HIGS_WEIGHT, HIGS_ALPHA, HIGS_ETA = 1.75, 0.75, 0.0
HIGS_T_MIN, HIGS_T_MAX = 0.4, 1.0
HIGS_FILTER, HIGS_CUTOFF, HIGS_SHARPNESS = "dct", 0.05, 50.0
HIGS_ROUTING = "both"  # the literal plug-in: HiGS replaces the model output, which feeds solver and self-conditioning
HIGS_FILTERS = ("dct", "none")


class HiGSMethod(ComparisonMethod):
    r"""
    History-guided sampling (docs/algorithm.md §9.3). At update step k, with the noise level t_k = sigmoid(−λ_k) of
    the time the network saw:

        D̃_k = p_k + w(t_k)·F(ΔD(η)),   ΔD = p_k − g_{k−1},   g_k = α·p_k + (1 − α)·g_{k−1},   g_{−1} = 0,

    and D̃_k replaces p_k on the pathways `routing` names. The history g tracks the raw predictions; the first step
    only seeds it. `weight=0` is the official sampler.

    Args: the config keys without their `higs_` prefix: `weight` (w ≥ 0), `alpha` (α ∈ (0, 1]), `eta` (η),
    `t_min`, `t_max` (the window, 0 ≤ t_min < t_max ≤ 1), `filter` (`"dct"` or `"none"`), `cutoff`, `sharpness`
    (the DCT high-pass) and `routing`.
    """

    def __init__(
        self,
        weight: float = HIGS_WEIGHT,
        alpha: float = HIGS_ALPHA,
        eta: float = HIGS_ETA,
        t_min: float = HIGS_T_MIN,
        t_max: float = HIGS_T_MAX,
        filter: str = HIGS_FILTER,
        cutoff: float = HIGS_CUTOFF,
        sharpness: float = HIGS_SHARPNESS,
        routing: str = HIGS_ROUTING,
    ):
        if weight < 0:
            raise ValueError(f"higs_weight (w) must be ≥ 0, got {weight}.")
        if not 0.0 < alpha <= 1.0:
            raise ValueError(f"higs_alpha (α) must lie in (0, 1], got {alpha}.")
        if not 0.0 <= t_min < t_max <= 1.0:
            raise ValueError(f"The HiGS window needs 0 ≤ higs_t_min < higs_t_max ≤ 1, got {t_min}, {t_max}.")
        if filter not in HIGS_FILTERS:
            raise ValueError(f"higs_filter must be one of {HIGS_FILTERS}, got {filter!r}.")
        check_routing("higs_routing", routing)
        self.weight, self.alpha, self.eta, self.t_min, self.t_max = weight, alpha, eta, t_min, t_max
        self.filter, self.cutoff, self.sharpness, self.routing = filter, cutoff, sharpness, routing
        self._filter_matrix: torch.Tensor | None = None  # depends on length, device and dtype only: kept across runs
        self.reset()

    @classmethod
    def from_config(cls, config) -> "HiGSMethod":
        keys = ("weight", "alpha", "eta", "t_min", "t_max", "filter", "cutoff", "sharpness", "routing")
        return cls(**{key: config[f"higs_{key}"] for key in keys})

    def reset(self) -> None:
        self.history: torch.Tensor | None = None  # g_{k−1}

    def _filter(self, prediction: torch.Tensor) -> torch.Tensor | None:
        """The (L, L) high-pass matrix for `prediction`'s length, device and dtype; `None` without a filter."""
        if self.filter == "none":
            return None
        matrix = self._filter_matrix
        wanted = (prediction.shape[1], prediction.device, prediction.dtype)
        if matrix is None or (matrix.shape[0], matrix.device, matrix.dtype) != wanted:
            length, device, dtype = wanted
            matrix = dct_high_pass_matrix(length, self.cutoff, self.sharpness, dtype, device)
            self._filter_matrix = matrix
        return matrix

    def pathways(
        self, step: MethodStep, solver_input: torch.Tensor, self_conditioning: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.weight == 0.0:
            return solver_input, self_conditioning
        prediction = step.prediction
        noise_level = flow_matching_time(step.log_snrs()[0])  # t_k = sigmoid(−λ_k) of the time the network saw
        weight = higs_weight(noise_level, self.weight, self.t_min, self.t_max)
        filter_matrix = self._filter(prediction) if weight > 0 and self.history is not None else None
        guided = history_guidance(prediction, self.history, weight, self.eta, filter_matrix)
        self.history = history_average(self.history, prediction, self.alpha)
        return route(self.routing, solver_input, self_conditioning, lambda _: guided)


class HiGSELFScheduler(
    ELFComparisonMixin, ComparisonSamplerMixin, CompatibleSchedulerMixin, SchedulerMixin, ConfigMixin
):
    r"""
    HiGS ([`HiGSMethod`]) on the official ELF sampler ([`ELFScheduler`], used unchanged as `self.base`: with
    `higs_weight=0` it is the official sampler bit for bit). Swap it in with
    `HiGSELFScheduler.from_config(pipe.scheduler.config)`.

    Args:
        noise_scale, p_mean, p_std, sde_gamma, sde_gamma_by_steps, t_eps: [`ELFScheduler`]'s config.
        higs_weight (`float`, defaults to 1.75): w_HiGS ≥ 0; 0 switches HiGS off.
        higs_alpha (`float`, defaults to 0.75): α ∈ (0, 1], the history's weight on the current prediction.
        higs_eta (`float`, defaults to 0.0): η, the weight kept of ΔD's component along p_k (1: no projection).
        higs_t_min (`float`, defaults to 0.4), higs_t_max (`float`, defaults to 1.0): the window of noise levels.
        higs_filter (`str`, defaults to `"dct"`): `"dct"`, the soft DCT high-pass along positions, or `"none"`.
        higs_cutoff (`float`, defaults to 0.05), higs_sharpness (`float`, defaults to 50.0): R_c and λ_f of it.
        higs_routing (`str`, defaults to `"both"`): where D̃_k goes: `"solver"`, `"self_conditioning"` or `"both"`.
    """

    method_classes = (HiGSMethod,)

    @register_to_config
    def __init__(
        self,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        sde_gamma: float | None = None,
        sde_gamma_by_steps: dict[str, float] | None = DEFAULT_SDE_GAMMA,
        t_eps: float = T_EPS,
        higs_weight: float = HIGS_WEIGHT,
        higs_alpha: float = HIGS_ALPHA,
        higs_eta: float = HIGS_ETA,
        higs_t_min: float = HIGS_T_MIN,
        higs_t_max: float = HIGS_T_MAX,
        higs_filter: str = HIGS_FILTER,
        higs_cutoff: float = HIGS_CUTOFF,
        higs_sharpness: float = HIGS_SHARPNESS,
        higs_routing: str = HIGS_ROUTING,
    ):
        self._init_comparison()


class HiGSLangFlowScheduler(
    LangFlowComparisonMixin, ComparisonSamplerMixin, CompatibleSchedulerMixin, SchedulerMixin, ConfigMixin
):
    r"""
    HiGS ([`HiGSMethod`]) on the official LangFlow sampler ([`LangFlowScheduler`], used unchanged as `self.base`:
    with `higs_weight=0` it is the official sampler bit for bit).

    Args:
        quantile_eps, proposal: [`LangFlowScheduler`]'s config.
        higs_weight, higs_alpha, higs_eta, higs_t_min, higs_t_max, higs_filter, higs_cutoff, higs_sharpness,
        higs_routing: as for [`HiGSELFScheduler`].
    """

    method_classes = (HiGSMethod,)

    @register_to_config
    def __init__(
        self,
        quantile_eps: float = QUANTILE_EPS,
        proposal: list[float] | None = None,
        higs_weight: float = HIGS_WEIGHT,
        higs_alpha: float = HIGS_ALPHA,
        higs_eta: float = HIGS_ETA,
        higs_t_min: float = HIGS_T_MIN,
        higs_t_max: float = HIGS_T_MAX,
        higs_filter: str = HIGS_FILTER,
        higs_cutoff: float = HIGS_CUTOFF,
        higs_sharpness: float = HIGS_SHARPNESS,
        higs_routing: str = HIGS_ROUTING,
    ):
        self._init_comparison()
