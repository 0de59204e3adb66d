"""The official samplers of the self-conditioned flow-map language models (FMLM*, ELF*) as diffusers schedulers.

Operation for operation the official `pytorch_lightning/utils/sampling_utils.py` of
`github.com/Ugness/self-conditioned-fmlm@f2472c9` (`flow_map_step` lines 184-233, `ctm_step` 237-287,
`get_flowmap_time_steps` 290-325, `get_sampling_steps` 38-61, `cdeq_step` 347-378) and the loops of
`utils/generation_utils.py` `generate_samples` (lines 71-140), so that the same generator and network outputs give the
official latents bit for bit. The interpolant is z_t = t·x + (1 − t)·noise_scale·ε (t = 0 noise, t = 1 data).

[`FlowMapLMScheduler`] follows the two-time contract of diffusers' `FlowMapEulerDiscreteScheduler`: `step` moves the
sample from `timestep` (the source s = t_k) to `r_timestep` (t_{k+1}; the next grid time when omitted).
"""

from dataclasses import dataclass

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin
from diffusers.utils import BaseOutput

from ..per_nfe import check_steps, read_steps_table
from .flowmap_statistics import FlowMapStatistics
from .noise import global_generator
from .run_context import RunContext, TakesRunContext, run_context
from .transform import overlap_transform, retention


OFFICIAL = "github.com/Ugness/self-conditioned-fmlm@f2472c9"
NOISE_SCALE = 2.0  # `denoiser_noise_scale` of every `train_owt_*.yml`
P_MEAN, P_STD = -1.5, 0.8  # `denoiser_p_mean`, `denoiser_p_std` of every `train_owt_*.yml`
T_EPS = 0.05  # `t_eps`, the velocity clamp of cdeq
CDEQ_PHASE = 0.002  # `cdeq_inference_phase` (`train_owt_ELF_star.yml` line 63)
# FMLM* `ctm` γ by number of steps: `configs/sampling_configs/owt_FMLM_star.yml` lines 2-19 (README "Evaluation").
FMLM_GAMMA_BY_STEPS = {"1": 1.0, "2": 0.75, "4": 1.0}
# An unlisted step count: 1.0 [choice], the value of both the 1- and the 4-step configs.
FMLM_DEFAULT_GAMMA = 1.0
# ELF* `cdeq` churn: `configs/sampling_configs/owt_ELF_star.yml` line 7 (8, 16, 32 steps; the README runs 0.0).
CDEQ_GAMMA = 1.5
SAMPLERS = ("ctm", "flow_map")
SELF_CONDITIONING = ("free", "chained")


@dataclass
class FlowMapSchedulerOutput(BaseOutput):
    """
    Output of a flow-map scheduler's `step`.

    Args:
        prev_sample (`torch.Tensor`): z at `r_timestep`, z_{k+1}.
        pred_original_sample (`torch.Tensor`): the network's prediction x̂ of this step.
        self_conditioning (`torch.Tensor`, *optional*): the self-conditioning input of the next network call (zeros
            for a self-conditioning-free model, x̂ for a chained one, `None` for cdeq, which feeds zeros).
    """

    prev_sample: torch.Tensor
    pred_original_sample: torch.Tensor | None = None
    self_conditioning: torch.Tensor | None = None


def flowmap_time_grid(num_steps: int, p_mean: float, p_std: float, tau_kind: str = "logit_normal_uniform"):
    """
    The official deterministic grid 0 = t_0 < … < t_N = 1 (`get_flowmap_time_steps`, float32): τ = linspace(0, 1,
    N + 1) with interior sigmoid(P_std·Φ⁻¹(τ) + P_mean) (`logit_normal_uniform`, the FMLM* config's
    `elfmap_tau_kind`), sigmoid(P_std·logit(τ) + P_mean) (`logit_normal`) or τ itself (`identity`).
    """
    check_steps(num_steps, minimum=1)
    tau = torch.linspace(0.0, 1.0, num_steps + 1, dtype=torch.float32)
    if tau_kind == "identity":
        return tau
    out = tau.clone()
    if num_steps >= 2:
        interior = tau[1:-1]
        if tau_kind == "logit_normal_uniform":
            out[1:-1] = torch.sigmoid(torch.special.ndtri(interior) * p_std + p_mean)
        elif tau_kind == "logit_normal":
            out[1:-1] = torch.sigmoid(p_std * torch.log(interior / (1 - interior)) + p_mean)
        else:
            raise ValueError(f"Unknown tau_kind {tau_kind!r}; choose logit_normal_uniform, logit_normal or identity.")
    out[0], out[-1] = 0.0, 1.0
    return out


