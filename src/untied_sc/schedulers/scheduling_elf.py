"""The official ELF sampler as a diffusers scheduler."""

import math
from dataclasses import dataclass

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from ..per_nfe import check_steps, read_steps_table
from .comparison_names import ELF_COMPARISON_SCHEDULERS
from .compatibility import CompatibleSchedulerMixin
from .config_checks import FINITE, NON_NEGATIVE, POSITIVE, Range
from .contract import check_begin_index, check_timestep
from .noise import NoiseStream, RunRandom, check_generator, global_generator
from .outputs import LanguageFlowSchedulerOutput
from .run_context import RunContext, TakesRunContext, run_context
from .solvers import ELFSolver


# The official sampler's settings, the defaults of every ELF scheduler's config (official and untied).
NOISE_SCALE = 2.0  # the interpolant's noise scale
P_MEAN, P_STD = -1.5, 0.8  # the logit-normal time grid: the training values
T_EPS = 0.05  # the velocity clamp max(1 − s, t_eps)
ELF_CONFIG_RANGES = {
    "noise_scale": POSITIVE,
    "p_mean": FINITE,
    "p_std": POSITIVE,
    "sde_gamma": NON_NEGATIVE,
    "sde_gamma_by_steps": NON_NEGATIVE,
    "t_eps": Range(0.0, 1.0, low_inclusive=False, high_inclusive=False),
}
# γ_sde per NFE for the base models (the paper's protocol; the official configs list 32 → 1.5 and 64 → 1.0).
DEFAULT_SDE_GAMMA = {"8": 2.0, "16": 2.0, "32": 1.5, "64": 1.0}


def default_sde_gamma(num_steps: int) -> float:
    """
    The default churn γ_sde for `num_steps` network evaluations, defined for every N ≥ 1 (docs/algorithm.md §2.1).

    Rule **[choice]**: the official value where one exists (`DEFAULT_SDE_GAMMA`, from the official ELF configs and
    the paper's protocol: 8 → 2.0, 16 → 2.0, 32 → 1.5, 64 → 1.0); between two listed NFEs, linear interpolation in
    log2(N) (e.g. 12 → 2.0, 24 → 2.0 − 0.5·log2(24/16) ≈ 1.7075, 48 → 1.5 − 0.5·log2(48/32) ≈ 1.2075); outside
    [8, 64], the end value (N < 8 → 2.0, N > 64 → 1.0).
    """
    check_steps(num_steps, "num_steps", minimum=1)
    points = sorted(
        (n, float(gamma)) for n, gamma in read_steps_table(DEFAULT_SDE_GAMMA, "sde_gamma_by_steps").items()
    )
    if num_steps <= points[0][0]:
        return points[0][1]
    if num_steps >= points[-1][0]:
        return points[-1][1]
    for (n0, g0), (n1, g1) in zip(points, points[1:], strict=False):
        if n0 <= num_steps <= n1:
            fraction = (math.log2(num_steps) - math.log2(n0)) / (math.log2(n1) - math.log2(n0))
            return g0 + fraction * (g1 - g0)
    raise AssertionError("unreachable: num_steps lies within the listed NFEs")


def elf_time_grid(num_steps: int, generator: torch.Generator, p_mean: float, p_std: float) -> torch.Tensor:
    """
    t_0 = 0 < sorted(sigmoid(N(p_mean, p_std²)), N−1 draws) < t_N = 1, float32, drawn from `generator` and computed
    on the generator's device (as the official code does on its device).
    """
    device = generator.device
    normals = torch.randn((num_steps - 1,), generator=generator, device=device, dtype=torch.float32)
    inner = torch.sort(torch.sigmoid(normals * p_std + p_mean)).values
    return torch.cat([torch.zeros(1, device=device), inner, torch.ones(1, device=device)])


def elf_add_noise(
    original_samples: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor | float, noise_scale: float
) -> torch.Tensor:
    """
    z_t = t·x_0 + (1 − t)·noise_scale·ε: ELF's interpolant (t = 0 noise, t = 1 data), the training objective's
    noising. `timesteps` is one t for all, or one per sample (shape `(B,)`), broadcast over the other axes.
    """
    t = timesteps
    if isinstance(t, torch.Tensor):
        t = t.to(original_samples.device)
        if t.ndim == 1:
            t = t.reshape(-1, *(1,) * (original_samples.ndim - 1))
    return t * original_samples + (1 - t) * noise_scale * noise


def copy_generator(generator: torch.Generator) -> torch.Generator:
    """A generator in the same state, so that a stream can be drawn twice."""
    copy = torch.Generator(device=generator.device)
    copy.set_state(generator.get_state())
    return copy


