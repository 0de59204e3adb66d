"""The paper's Algorithm 1 on top of an official solver, shared by the untied ELF and LangFlow schedulers."""

from typing import NamedTuple

import torch

from ..untied_variants import ABLATION_DEFAULTS
from .coefficients import (
    UntiedCoefficients,
    check_coefficients,
    check_preset,
    coefficients_table,
    resolve_coefficients,
    tuning_table,
    write_coefficients_table,
    write_tuning_table,
)
from .config_checks import POSITIVE
from .contract import OfficialBaseMixin, init_keys
from .outputs import LanguageFlowSchedulerOutput
from .sampler_statistics import SamplerStatistics
from .transform import retention
from .untied_step import (
    StepOptions,
    StepScalars,
    UntiedState,
    UntiedStepPlan,
    choose_transform_kind,
    untied_step,
    untied_step_at,
)


# Defaults of the untied config keys (both families): the paper's sampler.
EPS_FP = 0.01  # floor of b_{k,i} in the retention [choice]
DEGENERACY_EPS = 1e-12  # relative degeneracy threshold of G_k [choice]
UNTIED_CONFIG_RANGES = {"eps_fp": POSITIVE, "degeneracy_eps": POSITIVE}  # coefficients: `check_coefficients`


class StepSwitches(NamedTuple):
    """The switches of the step that a subclass may turn ([`UntiedSelfConditioningMixin.switches`], the lab's
    ablations); these defaults are the paper's sampler."""

    routing: str = "solver"  # where A_k goes (eq. (12))
    online_distance: bool = False  # δ̄_k from this trajectory (True) or from the statistics
    global_scaling: bool = True  # the common factor g_k of the retention (eq. (34))