def cdeq_time_grid(num_steps: int, generator: torch.Generator, p_mean: float, p_std: float) -> torch.Tensor:
    """
    The official random grid of cdeq (`get_sampling_steps`, `logit_normal`): N − 1 normals from `generator` on its
    device, sigmoid(ξ·P_std + P_mean), sorted, between 0 and 1; N = 1 draws nothing and gives [0, 1].
    """
    check_steps(num_steps, minimum=1)
    device = generator.device
    if num_steps < 2:
        return torch.tensor([0.0, 1.0], device=device)
    steps = torch.sigmoid(torch.randn(num_steps - 1, generator=generator, device=device) * p_std + p_mean)
    steps, _ = torch.sort(steps)
    return torch.cat([torch.zeros(1, device=device), steps, torch.ones(1, device=device)])


def _per_example(value: float, sample: torch.Tensor) -> torch.Tensor:
    """`value` as the official float32 per-example tensor, shaped to broadcast over (L, D)."""
    return torch.full((sample.shape[0],), float(value), device=sample.device, dtype=sample.dtype).view(-1, 1, 1)


def flow_map_update(sample: torch.Tensor, prediction: torch.Tensor, t_curr: float, t_next: float) -> torch.Tensor:
    """z_{k+1} = (1 − t_{k+1})/(1 − t_k)·z + (t_{k+1} − t_k)/(1 − t_k)·x̂, with 1 − t_k ≥ 1e-7 (official lines
    224-231; the final step gives x̂ exactly)."""
    t_curr_b, t_next_b = _per_example(t_curr, sample), _per_example(t_next, sample)
    one_minus_curr = (1.0 - t_curr_b).clamp(min=1e-7)
    return (1.0 - t_next_b) / one_minus_curr * sample + (t_next_b - t_curr_b) / one_minus_curr * prediction


def ctm_target_time(t_next: float, gamma: float) -> float:
    """The time the ctm step's network predicts at: 1 on the final step, else t̃ = 1 − (1 − t_{k+1})·sqrt(1 − γ²)
    in float32 (official lines 258-270; 1 for γ = 1)."""
    if t_next >= 1.0:
        return 1.0
    sigma_tilde = (1.0 - t_next) * torch.sqrt(torch.tensor(1.0 - gamma**2))
    return float(1.0 - sigma_tilde)


def ctm_update(
    sample: torch.Tensor,
    prediction: torch.Tensor,
    t_curr: float,
    t_next: float,
    gamma: float,
    noise_scale: float,
    noise: torch.Tensor | None,
) -> torch.Tensor:
    """
    The ctm re-placement (official lines 275-286): g = clip(γ, 0, 1); ε_old = (z − t_k·x̂)/(max(1 − t_k, 1e-6)·scale);
    ε_mix = fresh ε (g = 1), ε_old (g = 0), sqrt(1 − g²)·ε_old + g·ε else; z_{k+1} = t_{k+1}·x̂ + (1 − t_{k+1})·ε_mix·scale.
    The final step (t_{k+1} ≥ 1) lands on x̂.
    """
    if t_next >= 1.0:
        return prediction
    g = max(0.0, min(1.0, float(gamma)))
    if g >= 1.0:
        eps_mix = noise
    else:
        eps_old = (sample - t_curr * prediction) / (max(1.0 - t_curr, 1e-6) * noise_scale)
        eps_mix = eps_old if g <= 0.0 else (1.0 - g * g) ** 0.5 * eps_old + g * noise
    return t_next * prediction + (1.0 - t_next) * eps_mix * noise_scale


def ctm_draws_noise(t_next: float, gamma: float) -> bool:
    """Whether the ctm step takes a fresh normal draw (after its network call): γ > 0 and not the final step."""
    return t_next < 1.0 and max(0.0, min(1.0, float(gamma))) > 0.0


