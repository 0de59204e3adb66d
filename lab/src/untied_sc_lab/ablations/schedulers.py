r"""The untied schedulers with the paper's ablation switches: the lab's samplers (docs/algorithm.md §3.6, §3.8).

[`AblationUntiedELFScheduler`] and [`AblationUntiedLangFlowScheduler`] take the untied schedulers' config plus seven
switches, whose defaults ([`ABLATION_DEFAULTS`]) are the paper's sampler, so that with them they sample exactly what
[`UntiedELFScheduler`] and [`UntiedLangFlowScheduler`] sample:

- `correction_routing` (paper Table 1(a)), `global_scaling` (Table 10) and `cosine_distance` (`"online"`: this
  trajectory's δ̄_k) turn the switches of the one untied step ([`untied_step`]);
- `transform_assignment` (Tables 8, 9; `transform_seed` for `"random"`) reverses or permutes ρ² before ℓ is formed;
- `correction_direction` (Table 12; `direction_seed`) replaces U_k before Π_k, which the step does not expose: those
  runs chain the functions of each quantity (the library's history directions and [`correction_functions`])
  instead, as a scheduler with `reference_chain = True` does for any configuration (the oracle the step is tested
  against).

They subclass the library's untied schedulers through the hooks `UntiedSelfConditioningMixin` documents
(`init_untied`, `switches`, `transform_spectrum`, `start_run`, `update_step`).
"""

import torch
from diffusers.configuration_utils import register_to_config

from untied_sc.sampling_methods import ROUTINGS
from untied_sc.schedulers import (
    DEFAULT_SDE_GAMMA,
    DEGENERACY_EPS,
    EPS_FP,
    NOISE_SCALE,
    P_MEAN,
    P_STD,
    QUANTILE_EPS,
    T_EPS,
    StepSwitches,
    UntiedELFScheduler,
    UntiedLangFlowScheduler,
    UntiedState,
    history_direction,
    masked_token_mean,
    overlap_transform,
    retention,
    solver_history_direction,
    token_cosine_distance,
)
from untied_sc.untied_variants import ABLATION_DEFAULTS

from .correction_functions import combined_direction, moment_projection
from .direction_controls import (
    CORRECTION_DIRECTIONS,
    common_direction,
    derangement,
    direction_seed,
    permuted_direction,
    random_direction,
)


CORRECTION_ROUTINGS = ROUTINGS
TRANSFORM_ASSIGNMENTS = ("overlap", "reversed", "random")
COSINE_DISTANCE_SOURCES = ("precomputed", "online")