class UntiedSelfConditioningMixin(OfficialBaseMixin):
    r"""
    Untied self-conditioning (paper Algorithm 1; docs/algorithm.md §3): one network evaluation per step, with

    1. the self-conditioning transform m̃_k = F_k m_k, which dampens the self-conditioning input along the directions
       its input map shares with the latent's (eqs. (7), (34));
    2. the solver correction A_k = η_T·Π_k(U_k) toward the step-average prediction, normalised to calibrated
       moments (eqs. (9)–(11));
    3. untied routing (eq. (12)): z_{k+1} = S_k(z_k, p_k + A_k), O_{k+1} = (1 − κ_k)O_k + κ_k(p_k + A_k),
       m_{k+1} = p_k, E_{k+1} = (1 − α)E_k + α p_k.

    A concrete scheduler mixes this in with `SchedulerMixin, ConfigMixin`, sets `family` and
    `base_scheduler_class` (the official scheduler, used unchanged as `self.base`: with η_R = η_T = 0 every latent
    and token equals the official sampler's bit for bit), declares its config in `__init__` (the official keys plus
    the untied ones) and calls `init_untied()`, and exposes `set_timesteps` with the official scheduler's
    arguments plus `statistics` and `mask`.

    Each update step runs [`untied_step`] (eagerly, or compiled after `compile_step()`), the one implementation of
    the step's arithmetic, over the numbers `set_timesteps` prepares for the run ([`UntiedStepPlan`]). The trajectory
    state (E_k, O_k, m_k, m̃_k, κ_{k−1}, δ̄_{k−1}, the step index) lives here, is created by `_reset_state` and reset
    by `set_timesteps`.

    Subclassing: a subclass changes the step through these hooks only (the lab's ablation schedulers,
    `untied_sc_lab.ablations`, with the paper's routing, transform assignment, global scaling, online δ̄ and
    direction controls; the calibration's reference recurrence, `calibration/reference.py`):

    - `init_untied()`, the body of `__init__` (a subclass checks its own config keys, then calls it);
    - `switches()`, the [`StepSwitches`] of the run's step (default: the paper's sampler);
    - `transform_spectrum(rho_sq)`, ρ² as the SC transform assigns it to the basis' directions (default: as
      calibrated);
    - `start_run(run_generator)`, called last by `set_timesteps` with the run's sampling generator (default: nothing);
    - `update_step(k, prediction, timestep, sample)`, update step k: (q_k, z_{k+1}). A replacement (the lab's
      chained oracle) runs the base solver with `base_step` and hands the state after the step to `advance`
      ([`UntiedState`] E_{k+1}, O_{k+1}).

    The trajectory state is the attributes `ema`, `solver_average`, `raw_self_conditioning`, `self_conditioning`,
    `previous_kappa`, `previous_cosine_distance`; a run's numbers are `coefficients`, `solver`, `step_statistics`,
    `rms`, `cosine_distances`, `basis`, `rho_sq`, `transform_strength` and `mask`.
    """

    family: str
    base_scheduler_class: type
    order = 1
    takes_guidance = True  # `step(..., guidance=...)`, handed to the base step ([`ELFScheduler.takes_guidance`])

    @classmethod
    def extract_init_dict(cls, config_dict, **kwargs):
        """
        Refuses an ablation switch ([`ABLATION_DEFAULTS`]) at another value than the paper's sampler's, given in the
        config or as an override: only the lab's subclass runs it. At the paper's values the keys load silently.
        """
        given, takes = {**config_dict, **kwargs}, init_keys(cls)
        changed = {
            key: given[key]
            for key, default in ABLATION_DEFAULTS.items()
            if key in given and key not in takes and given[key] != default
        }
        if changed:
            lab = {"elf": "AblationUntiedELFScheduler", "langflow": "AblationUntiedLangFlowScheduler"}[cls.family]
            raise ValueError(
                f"{cls.__name__} runs the paper's sampler; {changed} are ablation switches of the lab's {lab} "
                f'(untied_sc_lab.ablations, pip install "untied-sc[lab]"): build that one for them, or remove the '
                f"keys (the paper's values: { {key: ABLATION_DEFAULTS[key] for key in changed} })."
            )
        return super().extract_init_dict(config_dict, **kwargs)

    def init_untied(self) -> None:
        """Checks the coefficients, builds the official base scheduler from the config, and creates all state."""
        config = self.config
        self._guidance = None  # the guidance of the step in progress (ELF with a source), handed to the base step
        check_preset(config.coefficients, self.family, f" (in {type(self).__name__}'s config)")
        check_coefficients(config)
        coefficients, tuning = coefficients_table(config.coefficients_by_steps), tuning_table(config.tuning_by_steps)
        if config.coefficients_by_steps is not None:  # checked, as JSON gives it back: string NFEs, plain floats
            self.register_to_config(coefficients_by_steps=write_coefficients_table(coefficients))
        if config.tuning_by_steps is not None:
            self.register_to_config(tuning_by_steps=write_tuning_table(tuning))
        self._build_base()
        self.coefficients: UntiedCoefficients | None = None  # (η_R, η_T, η_O, α) of this run
        self.step_statistics = None  # μ_k, σ_k, δ̄_k of this NFE (when η_R > 0 or η_T > 0)
        self.rms: list[float] = []  # σ_k as floats, read once per run
        self.cosine_distances: list[float] = []  # δ̄_k as floats, read once per run
        self.basis: torch.Tensor | None = None  # Q (D, r); None when the transform is off (η_R = 0)
        self.rho_sq: torch.Tensor | None = None  # ρ² (r,), float64
        self.transform_strength = 0.0  # λ_R = λ_R^(0)·η_R
        self.mask: torch.Tensor | None = None  # (B, L) active positions of the correction
        self._plan: UntiedStepPlan | None = None  # the step's per-step tensors of this run
        self._kappas: list[float] = []  # κ_k as floats, read once per run
        self._compiled_step = None  # `torch.compile(untied_step_at)` after `compile_step()`
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
        self._buffers: dict[str, torch.Tensor] | None = None  # the eager step's (B, L, D) buffers, per run

    def resolve_coefficients(self, num_inference_steps: int) -> dict[str, float]:
        """(η_R, η_T, η_O, α) for `num_inference_steps`, by the rule of docs/algorithm.md §4.5: the config's alone
        (the statistics hold none)."""
        return resolve_coefficients(self.config, num_inference_steps)

    def _set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None,
        statistics: SamplerStatistics | None,
        mask: torch.Tensor | None,
        run_generator: torch.Generator | list[torch.Generator] | None = None,
        **base_kwargs,
    ) -> None:
        """
        The base solver's grid (`base_kwargs` go to the official `set_timesteps`), the statistics, a fresh state,
        then `start_run(run_generator)`. `run_generator` is the run's sampling generator; nothing is drawn from it
        here.
        """
        coefficients = UntiedCoefficients.of(self.resolve_coefficients(num_inference_steps))
        if statistics is not None and statistics.config.solver != self.family:
            raise ValueError(
                f"The sampler statistics are for the {statistics.config.solver!r} solver, this scheduler uses "
                f"{self.family!r}: they belong to another model family."
            )
        uses_statistics = coefficients.eta_r > 0 or coefficients.eta_t > 0
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
        self._setup_transform(statistics if coefficients.eta_r > 0 else None, device)
        self.mask = mask
        self._kappas = [self.solver.kappa(k) for k in range(self.solver.num_update_steps)]
        self._plan = self._plan_step(device)
        self._reset_state()
        self.start_run(run_generator)

    def start_run(self, run_generator: torch.Generator | list[torch.Generator] | None) -> None:
        """
        Called last by `set_timesteps`, once the run's numbers are prepared and the state is fresh, with the run's
        sampling generator (or list of them, or `None`). The paper's sampler has nothing to prepare; a subclass
        seeds its own draws from the generator's state here (drawing from it would change the official stream).
        """

    def switches(self) -> StepSwitches:
        """The step's ablation switches: the paper's sampler (a subclass reads them from its config)."""
        return StepSwitches()

    def _plan_step(self, device) -> UntiedStepPlan:
        """Every per-step number of this run for the step, as float64 tensors on `device` (once per run)."""
        coefficients, solver, switches = self.coefficients, self.solver, self.switches()
        steps = solver.num_update_steps
        eta_t, eta_o, alpha = coefficients.eta_t, coefficients.eta_o, coefficients.alpha
        table_dtype = torch.float32 if torch.device(device or "cpu").type == "mps" else torch.float64
        online = switches.online_distance and self.basis is not None
        correct = eta_t > 0
        sigmas = self.rms if self.rms else [0.0] * steps
        c = [eta_o * solver.delta_u(k) if correct else 0.0 for k in range(steps)]
        columns = StepScalars(
            one_plus_c=[1.0 + c_k for c_k in c],
            c=c,
            kappa=self._kappas,
            eta_sigma=[eta_t * sigma for sigma in sigmas],
            alpha=[alpha] * steps,
            gate=[float(sigma > 0) for sigma in sigmas],
        )
        scalars = StepScalars(
            *(torch.tensor(column, dtype=torch.float64).to(device=device, dtype=table_dtype) for column in columns)
        )
        mean = None
        if correct:
            mean = self.step_statistics.mean.detach().to(device=device, dtype=table_dtype)
        kind, ell, identity = None, None, [True] * steps
        rank = self.basis.shape[1] if self.basis is not None else 0
        if rank > 0:
            kind = "online" if online else choose_transform_kind(rank, self.basis.shape[0])
        if kind in ("matrix", "low_rank"):
            # â_{k+1} = κ_k(1 − δ̄_k) of the transform that ends step k (eq. (13)), formed from Python floats.
            a_hat = [self._kappas[k] * (1 - self.cosine_distances[k]) for k in range(steps)]
            ell = retention(
                self.rho_sq,
                torch.tensor(a_hat, dtype=torch.float64),
                self.transform_strength,
                self.config.eps_fp,
                switches.global_scaling,
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
            routing=switches.routing,
            transform_kind=kind,
            eps=self.config.degeneracy_eps,
            strength=self.transform_strength,
            eps_fp=self.config.eps_fp,
            global_scaling=switches.global_scaling,
        )
        return UntiedStepPlan(
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
        Runs the step compiled: `torch.compile(untied_step_at, **options)`, the same [`untied_step`] indexed by a
        step counter (`enable=False` goes back to the eager step). The compiled step reads its per-step numbers from per-run tables with a step counter
        kept on the device, so a run compiles one graph (again when the batch shape changes), not one per step; on
        a GPU it replaces the eager step's ~15-30 kernel launches per step by a few fused kernels. The first run
        pays the compilation (seconds to a minute). Returns the scheduler.
        """
        self._compiled_step = torch.compile(untied_step_at, **options) if enable else None
        return self

    def _setup_transform(self, statistics: SamplerStatistics | None, device) -> None:
        """Q, ρ² and λ_R = λ_R^(0)·η_R (eq. (34)); no transform when η_R = 0."""
        self.basis, self.rho_sq, self.transform_strength = None, None, 0.0
        if statistics is None:
            return
        self.basis = statistics.basis.to(device)
        # r numbers: ℓ of a shared â is a CPU job.
        self.rho_sq = self.transform_spectrum(statistics.rho_sq.detach().to("cpu", torch.float64))
        self.transform_strength = statistics.base_transform_exponent * self.coefficients.eta_r

    def transform_spectrum(self, rho_sq: torch.Tensor) -> torch.Tensor:
        """
        ρ² (r,), float64 on the CPU, as the SC transform assigns it to the basis' directions: the i-th value to the
        i-th column of Q, as calibrated (a subclass may reorder it: the lab's transform-assignment ablations).
        """
        return rho_sq

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
            solver_input, prev_sample = self.update_step(k, prediction, timestep, sample)
        finally:
            self._guidance = None
        self._step_index += 1
        if not return_dict:
            return (prev_sample, solver_input, self.self_conditioning)
        return LanguageFlowSchedulerOutput(prev_sample, solver_input, self.self_conditioning)

    def base_step(self, solver_input, prediction, timestep, sample) -> torch.Tensor:
        """The base solver's step on `solver_input`, with this step's guidance where the solver gets p_k itself."""
        guidance = self._guidance
        if guidance is None or solver_input is not prediction:
            return self.base.step(solver_input, timestep, sample).prev_sample
        return self.base.step(solver_input, timestep, sample, guidance=guidance).prev_sample

    def update_step(
        self, k: int, prediction: torch.Tensor, timestep: torch.Tensor | float, sample: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """
        Update step k with [`untied_step`]: (q_k, z_{k+1}). The state changes only once the base solver's step has
        succeeded. LangFlow's final evaluation (k = K_u) only reads out tokens: the base scheduler leaves the latent
        as it is, nothing is corrected. With η_R = η_T = 0 (and no online δ̄) q_k = p_k and m̃_{k+1} = p_k are
        the prediction itself, so the official step runs on the official tensors: bit for bit the official sampler.
        """
        if k >= self.solver.num_update_steps:
            return prediction, self.base_step(prediction, prediction, timestep, sample)
        plan = self._plan
        if plan.trivial:
            prev_sample = self.base_step(prediction, prediction, timestep, sample)
            self.advance(k, prediction, prediction, UntiedState(), None)
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
            output = untied_step(
                prediction,
                state,
                tensors.scalars[k],
                tensors.operators[k],
                options,
                active=plan.active[k],
                out=buffers,
            )
        else:
            if self._step_counter is None:  # made on the device: a host copy would wait for the network
                self._step_counter = torch.full((), k, dtype=torch.int64, device=prediction.device)
            output, counter = self._compiled_step(
                self._step_counter, prediction, state, tensors.tables, tensors.run_operators, options
            )
        prev_sample = self.base_step(output.solver_input, prediction, timestep, sample)
        if buffers is not None:  # E_k and O_k are spent: their tensors take E_{k+2} and O_{k+2}
            buffers["ema"], buffers["solver_average"] = state.ema, state.solver_average
        if counter is not None:
            self._step_counter = counter
        self.advance(k, output.raw_self_conditioning, output.self_conditioning, output.state, output.cosine_distance)
        return output.solver_input, prev_sample

    def advance(
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

    def _step_buffers(self, prediction: torch.Tensor, plan: UntiedStepPlan) -> dict[str, torch.Tensor]:
        """
        The eager step's buffers of this run ([`untied_step`]'s `out`), made at its first step: H_k's,
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