class FlowMapLMScheduler(TakesRunContext, SchedulerMixin, ConfigMixin):
    r"""
    The official FMLM* samplers: `ctm` (CTM γ-sampling, the released configs') and `flow_map`.

    Grid: [`flowmap_time_grid`], deterministic. Step k calls the network once at source time s = t_k with target
    time `prediction_timesteps[k]` (flow_map: t_{k+1}; ctm: [`ctm_target_time`]) and self-conditioning input
    `self_conditioning` (zeros for the released, self-conditioning-free FMLM*; with `self_conditioning="chained"`,
    the legacy regime, the previous x̂, and at step 0 a pre-pass x̂(z_0, s = t = t_0, 0): `needs_prepass`), then
    `step(x̂, t_k, z_k)`. ctm with γ > 0 draws one normal of the latent's shape from the run's generator (given to
    `set_timesteps`, directly or in its [`RunContext`]) after the network call of every non-final step, as the
    official code does.

    Args:
        sampler (`str`, defaults to `"ctm"`): `"ctm"` or `"flow_map"`.
        gamma (`float`, *optional*): ctm's γ for every step count; `None` uses `gamma_by_steps`.
        gamma_by_steps (`dict[str, float]`): ctm's γ per step count (the FMLM* sampling config: 1 → 1.0, 2 → 0.75,
            4 → 1.0); unlisted counts use 1.0 **[choice]**.
        noise_scale (`float`, defaults to 2.0), p_mean (`float`, defaults to -1.5), p_std (`float`, defaults to 0.8):
            the interpolant's noise scale and the grid's (the official configs' values).
        tau_kind (`str`, defaults to `"logit_normal_uniform"`): the grid's τ map (`elfmap_tau_kind`).
        self_conditioning (`str`, defaults to `"free"`): `"free"` (the released FMLM*, `elfmap_student_sc_free`) or
            `"chained"` (the legacy hybrid regime).
    """

    family = "flowmap"
    order = 1
    _compatibles = ["UntiedFlowMapLMScheduler"]

    @register_to_config
    def __init__(
        self,
        sampler: str = "ctm",
        gamma: float | None = None,
        gamma_by_steps: dict[str, float] | None = None,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        tau_kind: str = "logit_normal_uniform",
        self_conditioning: str = "free",
    ):
        self._init_state(sampler, gamma, noise_scale, self_conditioning)

    def _init_state(self, sampler: str, gamma: float | None, noise_scale: float, self_conditioning: str) -> None:
        # Not in `__init__`: a subclass's registered `__init__` calling a registered `super().__init__` would mark its
        # given arguments as defaults in the config.
        if sampler not in SAMPLERS:
            raise ValueError(f"sampler must be one of {SAMPLERS}, got {sampler!r}.")
        if self_conditioning not in SELF_CONDITIONING:
            raise ValueError(f"self_conditioning must be one of {SELF_CONDITIONING}, got {self_conditioning!r}.")
        if gamma is not None and not 0.0 <= gamma <= 1.0:
            raise ValueError(f"gamma must lie in [0, 1] (ctm mixes sqrt(1 − γ²) old noise), got {gamma}.")
        self.init_noise_sigma = noise_scale
        self.timesteps: torch.Tensor | None = None
        self.r_timesteps: torch.Tensor | None = None
        self.prediction_timesteps: list[float] | None = None
        self.num_inference_steps: int | None = None
        self._grid: list[float] | None = None
        self._generator: torch.Generator | None = None
        self._step_index = 0
        self.self_conditioning: torch.Tensor | None = None

    @property
    def step_index(self) -> int:
        return self._step_index

    def gamma_for(self, num_inference_steps: int) -> float:
        """ctm's γ at N steps: `gamma`, else N's entry of `gamma_by_steps` (default: the FMLM* config's), else 1.0."""
        if self.config.gamma is not None:
            return float(self.config.gamma)
        table = self.config.gamma_by_steps if self.config.gamma_by_steps is not None else FMLM_GAMMA_BY_STEPS
        return float(read_steps_table(table, "gamma_by_steps").get(num_inference_steps, FMLM_DEFAULT_GAMMA))

    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        generator: torch.Generator | None = None,
        *,
        context: RunContext | None = None,
    ) -> None:
        """
        The grid for N steps (N network calls, plus the pre-pass of the chained regime), and a fresh state. The grid
        draws nothing.

        Args:
            num_inference_steps (`int`): N ≥ 1, the number of steps.
            device (`str` or `torch.device`, *optional*): where `timesteps` lives.
            generator (`torch.Generator`, *optional*): the run's generator, for ctm's re-noising draws (a `step`
                given its own `generator` draws from that); `None`: torch's global generator of the latents' device.
            context ([`RunContext`], *optional*): the run's inputs (pipelines pass it); its `generator` stands for
                the argument not given.
        """
        self._generator = run_context(context, generator=generator).generator
        grid = flowmap_time_grid(num_inference_steps, self.config.p_mean, self.config.p_std, self.config.tau_kind)
        self._grid = [float(t) for t in grid.tolist()]
        self.gamma = self.gamma_for(num_inference_steps)
        self.timesteps = grid[:-1].to(device)
        self.r_timesteps = grid[1:].to(device)
        if self.config.sampler == "flow_map":
            self.prediction_timesteps = self._grid[1:]
        else:
            self.prediction_timesteps = [ctm_target_time(t, self.gamma) for t in self._grid[1:]]
        self.num_inference_steps = num_inference_steps
        self._step_index = 0
        self.self_conditioning = None

    @property
    def needs_prepass(self) -> bool:
        """Whether the next network call needs the chained regime's step-0 pre-pass (SC input x̂(z, t_0, t_0, 0))."""
        return self.config.self_conditioning == "chained" and self.self_conditioning is None

    def self_conditioning_input(self, sample: torch.Tensor) -> torch.Tensor:
        """The self-conditioning input of the current call: zeros (free, and before a chained run's pre-pass), else
        the scheduler's `self_conditioning`."""
        return torch.zeros_like(sample) if self.self_conditioning is None else self.self_conditioning

    def set_prepass(self, prediction: torch.Tensor) -> None:
        """Hands the chained regime's step-0 pre-pass prediction to the scheduler (the SC input of step 0)."""
        self.self_conditioning = prediction

    def scale_model_input(self, sample: torch.Tensor, timestep: torch.Tensor | float | None = None) -> torch.Tensor:
        """The network input is the latent itself (no re-noising before the call)."""
        return sample

    def step(
        self,
        model_output: torch.Tensor,
        timestep: torch.Tensor | float,
        sample: torch.Tensor,
        r_timestep: torch.Tensor | float | None = None,
        generator: torch.Generator | None = None,
        return_dict: bool = True,
    ) -> FlowMapSchedulerOutput | tuple:
        """
        Moves `sample` from `timestep` (t_k) to `r_timestep` (t_{k+1} when omitted) with the prediction x̂.

        Args:
            model_output (`torch.Tensor`): x̂, the network's prediction at (s = t_k, t = `prediction_timesteps[k]`).
            timestep (`torch.Tensor` or `float`): t_k, the current entry of `timesteps` (checked).
            sample (`torch.Tensor`): z_k.
            r_timestep (`torch.Tensor` or `float`, *optional*): the target time; only the grid's next time is
                supported (the network was evaluated for it), given or not.
            generator (`torch.Generator`, *optional*): ctm's re-noising draws; `None`: the run's generator
                (`set_timesteps`), else torch's global generator of the latents' device.
            return_dict (`bool`, defaults to `True`): return a [`FlowMapSchedulerOutput`] or a tuple.
        """
        if self._grid is None:
            raise RuntimeError("Call `set_timesteps` before `step`.")
        k = self._step_index
        if k >= self.num_inference_steps:
            raise RuntimeError(f"All {self.num_inference_steps} steps are done; call `set_timesteps` again.")
        t_curr, t_next = self._grid[k], self._grid[k + 1]
        if abs(float(timestep) - t_curr) > 1e-6:
            raise ValueError(f"timestep {float(timestep)} is not the current step's t_k = {t_curr} (step {k}).")
        if r_timestep is not None and abs(float(r_timestep) - t_next) > 1e-6:
            raise ValueError(
                f"r_timestep {float(r_timestep)} is not the grid's next time {t_next}: the network was "
                "evaluated for the grid; set_timesteps with another N for another grid."
            )
        if model_output.shape != sample.shape:
            raise ValueError(f"model_output has shape {tuple(model_output.shape)}, expected {tuple(sample.shape)}.")
        if self.config.sampler == "flow_map":
            prev = flow_map_update(sample, model_output, t_curr, t_next)
        else:
            noise = None
            if ctm_draws_noise(t_next, self.gamma):
                source = generator if generator is not None else self._generator
                source = source if source is not None else global_generator(sample.device)
                noise = torch.randn(sample.shape, generator=source, device=sample.device, dtype=sample.dtype)
            prev = ctm_update(sample, model_output, t_curr, t_next, self.gamma, self.config.noise_scale, noise)
        if self.config.self_conditioning == "chained":
            self.self_conditioning = model_output
        self._step_index += 1
        sc = self.self_conditioning
        if not return_dict:
            return (prev, model_output, sc)
        return FlowMapSchedulerOutput(prev, model_output, sc)

    def __len__(self) -> int:
        return self.num_inference_steps or 0