class AblationUntiedMixin:
    r"""
    The ablation switches on a family's untied scheduler (mixed in before it; see the module docstring).

    `reference_chain = True` (on an instance or a subclass) runs every update step as the functions of each quantity
    chained one by one, the oracle of [`untied_step`]: equal within float rounding (tests/test_untied_step.py).
    """

    reference_chain = False

    def init_untied(self) -> None:
        """Checks the switches' values, then the untied scheduler's `init_untied`."""
        config = self.config
        for name, allowed in (
            ("correction_routing", CORRECTION_ROUTINGS),
            ("transform_assignment", TRANSFORM_ASSIGNMENTS),
            ("cosine_distance", COSINE_DISTANCE_SOURCES),
            ("correction_direction", CORRECTION_DIRECTIONS),
        ):
            if config[name] not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {config[name]!r}.")
        seed = config.direction_seed
        if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
            raise ValueError(f"direction_seed must be an integer ≥ 0, got {seed!r}.")
        self._direction_seed = 0  # seed of this run's direction-control draws ([`direction_seed`])
        self._direction_permutation: torch.Tensor | None = None  # π of the `permuted` control, drawn at its first use
        self._direction_generator: torch.Generator | None = None  # ξ of the `random` control, on the run's device
        super().init_untied()

    def start_run(self, run_generator) -> None:
        """Fresh direction-control draws, seeded from `run_generator`'s state ([`direction_seed`])."""
        super().start_run(run_generator)
        self._direction_permutation = None
        self._direction_generator = None
        if self.config.correction_direction in ("permuted", "random") and self.coefficients.eta_t > 0:
            self._direction_seed = direction_seed(self.config.direction_seed, run_generator)

    def switches(self) -> StepSwitches:
        """The step's routing, online δ̄ and global scaling, from the config's switches."""
        config = self.config
        return StepSwitches(
            routing=config.correction_routing,
            online_distance=config.cosine_distance == "online",
            global_scaling=config.global_scaling,
        )

    def transform_spectrum(self, rho_sq: torch.Tensor) -> torch.Tensor:
        """ρ² reversed or permuted by the `transform_assignment` ablation."""
        rho_sq = super().transform_spectrum(rho_sq)
        if self.config.transform_assignment == "reversed":
            return rho_sq.flip(0)
        if self.config.transform_assignment == "random":
            generator = torch.Generator().manual_seed(self.config.transform_seed)
            return rho_sq[torch.randperm(len(rho_sq), generator=generator)]
        return rho_sq

    def update_step(self, k, prediction, timestep, sample):
        """The untied step, or the chained functions for a direction control (or `reference_chain`)."""
        chained = self.reference_chain or self.config.correction_direction != "history"
        if k >= self.solver.num_update_steps or not chained:
            return super().update_step(k, prediction, timestep, sample)
        return self._chained_update(k, prediction, timestep, sample)

    def _chained_update(
        self, k: int, prediction: torch.Tensor, timestep: torch.Tensor | float, sample: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Update step k with the functions of each quantity chained one by one: (q_k, z_{k+1})."""
        if self.ema is None:
            self.ema = torch.zeros_like(prediction)
            self.solver_average = torch.zeros_like(prediction)
        correction, distance = self._correction(k, prediction)
        corrected = prediction if correction is None else prediction + correction
        routing = self.config.correction_routing
        # Routing, eq. (12): the solver and O get q_k, self-conditioning gets m_{k+1}.
        solver_input = prediction if routing == "self_conditioning" else corrected
        next_raw = prediction if routing == "solver" else corrected
        prev_sample = self.base_step(solver_input, prediction, timestep, sample)
        kappa, alpha = self.solver.kappa(k), self.coefficients.alpha
        state = UntiedState(
            ema=(1 - alpha) * self.ema + alpha * prediction,  # eq. (6)
            solver_average=(1 - kappa) * self.solver_average + kappa * solver_input,  # eq. (8)
        )
        # m̃_{k+1} = F m_{k+1} with â = κ_k(1 − δ̄_k): the transform reads the state after step k.
        self.advance(k, next_raw, None, state, distance)
        self.self_conditioning = self._transform(next_raw)
        return solver_input, prev_sample

    def _transform(self, raw: torch.Tensor) -> torch.Tensor:
        """
        m̃ = F m with â = κ_{k−1}(1 − δ̄_{k−1}) (eq. (13)); identity when η_R = 0. With the online δ̄, â is (B,) and
        each sample gets its own retention, computed for the whole batch at once.
        """
        if self.basis is None or self.basis.shape[1] == 0:
            return raw
        a_hat = self.previous_kappa * (1 - self.previous_cosine_distance)
        ell = retention(self.rho_sq, a_hat, self.transform_strength, self.config.eps_fp, self.config.global_scaling)
        return overlap_transform(raw, self.basis, ell.to(raw.dtype))

    def _correction(self, k: int, prediction: torch.Tensor) -> tuple[torch.Tensor | None, torch.Tensor | None]:
        """
        (A_k, δ̄_k) of update step k: the correction A_k = η_T·Π_k(U_k) (eq. (11); `None` when η_T = 0) and this
        trajectory's per-sample mean cosine distance δ̄_k, shape (B,) (the online option; `None` when δ̄ is the
        precomputed one or the transform is off).
        """
        online = self.config.cosine_distance == "online" and self.basis is not None
        eta_t = self.coefficients.eta_t
        if eta_t == 0 and not online:
            return None, None
        rms = self.rms[k]
        history = history_direction(prediction, self.ema, active=rms > 0)  # H_k, eq. (9)
        solver_direction = solver_history_direction(  # G_k, eq. (9)
            prediction, history, self.solver_average, self.mask, self.config.degeneracy_eps
        )
        distance = None
        if online:
            distance = masked_token_mean(token_cosine_distance(history, solver_direction, self.mask), self.mask)
        if eta_t == 0:
            return None, distance
        direction = combined_direction(history, solver_direction, self.coefficients.eta_o, self.solver.delta_u(k))
        direction = self._control_direction(direction)  # U_k, eq. (10), or its control
        mean = self.step_statistics.mean[k].to(device=prediction.device, dtype=prediction.dtype)
        return eta_t * moment_projection(direction, mean, rms, self.mask), distance  # eq. (11)

    def _control_direction(self, direction: torch.Tensor) -> torch.Tensor:
        """
        U_k as the config's `correction_direction` control has it (paper Table 12; `direction_controls`): U_k itself
        (`history`), the batch's common component, the direction of another sample by a derangement drawn at the
        run's first correction, or Gaussian noise with U_k's centred RMS, one draw per update step. The draws come
        from generators seeded with `_direction_seed`: the permutation on the CPU, the noise on U_k's device.
        """
        control = self.config.correction_direction
        if control == "history":
            return direction
        if control == "common":
            return common_direction(direction, self.mask)
        if control == "permuted":
            if self._direction_permutation is None:
                generator = torch.Generator().manual_seed(self._direction_seed)
                self._direction_permutation = derangement(direction.shape[0], generator).to(direction.device)
            return permuted_direction(direction, self._direction_permutation)
        if self._direction_generator is None:
            self._direction_generator = torch.Generator(direction.device).manual_seed(self._direction_seed)
        noise = torch.randn(
            direction.shape, generator=self._direction_generator, device=direction.device, dtype=torch.float32
        )
        return random_direction(direction, noise, self.mask)


# The config schema of a diffusers scheduler is its `__init__` signature: each family's keys are repeated here,
# followed by the switches (the bodies are the untied schedulers', `init_untied`).
class AblationUntiedELFScheduler(AblationUntiedMixin, UntiedELFScheduler):
    r"""
    [`UntiedELFScheduler`] with the paper's ablation switches (module docstring; docs/algorithm.md §3.6, §3.8).

    Args:
        noise_scale, …, degeneracy_eps: [`UntiedELFScheduler`]'s config.
        correction_routing (`str`, defaults to `"solver"`): where A_k goes: `"solver"`, `"self_conditioning"` or
            `"both"` (paper Table 1(a)).
        transform_assignment (`str`, defaults to `"overlap"`): which direction gets which retention: `"overlap"`,
            `"reversed"`, or `"random"` with `transform_seed` (paper Tables 8, 9).
        transform_seed (`int`, defaults to 0): seed of the `"random"` assignment.
        global_scaling (`bool`, defaults to `True`): keep the common factor g_k in the retention (paper Table 10).
        cosine_distance (`str`, defaults to `"precomputed"`): δ̄ from the statistics, or `"online"` from this
            trajectory's own H and G (per sample).
        correction_direction (`str`, defaults to `"history"`): the direction Π_k normalises: the paper's history
            direction U_k, or a control of paper Table 12: `"common"` (the batch's common component), `"permuted"`
            (another sample's U_k), `"random"` (noise with U_k's centred RMS).
        direction_seed (`int`, defaults to 0): mixed with the sampling generator's state into the seed of the
            `"permuted"` and `"random"` draws (the sampling stream itself is not drawn from).
    """

    _kept_config_keys = ()

    @register_to_config
    def __init__(
        self,
        noise_scale: float = NOISE_SCALE,
        p_mean: float = P_MEAN,
        p_std: float = P_STD,
        sde_gamma: float | None = None,
        sde_gamma_by_steps: dict[str, float] | None = DEFAULT_SDE_GAMMA,
        t_eps: float = T_EPS,
        eta_r: float | None = None,
        eta_t: float | None = None,
        eta_o: float | None = None,
        alpha: float | None = None,
        coefficients: str | None = None,
        coefficients_by_steps: dict[str, dict[str, float]] | None = None,
        tuning_by_steps: dict[str, dict] | None = None,
        eps_fp: float = EPS_FP,
        degeneracy_eps: float = DEGENERACY_EPS,
        correction_routing: str = ABLATION_DEFAULTS["correction_routing"],
        transform_assignment: str = ABLATION_DEFAULTS["transform_assignment"],
        transform_seed: int = ABLATION_DEFAULTS["transform_seed"],
        global_scaling: bool = ABLATION_DEFAULTS["global_scaling"],
        cosine_distance: str = ABLATION_DEFAULTS["cosine_distance"],
        correction_direction: str = ABLATION_DEFAULTS["correction_direction"],
        direction_seed: int = ABLATION_DEFAULTS["direction_seed"],
    ):
        self.init_untied()


class AblationUntiedLangFlowScheduler(AblationUntiedMixin, UntiedLangFlowScheduler):
    r"""
    [`UntiedLangFlowScheduler`] with the paper's ablation switches, as [`AblationUntiedELFScheduler`] has them.

    Args:
        quantile_eps, …, degeneracy_eps: [`UntiedLangFlowScheduler`]'s config.
        correction_routing, transform_assignment, transform_seed, global_scaling, cosine_distance,
        correction_direction, direction_seed: the switches, as for [`AblationUntiedELFScheduler`].
    """

    _kept_config_keys = ()

    @register_to_config
    def __init__(
        self,
        quantile_eps: float = QUANTILE_EPS,
        proposal: list[float] | None = None,
        eta_r: float | None = None,
        eta_t: float | None = None,
        eta_o: float | None = None,
        alpha: float | None = None,
        coefficients: str | None = None,
        coefficients_by_steps: dict[str, dict[str, float]] | None = None,
        tuning_by_steps: dict[str, dict] | None = None,
        eps_fp: float = EPS_FP,
        degeneracy_eps: float = DEGENERACY_EPS,
        correction_routing: str = ABLATION_DEFAULTS["correction_routing"],
        transform_assignment: str = ABLATION_DEFAULTS["transform_assignment"],
        transform_seed: int = ABLATION_DEFAULTS["transform_seed"],
        global_scaling: bool = ABLATION_DEFAULTS["global_scaling"],
        cosine_distance: str = ABLATION_DEFAULTS["cosine_distance"],
        correction_direction: str = ABLATION_DEFAULTS["correction_direction"],
        direction_seed: int = ABLATION_DEFAULTS["direction_seed"],
    ):
        self.init_untied()


ABLATION_SCHEDULERS = {cls.family: cls for cls in (AblationUntiedELFScheduler, AblationUntiedLangFlowScheduler)}


def ablation_scheduler_class(family: str) -> type:
    """The ablation scheduler of `family` (`"elf"` or `"langflow"`)."""
    if family not in ABLATION_SCHEDULERS:
        raise ValueError(f"The solver family must be one of {sorted(ABLATION_SCHEDULERS)}, got {family!r}.")
    return ABLATION_SCHEDULERS[family]


def needs_ablation_scheduler(overrides) -> bool:
    """Whether config `overrides` name an ablation switch (then only the ablation scheduler takes them)."""
    return any(key in ABLATION_DEFAULTS for key in overrides)
