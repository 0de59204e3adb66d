"""The paper's Algorithm 1 on top of an official solver, shared by the untied ELF and LangFlow schedulers."""

import torch

from .coefficients import check_coefficients, check_preset, coefficients_table, resolve_coefficients
from .config_checks import POSITIVE
from .contract import OfficialBaseMixin
from .direction_controls import (
    CORRECTION_DIRECTIONS,
    common_direction,
    derangement,
    direction_seed,
    permuted_direction,
    random_direction,
)
from .outputs import LanguageFlowSchedulerOutput
from .sampler_statistics import SamplerStatistics
from .untied_functions import (
    combined_direction,
    history_direction,
    masked_token_mean,
    moment_projection,
    overlap_transform,
    retention,
    solver_history_direction,
    token_cosine_distance,
)
from .untied_step import (
    FusedStepPlan,
    StepOptions,
    StepScalars,
    UntiedState,
    choose_transform_kind,
    fused_untied_step,
    indexed_untied_step,
)


CORRECTION_ROUTINGS = ("solver", "self_conditioning", "both")
TRANSFORM_ASSIGNMENTS = ("overlap", "reversed", "random")
COSINE_DISTANCE_SOURCES = ("precomputed", "online")
# Defaults of the untied config keys (both families): the paper's sampler.
EPS_FP = 0.01  # floor of b_{k,i} in the retention [choice]
DEGENERACY_EPS = 1e-12  # relative degeneracy threshold of G_k [choice]
UNTIED_CONFIG_RANGES = {"eps_fp": POSITIVE, "degeneracy_eps": POSITIVE}  # coefficients: `check_coefficients`
CORRECTION_ROUTING, TRANSFORM_ASSIGNMENT, COSINE_DISTANCE = "solver", "overlap", "precomputed"
CORRECTION_DIRECTION = "history"  # the paper's U_k; the others are the controls of Table 12 (`direction_controls`)