class CDEQScheduler(TakesRunContext, SchedulerMixin, ConfigMixin):
    r"""
    The official ELF* sampler `cdeq`: a random logit-normal grid, one network call per step on the re-noised latent
    with a zero self-conditioning input at s = t = t_b and phase 0.002, an Euler step; the last step is γ = 0.

    Randomness as the official evaluation (`eval_lightning.py` lines 238-264, one generator for all): the grid's
    N − 1 normals are drawn from `generator` by `set_timesteps`, then the pipeline draws z_0 from it, then each
    non-final step with α < 1 draws its noise from it in `scale_model_input` (once per step, cached).

    Args:
        gamma (`float`, defaults to 1.5): the churn `sde_gamma` (`owt_ELF_star.yml`).
        noise_scale (`float`, defaults to 2.0), p_mean, p_std, t_eps (`float`, defaults to 0.05): as the configs.
        phase (`float`, defaults to 0.002): the phase fed to the network (`cdeq_inference_phase`).
    """

    family = "flowmap"
    order = 1

    @register_to_config
    def __init__(
        self,
        gamma: float = CDEQ_GAMMA,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        t_eps: float = T_EPS,
        phase: float = CDEQ_PHASE,
    ):
        if gamma < 0:
            raise ValueError(f"gamma must be ≥ 0, got {gamma}.")
        self.init_noise_sigma = noise_scale
        self.timesteps: torch.Tensor | None = None
        self.num_inference_steps: int | None = None
        self._grid: list[float] | None = None
        self._step_index = 0
        self._noise: torch.Tensor | None = None
        self._generator: torch.Generator | None = None
        self.self_conditioning = None

    @property
    def step_index(self) -> int:
        return self._step_index

    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        generator: torch.Generator | None = None,
        *,
        context: RunContext | None = None,
    ) -> None:
        """
        Draws the grid from `generator` (`None`: torch's global one of `device`) and keeps it for the noise.

        Args:
            num_inference_steps (`int`): N ≥ 1, the number of network calls.
            device (`str` or `torch.device`, *optional*): where `timesteps` lives.
            generator (`torch.Generator`, *optional*): the run's generator: the grid's N − 1 normals, then (after the
                pipeline's z_0) each re-noising step's noise.
            context ([`RunContext`], *optional*): the run's inputs (pipelines pass it); its `generator` stands for
                the argument not given.
        """
        generator = run_context(context, generator=generator).generator
        generator = generator if generator is not None else global_generator(device)
        grid = cdeq_time_grid(num_inference_steps, generator, self.config.p_mean, self.config.p_std)
        self._grid = [float(t) for t in grid.tolist()]
        self._generator = generator
        self.timesteps = grid[:-1].to(device)
        self.num_inference_steps = num_inference_steps
        self._step_index = 0
        self._noise = None

    def _alpha(self, k: int) -> tuple[float, float]:
        """(α_k, t_b) = (clip(1 − γ·(t_{k+1} − t_k), 0, 1), α_k·t_k); γ = 0 on the last step (official lines 127-139)."""
        t, t_next = self._grid[k], self._grid[k + 1]
        gamma = 0.0 if k == self.num_inference_steps - 1 else float(self.config.gamma)
        alpha = max(0.0, min(1.0, 1.0 - gamma * (t_next - t)))
        return alpha, alpha * t

    def model_timestep(self) -> float:
        """t_b of the current step: the time (source and target) the network is called at."""
        return self._alpha(self._step_index)[1]

    def scale_model_input(self, sample: torch.Tensor, timestep: torch.Tensor | float | None = None) -> torch.Tensor:
        """z_b = α·z + (1 − α)·noise_scale·ε (ε drawn once per step, cached), z itself when α = 1."""
        if self._grid is None:
            return sample
        alpha, _ = self._alpha(self._step_index)
        if alpha >= 1.0:
            return sample
        if self._noise is None:
            self._noise = torch.randn(
                sample.shape, generator=self._generator, device=sample.device, dtype=sample.dtype
            )
            self._noise = self._noise * self.config.noise_scale
        return alpha * sample + (1.0 - alpha) * self._noise

    def step(
        self,
        model_output: torch.Tensor,
        timestep: torch.Tensor | float,
        sample: torch.Tensor,
        return_dict: bool = True,
    ) -> FlowMapSchedulerOutput | tuple:
        """z_{k+1} = z_b + (t_{k+1} − t_b)·(x̂ − z_b)/max(1 − t_b, t_eps), with z_b = `scale_model_input(sample)`."""
        if self._grid is None:
            raise RuntimeError("Call `set_timesteps` before `step`.")
        k = self._step_index
        if k >= self.num_inference_steps:
            raise RuntimeError(f"All {self.num_inference_steps} steps are done; call `set_timesteps` again.")
        if abs(float(timestep) - self._grid[k]) > 1e-6:
            raise ValueError(f"timestep {float(timestep)} is not the current step's t_k = {self._grid[k]} (step {k}).")
        alpha, t_back = self._alpha(k)
        if alpha < 1.0 and self._noise is None:
            raise RuntimeError("Call `scale_model_input` before `step`: cdeq re-noises the latent before the network.")
        z_back = self.scale_model_input(sample)
        t_b = _per_example(t_back, z_back)
        velocity = (model_output - z_back) / torch.clamp(1.0 - t_b, min=self.config.t_eps)
        prev = z_back + (self._grid[k + 1] - t_back) * velocity
        self._noise = None
        self._step_index += 1
        if not return_dict:
            return (prev, model_output, None)
        return FlowMapSchedulerOutput(prev, model_output, None)

    def __len__(self) -> int:
        return self.num_inference_steps or 0


