"""The official LangFlow sampler as a diffusers scheduler."""

import math

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from .comparison_names import LANGFLOW_COMPARISON_SCHEDULERS
from .compatibility import CompatibleSchedulerMixin
from .config_checks import Range
from .outputs import LanguageFlowSchedulerOutput
from .solvers import LangFlowSolver


QUANTILE_EPS = 1e-5  # the grid's quantiles run from 1 − eps to eps (the official sampler's)
LANGFLOW_CONFIG_RANGES = {"quantile_eps": Range(0.0, 0.5, low_inclusive=False, high_inclusive=False)}


def gumbel_gamma_range(loc: float, scale: float, cutoff: float) -> tuple[float, float]:
    """(γ_min, γ_max) = (loc − scale·log(−log c), loc − scale·log c), rounded through float32 as the official code."""
    loc_t, scale_t = torch.tensor(loc), torch.tensor(scale)
    return (loc_t - math.log(-math.log(cutoff)) * scale_t).item(), (loc_t - math.log(cutoff) * scale_t).item()


def gumbel_gamma_grid(num_steps: int, loc: float, scale: float, cutoff: float, quantile_eps: float) -> torch.Tensor:
    """
    γ_i = clamp(Gumbel(loc, scale).icdf(q_i), γ_min, γ_max), q = linspace(1 − eps, eps, N): noisy → clean, float32.

    Uses torch's `Gumbel.icdf`, which first maps q through its base Uniform(tiny, 1 − eps) transform; the closed form
    loc − scale·log(−log q) differs from it by about 1e-2 at γ_0.
    """
    quantiles = torch.linspace(1.0 - quantile_eps, quantile_eps, num_steps)
    gammas = torch.distributions.Gumbel(torch.tensor(loc), torch.tensor(scale)).icdf(quantiles)
    gamma_min, gamma_max = gumbel_gamma_range(loc, scale, cutoff)
    return gammas.clamp(min=gamma_min, max=gamma_max)


class LangFlowScheduler(CompatibleSchedulerMixin, SchedulerMixin, ConfigMixin):
    r"""
    The official LangFlow sampler (docs/algorithm.md §2.2): a γ grid at the quantiles of the model's learned Gumbel
    proposal, N−1 deterministic DDIM updates in float64, and one final evaluation whose argmax gives the tokens.
    NFE = N.

    The only random draw is the initial latent z_0 ~ N(0, I) (the pipeline's).

    Use: `set_timesteps(N, proposal=model.gumbel_parameters())`; then for each of the N entries of `timesteps`: the
    network at γ = t on the latent with self-conditioning input `self_conditioning`, and `step(x_hat, t, z)` with
    x̂ = softmax(logits)·E_norm. The last `step` (the final evaluation) leaves the latent unchanged.

    Args:
        quantile_eps (`float`, defaults to 1e-5): the grid's quantiles run from 1 − eps to eps.
    """

    family = "langflow"
    order = 1
    init_noise_sigma = 1.0
    _compatibles = ["UntiedLangFlowScheduler", *LANGFLOW_COMPARISON_SCHEDULERS]
    _config_ranges = LANGFLOW_CONFIG_RANGES

    @register_to_config
    def __init__(self, quantile_eps: float = QUANTILE_EPS):
        self.solver: LangFlowSolver | None = None
        self.timesteps: torch.Tensor | None = None
        self.num_inference_steps: int | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        self._step_index = 0
        self.self_conditioning: torch.Tensor | None = None

    @property
    def step_index(self) -> int:
        return self._step_index

    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        proposal: tuple[float, float, float] | None = None,
    ) -> None:
        """
        Builds the γ grid and resets the trajectory state.

        Args:
            num_inference_steps (`int`): N ≥ 2, the number of network evaluations.
            device (`str` or `torch.device`, *optional*): where `timesteps` lives.
            proposal (`tuple[float, float, float]`): (loc, scale, cutoff) of the model's Gumbel proposal, from
                [`LangFlowTransformerModel.gumbel_parameters`]. Required: the released configs hold template values.
        """
        if not isinstance(num_inference_steps, int) or num_inference_steps < 2:
            raise ValueError(f"num_inference_steps must be an integer ≥ 2, got {num_inference_steps!r}.")
        if proposal is None:
            raise ValueError("LangFlow's grid needs the model's proposal: pass `proposal=model.gumbel_parameters()`.")
        loc, scale, cutoff = proposal
        gammas = gumbel_gamma_grid(num_inference_steps, loc, scale, cutoff, self.config.quantile_eps)
        self.solver = LangFlowSolver(gammas, *gumbel_gamma_range(loc, scale, cutoff))
        self.num_inference_steps = num_inference_steps
        self.timesteps = gammas.to(device)
        self._reset_state()

    def scale_model_input(self, sample: torch.Tensor, timestep: torch.Tensor | float | None = None) -> torch.Tensor:
        return sample

    def step(
        self,
        model_output: torch.Tensor,
        timestep: torch.Tensor | float,
        sample: torch.Tensor,
        return_dict: bool = True,
    ) -> LanguageFlowSchedulerOutput | tuple:
        """
        One DDIM update with the clean prediction x̂ = softmax(logits)·E_norm; the final evaluation updates nothing.

        Args:
            model_output (`torch.Tensor`): the clean prediction x̂ of this step.
            timestep (`torch.Tensor` or `float`): the current entry of `timesteps` (steps are counted internally).
            sample (`torch.Tensor`): the current latent z_k.
            return_dict (`bool`, defaults to `True`): return a [`LanguageFlowSchedulerOutput`] or a tuple.
        """
        if self.solver is None:
            raise RuntimeError("Call `set_timesteps` before sampling.")
        if self._step_index > self.solver.num_update_steps:
            raise RuntimeError(f"All {len(self.timesteps)} evaluations are done; call `set_timesteps` again.")
        if model_output.shape != sample.shape:
            raise ValueError(f"model_output has shape {tuple(model_output.shape)}, expected {tuple(sample.shape)}.")
        k = self._step_index
        prev_sample = self.solver.update(k, sample, model_output) if k < self.solver.num_update_steps else sample
        self.self_conditioning = model_output
        self._step_index += 1
        if not return_dict:
            return (prev_sample, model_output, model_output)
        return LanguageFlowSchedulerOutput(prev_sample, model_output, model_output)

    def __len__(self) -> int:
        return self.num_inference_steps or 0
