"""The official LangFlow sampler as a diffusers scheduler."""

import math
from numbers import Real

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from ..per_nfe import check_steps
from .comparison_names import LANGFLOW_COMPARISON_SCHEDULERS
from .compatibility import CompatibleSchedulerMixin
from .config_checks import Range
from .contract import check_begin_index, check_timestep
from .outputs import LanguageFlowSchedulerOutput
from .run_context import RunContext, TakesRunContext, run_context
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


def check_proposal(proposal, where: str = "proposal") -> tuple[float, float, float] | None:
    """(loc, scale, cutoff) as floats: three finite numbers, scale > 0, 0 < cutoff < 1; `None` passes."""
    if proposal is None:
        return None
    values = list(proposal) if isinstance(proposal, list | tuple) else None
    numbers = values is not None and len(values) == 3
    numbers = numbers and all(isinstance(v, Real) and not isinstance(v, bool) for v in values)
    if not numbers or not all(math.isfinite(v) for v in values) or values[1] <= 0 or not 0 < values[2] < 1:
        raise ValueError(
            f"{where} must be the model's Gumbel proposal [loc, scale, cutoff] (three finite numbers, scale > 0, "
            f"0 < cutoff < 1), got {proposal!r}. Read it with `transformer.gumbel_parameters()`."
        )
    return float(values[0]), float(values[1]), float(values[2])


def langflow_add_noise(
    original_samples: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor | float
) -> torch.Tensor:
    """
    z_γ = α·x + σ·ε with α² = sigmoid(−γ), σ² = sigmoid(γ): LangFlow's variance-preserving noising at γ = −log SNR,
    the training objective's. `timesteps` is one γ for all, or one per sample (shape `(B,)`).
    """
    gamma = torch.as_tensor(timesteps, device=original_samples.device)
    if gamma.ndim == 1:
        gamma = gamma.reshape(-1, *(1,) * (original_samples.ndim - 1))
    alpha, sigma = torch.sigmoid(-gamma).sqrt(), torch.sigmoid(gamma).sqrt()
    return alpha * original_samples + sigma * noise