@dataclass
class ELFGuidance:
    """
    Classifier-free guidance of one ELF step, for [`ELFScheduler.step`]: the step's two raw network predictions and
    the guidance scale w (official `utils/sampling_utils.py` `_forward_sample`). The `model_output` handed with it is
    the combined prediction x̂_u + w·(x̂_c − x̂_u) (the next self-conditioning input); the update combines velocities.

    Args:
        conditional (`torch.Tensor`): x̂_c, the prediction given the source.
        unconditional (`torch.Tensor`): x̂_u, the prediction with the source dropped.
        scale (`float`): w.
    """

    conditional: torch.Tensor
    unconditional: torch.Tensor
    scale: float


class ELFScheduler(TakesRunContext, CompatibleSchedulerMixin, SchedulerMixin, ConfigMixin):
    r"""
    The official ELF sampler (docs/algorithm.md §2.1): a random logit-normal time grid shared by the batch, N−1 SDE
    steps that re-noise the latent before each network call, and a final ODE step to t = 1. NFE = N; the decode pass
    that follows is not counted.

    Randomness follows the official PyTorch port on the generator's device (docs/algorithm.md §2.1). A CPU generator
    is the official CPU run, where the global RNG and a `torch.Generator` are seeded alike: the grid's N−1 normals
    come from a copy of `generator` taken in `set_timesteps` (before any draw), then the initial latent (the
    pipeline) and one noise tensor before every SDE step's network call come from `generator` itself; one seed gives
    the official result bit for bit, on any device the latents live on. On a GPU the noise is drawn ahead on a
    background thread while the network runs ([`NoiseStream`]): same numbers, same final generator state. A CUDA
    generator is the official run on CUDA, one device stream: the grid, then z_0, then the noise, all drawn from
    `generator` on its device.

    Use: `set_timesteps(N, generator=g)` (no generator: torch's global one); then per step
    `model_input = scale_model_input(z, t)` (the re-noising), the network at `t` on `model_input` with self-conditioning input `self_conditioning`, and `step(x_pred, t, z)`.
    The step's noise ε_k is drawn from `g` by the first `scale_model_input` of step k and cached for that step, so
    `scale_model_input` is pure (calling it again gives the same tensor and draws nothing), and `step` re-noises the
    `sample` it is given with the same ε_k: a loop or callback that edits the latent is followed exactly.

    Args:
        noise_scale (`float`, defaults to 2.0): std of the initial and re-noising noise (`init_noise_sigma`).
        p_mean (`float`, defaults to -1.5), p_std (`float`, defaults to 0.8): the logit-normal grid (the training
            values, as the official sampler uses).
        sde_gamma (`float`, *optional*): churn strength for every NFE; `None` looks it up in `sde_gamma_by_steps`.
        sde_gamma_by_steps (`dict[str, float]`, defaults to `DEFAULT_SDE_GAMMA`): churn strength per NFE (8 → 2.0,
            16 → 2.0, 32 → 1.5, 64 → 1.0); an NFE it does not list (or `None`) uses [`default_sde_gamma`]
            (log2-interpolated official values).
        t_eps (`float`, defaults to 0.05): velocity clamp, max(1 − s, t_eps).

    The attribute `draw_ahead` (not a config key; set it on the instance, on `scheduler.base` of a scheduler that
    wraps this one) chooses [`NoiseStream`]'s draw-ahead: `None` (default) when a CPU generator feeds latents on
    another device, `True` also on the CPU, `False` never. It changes no number.

    The SC-CFG scale, a network input, is the pipeline's (`ELFPipeline`), not a scheduler setting.
    """

    family = "elf"
    order = 1
    _compatibles = ["UntiedELFScheduler", *ELF_COMPARISON_SCHEDULERS]
    _config_ranges = ELF_CONFIG_RANGES
    draw_ahead: bool | None = None
    takes_guidance = True  # `step(..., guidance=ELFGuidance)`: a conditional pipeline hands its two predictions

    @register_to_config
    def __init__(
        self,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        sde_gamma: float | None = None,
        sde_gamma_by_steps: dict[str, float] | None = DEFAULT_SDE_GAMMA,
        t_eps: float = T_EPS,
    ):
        self.init_noise_sigma = noise_scale
        self.solver: ELFSolver | None = None
        self.timesteps: torch.Tensor | None = None
        self.num_inference_steps: int | None = None
        self._reset_state()

    def _reset_state(self, noise: NoiseStream | None = None) -> None:
        if getattr(self, "_noise_stream", None) is not None:
            self._noise_stream.close()  # a run left unfinished gives its drawn-ahead noise back to its generator
        self._noise_stream = noise  # ε_0..ε_{N−2} of this run, in the official order
        self._step_index = 0
        self._begin_index = 0
        # ε_k of the current SDE step and its k: only one step's noise is ever needed, so only one is kept.
        self._noise: torch.Tensor | None = None
        self._noise_step_index: int | None = None
        self.self_conditioning: torch.Tensor | None = None

    @property
    def step_index(self) -> int:
        return self._step_index

    @property
    def begin_index(self) -> int:
        """The step the run began at (0 unless `set_begin_index` said otherwise)."""
        return self._begin_index

    def sde_gamma_for(self, num_inference_steps: int) -> float:
        """γ_sde for N steps: `sde_gamma` if set, else N's `sde_gamma_by_steps` entry, else `default_sde_gamma(N)`."""
        if self.config.sde_gamma is not None:
            return float(self.config.sde_gamma)
        table = read_steps_table(self.config.sde_gamma_by_steps, "sde_gamma_by_steps")
        if num_inference_steps in table:
            return float(table[num_inference_steps])
        return default_sde_gamma(num_inference_steps)

    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        generator: torch.Generator | None = None,
        grid_generator: torch.Generator | None = None,
        *,
        context: RunContext | None = None,
    ) -> None:
        """
        Draws the time grid and resets the trajectory state.

        Args:
            num_inference_steps (`int`): N ≥ 2, the number of network evaluations.
            device (`str` or `torch.device`, *optional*): where `timesteps` lives.
            generator (`torch.Generator`, *optional*): the sampling generator, CPU or CUDA. CPU (the official CPU
                stream): the grid is drawn from a copy of it, and the re-noising draws advance it. CUDA (the official
                CUDA stream): the grid is drawn from it on its device, advancing it, then the re-noising draws.
                `None`: torch's global generator of `device` (as diffusers), so `torch.manual_seed` fixes the grid.
            grid_generator (`torch.Generator`, *optional*): draw the grid from this generator instead (advancing
                it), for a run whose official grid stream is not the generator's start (the conditional generation,
                [`ELFText2TextPipeline`]). `None` (default): as above.
            context ([`RunContext`], *optional*): the run's inputs (pipelines pass it); its `generator` and
                `grid_generator` stand for the arguments not given.
        """
        run = run_context(context, generator=generator, grid_generator=grid_generator)
        generator, grid_generator = run.generator, run.grid_generator
        if generator is None:
            generator = global_generator(device)
        check_generator(generator)
        self._reset_state()  # an unfinished run's draw ahead goes back to its generator before anything is drawn
        random = run.random_for(generator)
        random.settle()
        self.solver = ELFSolver(
            self._draw_grid(num_inference_steps, generator, grid_generator),
            self.sde_gamma_for(num_inference_steps),
            self.config.noise_scale,
            self.config.t_eps,
        )
        self.num_inference_steps = num_inference_steps
        self.timesteps = torch.tensor(self.solver.eval_times, dtype=torch.float32, device=device)
        self._reset_state(self._noise_from(0, random))

    def _noise_from(self, begin_index: int, random: RunRandom) -> NoiseStream:
        """The noise stream of a run from step `begin_index`: one draw per SDE step it takes, in order."""
        num_draws = sum(self.solver.renoises(k) for k in range(begin_index, self.solver.num_update_steps))
        return random.noise(num_draws, draw_ahead=self.draw_ahead)

    def set_begin_index(self, begin_index: int = 0) -> None:
        """
        Starts the run at step `begin_index` (diffusers' image-to-image use): call it after `set_timesteps` and
        before the first `scale_model_input`, then run the loop over `timesteps[begin_index:]` from a latent at
        t_{begin_index}. The run's noise stream then holds one draw per SDE step from there, drawn from the
        generator in order as the steps take them.
        """
        check_begin_index(begin_index, self.num_inference_steps, self._run_started())
        self._reset_state(self._noise_from(begin_index, self._noise_stream.owner))
        self._step_index = self._begin_index = begin_index

    def _run_started(self) -> bool:
        return self._step_index != self._begin_index or self._noise_step_index is not None

    def _draw_grid(
        self, num_inference_steps: int, generator: torch.Generator, grid_generator: torch.Generator | None = None
    ) -> list[float]:
        check_steps(num_inference_steps)
        # The official CPU run draws the grid from the global RNG, seeded like the generator (so: from a copy); on CUDA
        # it draws everything from the one CUDA RNG, the grid first.
        source = copy_generator(generator) if generator.device.type == "cpu" else generator
        source = source if grid_generator is None else grid_generator
        return elf_time_grid(num_inference_steps, source, self.config.p_mean, self.config.p_std).tolist()

    def _check_ready(self) -> None:
        if self.solver is None:
            raise RuntimeError("Call `set_timesteps` before sampling.")
        if self._step_index >= self.solver.num_update_steps:
            raise RuntimeError(f"All {self.solver.num_update_steps} steps are done; call `set_timesteps` again.")

    def _step_noise(self, sample: torch.Tensor) -> torch.Tensor:
        """ε_k of the current step: taken from the run's noise stream on first use (the official order), then reused."""
        k = self._step_index
        if self._noise_step_index != k:
            self._noise = self._noise_stream.next(sample.shape, sample.device, sample.dtype)
            self._noise_step_index = k
        if self._noise.shape != sample.shape:
            raise ValueError(
                f"sample has shape {tuple(sample.shape)}, but step {k} drew its noise for {tuple(self._noise.shape)}."
            )
        return self._noise

    def _renoised(self, sample: torch.Tensor) -> torch.Tensor:
        """z_b = a·z + (1 − a)·noise_scale·ε_k on SDE steps, z on the last."""
        k = self._step_index
        if not self.solver.renoises(k):
            return sample
        return self.solver.renoise(k, sample, self._step_noise(sample))

    def scale_model_input(self, sample: torch.Tensor, timestep: torch.Tensor | float | None = None) -> torch.Tensor:
        """
        The network input of the current step: z_b = a·z + (1 − a)·noise_scale·ε_k on SDE steps, z on the last.

        Pure: ε_k is drawn once per step (on the first call) and cached, so calling it again with the same `sample`
        returns the same tensor and leaves the generator untouched. Before `set_timesteps` it returns `sample`, as
        diffusers' schedulers do.

        Args:
            sample (`torch.Tensor`): the current latent z_k.
            timestep (`torch.Tensor` or `float`, *optional*): unused (steps are counted internally).
        """
        if self.solver is None:
            return sample
        self._check_ready()
        return self._renoised(sample)

    def step(
        self,
        model_output: torch.Tensor,
        timestep: torch.Tensor | float,
        sample: torch.Tensor,
        return_dict: bool = True,
        guidance: ELFGuidance | None = None,
    ) -> LanguageFlowSchedulerOutput | tuple:
        """
        One solver update with the network's clean prediction x̂ (evaluated on `scale_model_input`'s output). The
        update starts from `sample` re-noised with this step's cached ε_k, so an edited `sample` is honoured.

        Args:
            model_output (`torch.Tensor`): the x-prediction x̂ of this step.
            timestep (`torch.Tensor` or `float`): the current entry of `timesteps`, `timesteps[step_index]` (checked).
            sample (`torch.Tensor`): the current latent z_k (before re-noising), as given to `scale_model_input`.
            return_dict (`bool`, defaults to `True`): return a [`LanguageFlowSchedulerOutput`] or a tuple.
            guidance ([`ELFGuidance`], *optional*): classifier-free guidance of this step (`model_output` is then
                the combined prediction): the update combines the two predictions' velocities, as the official
                conditional sampler does ([`ELFSolver.guided_update`]). `None` (default): no guidance.
        """
        self._check_ready()
        k = self._step_index
        check_timestep(timestep, self.timesteps, k)
        if self.solver.renoises(k) and self._noise_step_index != k:
            # Drawing ε_k here would leave the network evaluated on an input other than the one S_k starts from.
            raise RuntimeError("Call `scale_model_input` before `step`: ELF re-noises the latent before the network.")
        if model_output.shape != sample.shape:
            raise ValueError(f"model_output has shape {tuple(model_output.shape)}, expected {tuple(sample.shape)}.")
        if guidance is None:
            prev_sample = self.solver.update(k, self._renoised(sample), model_output)
        else:
            prev_sample = self.solver.guided_update(
                k, self._renoised(sample), guidance.conditional, guidance.unconditional, guidance.scale
            )
        self.self_conditioning = model_output
        self._noise, self._noise_step_index = None, None  # ε_k is spent: step k + 1 draws its own
        self._step_index += 1
        if not return_dict:
            return (prev_sample, model_output, model_output)
        return LanguageFlowSchedulerOutput(prev_sample, model_output, model_output)

    def add_noise(
        self, original_samples: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor | float
    ) -> torch.Tensor:
        """
        z_t = t·x_0 + (1 − t)·noise_scale·ε ([`elf_add_noise`]): the latent at time t of clean latents x_0 and unit
        Gaussian noise ε, as the training objective forms it.

        Args:
            original_samples (`torch.Tensor` of shape `(B, L, D)`): x_0.
            noise (`torch.Tensor` of shape `(B, L, D)`): ε ~ N(0, I) (scaled here by `noise_scale`).
            timesteps (`torch.Tensor` of shape `(B,)` or `()`, or `float`): t ∈ [0, 1] (0 noise, 1 data).
        """
        return elf_add_noise(original_samples, noise, timesteps, self.config.noise_scale)

    def __len__(self) -> int:
        return self.num_inference_steps or 0