class UntiedSelfConditioningMixin(OfficialBaseMixin):
    r"""
    Untied self-conditioning (paper Algorithm 1; docs/algorithm.md §3): one network evaluation per step, with

    1. the self-conditioning transform m̃_k = F_k m_k, which dampens the self-conditioning input along the directions
       its input map shares with the latent's (eqs. (7), (34));
    2. the solver correction A_k = η_T·Π_k(U_k) toward the step-average prediction, normalised to calibrated
       moments (eqs. (9)–(11)); `correction_direction` replaces U_k by one of the paper's controls (Table 12);
    3. untied routing (eq. (12)): z_{k+1} = S_k(z_k, p_k + A_k), O_{k+1} = (1 − κ_k)O_k + κ_k(p_k + A_k),
       m_{k+1} = p_k, E_{k+1} = (1 − α)E_k + α p_k.

    A concrete scheduler mixes this in with `SchedulerMixin, ConfigMixin`, sets `family` and
    `base_scheduler_class` (the official scheduler, used unchanged as `self.base`: with η_R = η_T = 0 every latent
    and token equals the official sampler's bit for bit), declares its config in `__init__` (the official keys plus
    the untied ones) and calls `_init_untied()`, and exposes `set_timesteps` with the official scheduler's
    arguments plus `statistics` and `mask`.

    The trajectory state (E_k, O_k, m_k, m̃_k, κ_{k−1}, δ̄_{k−1}, the step index) lives here, is created by
    `_reset_state` and reset by `set_timesteps`.
    """

    family: str
    base_scheduler_class: type
    order = 1
    # The fused step ([`fused_untied_step`], few passes over (B, L, D)); False runs the reference step, the pure
    # functions of `untied_functions` chained one by one (equal within float rounding; tests compare the two).
    # The fused step forms the history direction only: a `correction_direction` control always runs the reference.
    use_fused_step = True

    def _init_untied(self) -> None:
        """Checks the untied options, builds the official base scheduler from the config, and creates all state."""
        config = self.config
        self._guidance = None  # the guidance of the step in progress (ELF with a source), handed to the base step
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
        check_preset(config.coefficients, self.family, f" (in {type(self).__name__}'s config)")
        check_coefficients(config)
        if config.coefficients_by_steps is not None:  # stored as JSON gives it back: string NFEs, plain floats
            self.register_to_config(coefficients_by_steps=coefficients_table(config.coefficients_by_steps))
        if config.tuning_by_steps is not None:
            tuning = {str(n): dict(record) for n, record in config.tuning_by_steps.items()}
            self.register_to_config(tuning_by_steps=tuning)
        self._build_base()
        self.coefficients: dict[str, float] | None = None  # (η_R, η_T, η_O, α) of this run
        self.step_statistics = None  # μ_k, σ_k, δ̄_k of this NFE (when η_R > 0 or η_T > 0)
        self.rms: list[float] = []  # σ_k as floats, read once per run
        self.cosine_distances: list[float] = []  # δ̄_k as floats, read once per run
        self.basis: torch.Tensor | None = None  # Q (D, r); None when the transform is off (η_R = 0)
        self.rho_sq: torch.Tensor | None = None  # ρ² (r,), float64, permuted by the assignment ablations
        self.transform_strength = 0.0  # λ_R = λ_R^(0)·η_R
        self.mask: torch.Tensor | None = None  # (B, L) active positions of the correction
        self._fused_plan: FusedStepPlan | None = None  # the fused step's per-step tensors of this run
        self._kappas: list[float] = []  # κ_k as floats, read once per run
        self._compiled_step = None  # `torch.compile(indexed_untied_step)` after `compile_step()`
        self._direction_seed = 0  # seed of this run's direction-control draws ([`direction_seed`])
        self._reset_state()

    def _reset_state(self) -> None:
        self._step_index = 0
        self.ema: torch.Tensor | None = None  # E_k
        self.solver_average: torch.Tensor | None = None  # O_k
        self.raw_self_conditioning: torch.Tensor | None = None  # m_k
        self.self_conditioning: torch.Tensor | None = None  # m̃_k = F_k m_k, the network's next input
        self.previous_kappa = 0.0  # κ_{k−1}
        self.previous_cosine_distance: float | torch.Tensor = 0.0  # δ̄_{k−1}: a float, or (B,) when online
        self._step_counter: torch.Tensor | None = None  # k on the device, for the compiled step
        self._buffers: dict[str, torch.Tensor] | None = None  # the eager fused step's (B, L, D) buffers, per run
        self._direction_permutation: torch.Tensor | None = None  # π of the `permuted` control, drawn at its first use
        self._direction_generator: torch.Generator | None = None  # ξ of the `random` control, on the run's device

    def resolve_coefficients(
        self, num_inference_steps: int, statistics: SamplerStatistics | None = None
    ) -> dict[str, float]:
        """(η_R, η_T, η_O, α) for `num_inference_steps`, by the rule of docs/algorithm.md §4.5 (the config's alone;
        `statistics` hold none)."""
        return resolve_coefficients(self.config, num_inference_steps)

    def _set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None,
        statistics: SamplerStatistics | None,
        mask: torch.Tensor | None,
        direction_generator: torch.Generator | list[torch.Generator] | None = None,
        **base_kwargs,
    ) -> None:
        """
        The base solver's grid (`base_kwargs` go to the official `set_timesteps`), the statistics, a fresh state, and
        the seed of the direction controls' draws, derived from `direction_generator`'s state without drawing from it.
        """
        coefficients = self.resolve_coefficients(num_inference_steps, statistics)
        if statistics is not None and statistics.config.solver != self.family:
            raise ValueError(
                f"The sampler statistics are for the {statistics.config.solver!r} solver, this scheduler uses "
                f"{self.family!r}: they belong to another model family."
            )
        uses_statistics = coefficients["eta_r"] > 0 or coefficients["eta_t"] > 0
        if uses_statistics and statistics is None:
            raise ValueError(
                "Untied sampling with η_R > 0 or η_T > 0 needs the model's SamplerStatistics: pass "
                "`statistics=` (pipelines do this from their `sampler_statistics` component), or calibrate with "
                f"`untied-sc calibrate PIPELINE_DIR --nfe {num_inference_steps}`."
            )
        self.base.set_timesteps(num_inference_steps, device=device, **base_kwargs)
        self.timesteps, self.num_inference_steps = self.base.timesteps, num_inference_steps
        self.coefficients = coefficients
        self.step_statistics = statistics.for_steps(num_inference_steps) if uses_statistics else None
        stats = self.step_statistics
        self.rms = stats.rms.tolist() if stats is not None else []
        self.cosine_distances = stats.cosine_distance.tolist() if stats is not None else []
        self._setup_transform(statistics if coefficients["eta_r"] > 0 else None, device)
        self.mask = mask
        self._kappas = [self.solver.kappa(k) for k in range(self.solver.num_update_steps)]
        self._fused_plan = self._plan_fused_step(device)
        self._reset_state()
        if self.config.correction_direction in ("permuted", "random") and coefficients["eta_t"] > 0:
            self._direction_seed = direction_seed(self.config.direction_seed, direction_generator)

    def _plan_fused_step(self, device) -> FusedStepPlan:
        """Every per-step number of this run for the fused step, as float64 tensors on `device` (once per run)."""
        coefficients, solver = self.coefficients, self.solver
        steps = solver.num_update_steps
        eta_t, eta_o, alpha = coefficients["eta_t"], coefficients["eta_o"], coefficients["alpha"]
        table_dtype = torch.float32 if torch.device(device or "cpu").type == "mps" else torch.float64
        online = self.config.cosine_distance == "online" and self.basis is not None
        correct = eta_t > 0
        sigmas = self.rms if self.rms else [0.0] * steps
        rows = []
        for k in range(steps):
            c = eta_o * solver.delta_u(k) if correct else 0.0
            rows.append(
                StepScalars(
                    one_plus_c=1.0 + c,
                    c=c,
                    kappa=self._kappas[k],
                    eta_sigma=eta_t * sigmas[k],
                    alpha=alpha,
                    gate=float(sigmas[k] > 0),
                )
            )
        scalars = FusedStepPlan.scalar_table(rows).to(device=device, dtype=table_dtype)
        mean = None
        if correct:
            mean = self.step_statistics.mean.detach().to(device=device, dtype=table_dtype)
        kind, ell, identity = None, None, [True] * steps
        rank = self.basis.shape[1] if self.basis is not None else 0
        if rank > 0:
            kind = "online" if online else choose_transform_kind(rank, self.basis.shape[0])
        if kind in ("matrix", "low_rank"):
            # â_{k+1} = κ_k(1 − δ̄_k) of the transform that ends step k, as `_transform` forms it from Python floats.
            a_hat = [self._kappas[k] * (1 - self.cosine_distances[k]) for k in range(steps)]
            ell = retention(
                self.rho_sq,
                torch.tensor(a_hat, dtype=torch.float64),
                self.transform_strength,
                self.config.eps_fp,
                self.config.global_scaling,
            ).expand(steps, rank)
            identity = [bool((row == 1).all()) for row in ell]
            ell = ell.to(device=device, dtype=table_dtype)
        solver_direction = (correct and eta_o > 0) or online
        rho_sq = None
        if kind == "online":  # ρ² in float64 on the device (the CPU for MPS, which has no float64)
            rho_sq = self.rho_sq if table_dtype == torch.float32 else self.rho_sq.to(device)
        options = StepOptions(
            correct=correct,
            online=online,
            solver_direction=solver_direction,
            track_ema=correct or online,
            track_solver_average=(correct or online) and solver_direction,
            routing=self.config.correction_routing,
            transform_kind=kind,
            eps=self.config.degeneracy_eps,
            strength=self.transform_strength,
            eps_fp=self.config.eps_fp,
            global_scaling=self.config.global_scaling,
        )
        return FusedStepPlan(
            scalars=scalars,
            eta_t=eta_t,
            mean=mean,
            active=[sigma > 0 for sigma in sigmas],
            options=options,
            retention=ell,
            identity=identity,
            basis=self.basis if rank > 0 else None,
            rho_sq=rho_sq,
            mask=self.mask.to(device=device, dtype=torch.bool) if self.mask is not None else None,
        )

    def compile_step(self, enable: bool = True, **options):
        """
        Runs the fused step compiled: `torch.compile(indexed_untied_step, **options)` (`enable=False` goes back to
        the eager fused step). The compiled step reads its per-step numbers from per-run tables with a step counter
        kept on the device, so a run compiles one graph (again when the batch shape changes), not one per step; on
        a GPU it replaces the eager step's ~15-30 kernel launches per step by a few fused kernels. The first run
        pays the compilation (seconds to a minute). A `correction_direction` control runs the unfused step either way.
        Returns the scheduler.
        """
        self._compiled_step = torch.compile(indexed_untied_step, **options) if enable else None
        return self

    def _setup_transform(self, statistics: SamplerStatistics | None, device) -> None:
        """Q, ρ² (permuted for the assignment ablations) and λ_R = λ_R^(0)·η_R; no transform when η_R = 0."""
        self.basis, self.rho_sq, self.transform_strength = None, None, 0.0
        if statistics is None:
            return
        rho_sq = statistics.rho_sq.detach().to("cpu", torch.float64)  # r numbers: ℓ of a shared â is a CPU job
        if self.config.transform_assignment == "reversed":
            rho_sq = rho_sq.flip(0)
        elif self.config.transform_assignment == "random":
            permutation = torch.randperm(
                len(rho_sq), generator=torch.Generator().manual_seed(self.config.transform_seed)
            )
            rho_sq = rho_sq[permutation]
        self.basis = statistics.basis.to(device)
        self.rho_sq = rho_sq
        self.transform_strength = statistics.base_transform_exponent * self.coefficients["eta_r"]

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
        eta_t = self.coefficients["eta_t"]
        if eta_t == 0 and not online:
            return None, None
        rms = self.rms[k]
        history = history_direction(prediction, self.ema, active=rms > 0)
        solver_direction = solver_history_direction(
            prediction, history, self.solver_average, self.mask, self.config.degeneracy_eps
        )
        distance = None
        if online:
            distance = masked_token_mean(token_cosine_distance(history, solver_direction, self.mask), self.mask)
        if eta_t == 0:
            return None, distance
        direction = combined_direction(history, solver_direction, self.coefficients["eta_o"], self.solver.delta_u(k))
        direction = self._control_direction(direction)
        mean = self.step_statistics.mean[k].to(device=prediction.device, dtype=prediction.dtype)
        return eta_t * moment_projection(direction, mean, rms, self.mask), distance

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

    def step(
        self,
        model_output: torch.Tensor,
        timestep: torch.Tensor | float,
        sample: torch.Tensor,
        return_dict: bool = True,
        guidance=None,
    ) -> LanguageFlowSchedulerOutput | tuple:
        """
        One step of Algorithm 1 with the raw clean prediction p_k of this evaluation.

        Args:
            model_output (`torch.Tensor`): p_k (ELF: x̂; LangFlow: softmax(logits)·E_norm).
            timestep (`torch.Tensor` or `float`): the current entry of `timesteps`, `timesteps[step_index]` (checked).
            sample (`torch.Tensor`): the current latent z_k.
            return_dict (`bool`, defaults to `True`): return a [`LanguageFlowSchedulerOutput`] or a tuple.
            guidance ([`ELFGuidance`], *optional*): ELF's classifier-free guidance of this step, `model_output` being
                the combined prediction. Where the solver gets p_k itself (η_R = η_T = 0, or the
                `"self_conditioning"` routing) the base step combines the velocities as the official sampler does;
                a corrected q_k ≠ p_k goes to the solver as a prediction (the same update in exact arithmetic).

        The output's `pred_original_sample` is the prediction handed to the solver (p_k + A_k under the default
        routing) and `self_conditioning` is m̃_{k+1}, the next network's self-conditioning input.
        """
        self._check_step(timestep)
        k = self._step_index
        prediction = model_output
        self._guidance = guidance
        try:
            solver_input, prev_sample = self._update(k, prediction, timestep, sample)
        finally:
            self._guidance = None
        self._step_index += 1
        if not return_dict:
            return (prev_sample, solver_input, self.self_conditioning)
        return LanguageFlowSchedulerOutput(prev_sample, solver_input, self.self_conditioning)

    def _base_step(self, solver_input, prediction, timestep, sample) -> torch.Tensor:
        """The base solver's step on `solver_input`, with this step's guidance where the solver gets p_k itself."""
        guidance = self._guidance
        if guidance is None or solver_input is not prediction:
            return self.base.step(solver_input, timestep, sample).prev_sample
        return self.base.step(solver_input, timestep, sample, guidance=guidance).prev_sample

    def _update(self, k, prediction, timestep, sample):
        """Update step k: (the solver's input, z_{k+1})."""
        if k >= self.solver.num_update_steps:
            # LangFlow's final evaluation: the base scheduler leaves the latent as it is; nothing to correct.
            prev_sample = self._base_step(prediction, prediction, timestep, sample)
            solver_input = prediction
        elif self.use_fused_step and self.config.correction_direction == "history":
            solver_input, prev_sample = self._fused_update(k, prediction, timestep, sample)
        else:
            solver_input, prev_sample = self._reference_update(k, prediction, timestep, sample)
        return solver_input, prev_sample

    def _fused_update(
        self, k: int, prediction: torch.Tensor, timestep: torch.Tensor | float, sample: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """
        Update step k with the fused step ([`fused_untied_step`]): (q_k, z_{k+1}). The state changes only once the
        base solver's step has succeeded. With η_R = η_T = 0 (and no online δ̄) q_k = p_k and m̃_{k+1} = p_k are
        the prediction itself, so the official step runs on the official tensors: bit for bit the official sampler.
        """
        plan = self._fused_plan
        if plan.trivial:
            prev_sample = self._base_step(prediction, prediction, timestep, sample)
            self._advance(k, prediction, prediction, UntiedState(), None)
            return prediction, prev_sample
        if prediction.ndim != 3:
            raise ValueError(
                f"Expected a (B, L, D) tensor, got shape {tuple(prediction.shape)}; add the missing batch/position axes."
            )
        if self.mask is not None and tuple(self.mask.shape) != tuple(prediction.shape[:2]):
            raise ValueError(
                f"`mask` must have shape (B, L) = {tuple(prediction.shape[:2])} to match the (B, L, D) "
                f"input, got {tuple(self.mask.shape)}."
            )
        tensors, options = plan.tensors(prediction), plan.options
        state = UntiedState(
            self.ema if self.ema is not None or not options.track_ema else torch.zeros_like(prediction),
            self.solver_average
            if self.solver_average is not None or not options.track_solver_average
            else torch.zeros_like(prediction),
        )
        counter = buffers = None
        if self._compiled_step is None:
            # Writing into buffers (`out=`) has no gradient: a prediction that needs one gets new tensors.
            if not (torch.is_grad_enabled() and prediction.requires_grad):
                buffers = self._step_buffers(prediction, plan)
            output = fused_untied_step(
                prediction,
                state,
                tensors["scalars"][k],
                tensors["operators"][k],
                options,
                active=plan.active[k],
                out=buffers,
            )
        else:
            if self._step_counter is None:  # made on the device: a host copy would wait for the network
                self._step_counter = torch.full((), k, dtype=torch.int64, device=prediction.device)
            output, counter = self._compiled_step(
                self._step_counter, prediction, state, tensors["tables"], tensors["run_operators"], options
            )
        prev_sample = self._base_step(output.solver_input, prediction, timestep, sample)
        if buffers is not None:  # E_k and O_k are spent: their tensors take E_{k+2} and O_{k+2}
            buffers["ema"], buffers["solver_average"] = state.ema, state.solver_average
        if counter is not None:
            self._step_counter = counter
        self._advance(k, output.raw_self_conditioning, output.self_conditioning, output.state, output.cosine_distance)
        return output.solver_input, prev_sample

    def _advance(
        self,
        k: int,
        raw_self_conditioning: torch.Tensor,
        self_conditioning: torch.Tensor,
        state: UntiedState,
        cosine_distance: torch.Tensor | None,
    ) -> None:
        """
        The trajectory state after update step k (both steps, once the base step has succeeded): m_{k+1}, m̃_{k+1},
        E_{k+1}, O_{k+1} (`None` where not tracked), κ_k, and δ̄_k (this trajectory's when online, else the
        statistics', else unchanged).
        """
        self.raw_self_conditioning, self.self_conditioning = raw_self_conditioning, self_conditioning
        self.ema, self.solver_average = state
        self.previous_kappa = self._kappas[k]
        if cosine_distance is not None:
            self.previous_cosine_distance = cosine_distance
        elif self.cosine_distances:
            self.previous_cosine_distance = self.cosine_distances[k]

    def _step_buffers(self, prediction: torch.Tensor, plan: FusedStepPlan) -> dict[str, torch.Tensor]:
        """
        The eager fused step's buffers of this run ([`fused_untied_step`]'s `out`), made at its first step: H_k's,
        (p_k − O_k)'s and the targets of E_{k+1}, O_{k+1} (the state is double-buffered, so a failed base step
        leaves E_k and O_k as they were).
        """
        buffers = self._buffers
        if buffers is not None:
            some = next(iter(buffers.values()), None)
            if some is None or (some.shape, some.device) == (prediction.shape, prediction.device):
                return buffers
        compute = torch.float32 if torch.finfo(prediction.dtype).bits < 32 else prediction.dtype
        buffers = {}
        if plan.options.correct or plan.options.online:
            buffers["history"] = torch.empty_like(prediction)
        if plan.options.solver_direction:
            buffers["difference"] = torch.empty_like(prediction, dtype=compute)
        if plan.options.track_ema:
            buffers["ema"] = torch.empty_like(prediction)
        if plan.options.track_solver_average:
            buffers["solver_average"] = torch.empty_like(prediction)
        self._buffers = buffers
        return buffers

    def _reference_update(
        self, k: int, prediction: torch.Tensor, timestep: torch.Tensor | float, sample: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Update step k with the pure functions chained one by one (the reference of the fused step): (q_k, z_{k+1})."""
        if self.ema is None:
            self.ema = torch.zeros_like(prediction)
            self.solver_average = torch.zeros_like(prediction)
        correction, distance = self._correction(k, prediction)
        corrected = prediction if correction is None else prediction + correction
        routing = self.config.correction_routing
        solver_input = prediction if routing == "self_conditioning" else corrected
        next_raw = prediction if routing == "solver" else corrected
        prev_sample = self._base_step(solver_input, prediction, timestep, sample)
        kappa, alpha = self.solver.kappa(k), self.coefficients["alpha"]
        state = UntiedState(
            ema=(1 - alpha) * self.ema + alpha * prediction,
            solver_average=(1 - kappa) * self.solver_average + kappa * solver_input,
        )
        # m̃_{k+1} = F m_{k+1} with â = κ_k(1 − δ̄_k): the transform reads the state after step k.
        self._advance(k, next_raw, None, state, distance)
        self.self_conditioning = self._transform(next_raw)
        return solver_input, prev_sample