def flowmap_kappa(t_curr: float, t_next: float, gamma: float, sampler: str) -> float:
    r"""
    κ_k, the share of the step's prediction x̂_k in the signal of z_{k+1} (docs/algorithm.md "Self-conditioned flow
    maps"; eq. (18) with s_k = t_k): z_{k+1} = a_k z_k + β_k x̂_k (+ fresh noise), κ_k = β_k / t_{k+1}, with
    β_k = (t_{k+1} − t_k)/(1 − t_k) for flow_map (and ctm at γ = 0), β_k = t_{k+1} − sqrt(1 − g²)(1 − t_{k+1}) t_k /
    (1 − t_k) for ctm (g = clip(γ, 0, 1); 1 at g = 1 and on the final step).
    """
    if t_next >= 1.0:
        return 1.0
    one_minus = max(1.0 - t_curr, 1e-7)
    if sampler == "flow_map":
        beta = (t_next - t_curr) / one_minus
    else:
        g = max(0.0, min(1.0, float(gamma)))
        beta = t_next - (1.0 - g * g) ** 0.5 * (1.0 - t_next) * t_curr / one_minus
    return beta / t_next if t_next > 0 else 0.0


class UntiedFlowMapLMScheduler(FlowMapLMScheduler):
    r"""
    The official FMLM* sampler with the untied SC transform of docs/algorithm.md §3.1 on its self-conditioning input
    (docs/algorithm.md "Self-conditioned flow maps"): m̃_k = F_k m_k, F_k from the overlap basis, ρ² and
    â_k = κ_{k−1}(1 − δ̄_{k−1}) ([`flowmap_kappa`]). No solver correction: a flow map's prediction already integrates
    its step. η_R = 0 (or a self-conditioning-free model, whose input is zero) is the official sampler bit for bit.

    Args:
        eta_r (`float`, defaults to 0.0): the transform strength; λ_R = λ_R^(0)·η_R with λ_R^(0) = `base_scale`.
        base_scale (`float`, defaults to 1.0): λ_R^(0) **[choice]**, unmeasured for flow maps (no base-scale run).
        eps_fp (`float`, defaults to 0.01), global_scaling (`bool`, defaults to `True`): as docs/algorithm.md §3.1.
        other arguments: [`FlowMapLMScheduler`]'s.

    Statistics ([`FlowMapStatistics`], from `untied_sc.calibration.flowmap.flowmap_statistics`) are the run's:
    [`FlowMapPipeline`] hands its `flowmap_statistics` component in the run's [`RunContext`], a direct call gives
    them as `set_timesteps(N, flowmap_statistics=...)`. They are needed only when η_R > 0.
    """

    _compatibles = ["FlowMapLMScheduler"]

    @register_to_config
    def __init__(
        self,
        sampler: str = "ctm",
        gamma: float | None = None,
        gamma_by_steps: dict[str, float] | None = None,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        tau_kind: str = "logit_normal_uniform",
        self_conditioning: str = "free",
        eta_r: float = 0.0,
        base_scale: float = 1.0,
        eps_fp: float = 0.01,
        global_scaling: bool = True,
    ):
        self._init_state(sampler, gamma, noise_scale, self_conditioning)
        if eta_r < 0 or base_scale < 0:
            raise ValueError(f"eta_r and base_scale must be ≥ 0, got {eta_r} and {base_scale}.")
        self._basis: torch.Tensor | None = None
        self._retention: list[torch.Tensor] | None = None

    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        generator: torch.Generator | None = None,
        flowmap_statistics: FlowMapStatistics | None = None,
        *,
        context: RunContext | None = None,
    ) -> None:
        """
        [`FlowMapLMScheduler.set_timesteps`], then the transform of this run: its basis and retention per step from
        the statistics (needed when η_R > 0; a run without them transforms nothing).

        Args:
            num_inference_steps, device, generator: as [`FlowMapLMScheduler.set_timesteps`].
            flowmap_statistics ([`FlowMapStatistics`], *optional*): the statistics of the model the run samples.
            context ([`RunContext`], *optional*): the run's inputs (pipelines pass it, with the pipeline's
                `flowmap_statistics` component, checked against its network); its fields stand for the arguments
                not given.
        """
        run = run_context(context, generator=generator, flowmap_statistics=flowmap_statistics)
        super().set_timesteps(num_inference_steps, device, context=run)
        statistics = run.checked_flowmap_statistics()
        strength = self.config.base_scale * self.config.eta_r
        self._basis = self._retention = None
        if strength == 0:
            return
        if statistics is None:
            raise ValueError(
                f"eta_r = {self.config.eta_r} > 0 needs the flow-map statistics (`flowmap_statistics(...)` of "
                "`untied_sc.calibration.flowmap` computes them): give the pipeline its `flowmap_statistics` "
                "component (`FlowMapPipeline(..., flowmap_statistics=...)`, a folder saved with them, or "
                "`FlowMapPipeline.from_pretrained(..., flowmap_statistics=FOLDER_OR_REPO)`), or pass "
                "`set_timesteps(N, flowmap_statistics=...)`; eta_r = 0 samples the official sampler without them."
            )
        delta = [float(d) for d in statistics.for_steps(num_inference_steps)]
        kappa = [
            flowmap_kappa(self._grid[k], self._grid[k + 1], self.gamma, self.config.sampler)
            for k in range(num_inference_steps)
        ]
        a_hat = [0.0] + [kappa[k - 1] * (1.0 - delta[k - 1]) for k in range(1, num_inference_steps)]
        rho_sq = statistics.rho_sq.to(torch.float64)
        self._basis = statistics.basis
        self._retention = [
            retention(rho_sq, a, strength, self.config.eps_fp, self.config.global_scaling) for a in a_hat
        ]

    def self_conditioning_input(self, sample: torch.Tensor) -> torch.Tensor:
        """m̃_k = F_k m_k (m_k itself when η_R = 0 or m_k is the zero input)."""
        m = super().self_conditioning_input(sample)
        if self._retention is None or self.self_conditioning is None:
            return m
        basis = self._basis.to(device=m.device, dtype=m.dtype)
        ell = self._retention[self._step_index].to(device=m.device, dtype=m.dtype)
        return overlap_transform(m, basis, ell)