class LangFlowScheduler(TakesRunContext, CompatibleSchedulerMixin, SchedulerMixin, ConfigMixin):
    r"""
    The official LangFlow sampler (docs/algorithm.md §2.2): a γ grid at the quantiles of the model's learned Gumbel
    proposal, N−1 deterministic DDIM updates in float64, and one final evaluation whose argmax gives the tokens.
    NFE = N.

    The only random draw is the initial latent z_0 ~ N(0, I) (the pipeline's).

    Use: `set_timesteps(N)` with the proposal of the config (`untied-sc convert` and training's export write the
    model's), or `set_timesteps(N, proposal=model.gumbel_parameters())` (what the pipeline does); then for each of
    the N entries of `timesteps`: the network at γ = t on the latent with self-conditioning input
    `self_conditioning`, and `step(x_hat, t, z)` with x̂ = softmax(logits)·E_norm. The last `step` (the final evaluation) leaves the latent unchanged.

    Args:
        quantile_eps (`float`, defaults to 1e-5): the grid's quantiles run from 1 − eps to eps.
        proposal (`list[float]`, *optional*): the model's Gumbel proposal [loc, scale, cutoff]
            ([`LangFlowTransformerModel.gumbel_parameters`]), the grid of a bare `set_timesteps(N)`; a `proposal`
            given to `set_timesteps` overrides it.
    """

    family = "langflow"
    order = 1
    init_noise_sigma = 1.0
    _compatibles = ["UntiedLangFlowScheduler", *LANGFLOW_COMPARISON_SCHEDULERS]
    _config_ranges = LANGFLOW_CONFIG_RANGES

    @register_to_config
    def __init__(self, quantile_eps: float = QUANTILE_EPS, proposal: list[float] | None = None):
        check_proposal(proposal, f"{type(self).__name__} config: proposal")
        self.solver: LangFlowSolver | None = None
        self.timesteps: torch.Tensor | None = None
        self.num_inference_steps: int | None = None
        self._reset_state()

    def _reset_state(self) -> None:
        self._step_index = 0
        self._begin_index = 0
        self.self_conditioning: torch.Tensor | None = None

    @property
    def step_index(self) -> int:
        return self._step_index

    @property
    def begin_index(self) -> int:
        """The evaluation the run began at (0 unless `set_begin_index` said otherwise)."""
        return self._begin_index

    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        proposal: tuple[float, float, float] | None = None,
        *,
        context: RunContext | None = None,
    ) -> None:
        """
        Builds the γ grid and resets the trajectory state.

        Args:
            num_inference_steps (`int`): N ≥ 2, the number of network evaluations.
            device (`str` or `torch.device`, *optional*): where `timesteps` lives.
            proposal (`tuple[float, float, float]`, *optional*): (loc, scale, cutoff) of the model's Gumbel proposal,
                from [`LangFlowTransformerModel.gumbel_parameters`]; `None` uses the config's `proposal`.
            context ([`RunContext`], *optional*): the run's inputs (pipelines pass it); its `proposal` stands for
                the argument not given.
        """
        proposal = run_context(context, proposal=proposal).proposal
        check_steps(num_inference_steps)
        if proposal is None and self.config.proposal is None:
            raise ValueError(
                "LangFlow's grid needs the model's proposal: pass `proposal=model.gumbel_parameters()`, or store it "
                "in the scheduler config (`proposal`: [loc, scale, cutoff]; `untied-sc convert` writes it)."
            )
        loc, scale, cutoff = check_proposal(proposal if proposal is not None else self.config.proposal)
        gammas = gumbel_gamma_grid(num_inference_steps, loc, scale, cutoff, self.config.quantile_eps)
        self.solver = LangFlowSolver(gammas, *gumbel_gamma_range(loc, scale, cutoff))
        self.num_inference_steps = num_inference_steps
        self.timesteps = gammas.to(device)
        self._reset_state()

    def set_begin_index(self, begin_index: int = 0) -> None:
        """
        Starts the run at evaluation `begin_index` (diffusers' image-to-image use): call it after `set_timesteps` and
        before the first `step`, then run the loop over `timesteps[begin_index:]` from a latent at γ_{begin_index}.
        """
        check_begin_index(begin_index, self.num_inference_steps, self._run_started())
        self._step_index = self._begin_index = begin_index

    def _run_started(self) -> bool:
        return self._step_index != self._begin_index

    def scale_model_input(self, sample: torch.Tensor, timestep: torch.Tensor | float | None = None) -> torch.Tensor:
        """The network input: the latent itself (LangFlow does not scale it)."""
        return sample

    def add_noise(
        self, original_samples: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor | float
    ) -> torch.Tensor:
        """
        z_γ = α·x + σ·ε, α² = sigmoid(−γ), σ² = sigmoid(γ) ([`langflow_add_noise`]): the latent at γ of clean
        embeddings x and unit Gaussian noise ε, as the training objective forms it.

        Args:
            original_samples (`torch.Tensor` of shape `(B, L, D)`): x, the normalised token embeddings.
            noise (`torch.Tensor` of shape `(B, L, D)`): ε ~ N(0, I).
            timesteps (`torch.Tensor` of shape `(B,)` or `()`, or `float`): γ = −log SNR.
        """
        return langflow_add_noise(original_samples, noise, timesteps)

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
            timestep (`torch.Tensor` or `float`): the current entry of `timesteps`, `timesteps[step_index]` (checked).
            sample (`torch.Tensor`): the current latent z_k.
            return_dict (`bool`, defaults to `True`): return a [`LanguageFlowSchedulerOutput`] or a tuple.
        """
        if self.solver is None:
            raise RuntimeError("Call `set_timesteps` before sampling.")
        if self._step_index > self.solver.num_update_steps:
            raise RuntimeError(f"All {len(self.timesteps)} evaluations are done; call `set_timesteps` again.")
        k = self._step_index
        check_timestep(timestep, self.timesteps, k)
        if model_output.shape != sample.shape:
            raise ValueError(f"model_output has shape {tuple(model_output.shape)}, expected {tuple(sample.shape)}.")
        prev_sample = self.solver.update(k, sample, model_output) if k < self.solver.num_update_steps else sample
        self.self_conditioning = model_output
        self._step_index += 1
        if not return_dict:
            return (prev_sample, model_output, model_output)
        return LanguageFlowSchedulerOutput(prev_sample, model_output, model_output)

    def __len__(self) -> int:
        return self.num_inference_steps or 0
