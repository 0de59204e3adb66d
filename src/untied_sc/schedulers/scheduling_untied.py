"""UntiedSelfConditioningScheduler: the paper's Algorithm 1 on top of the official ELF or LangFlow solver."""

import json
from importlib import resources

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.schedulers.scheduling_utils import SchedulerMixin

from .outputs import LanguageFlowSchedulerOutput
from .sampler_statistics import COEFFICIENT_NAMES, SamplerStatistics, num_update_steps
from .scheduling_elf import DEFAULT_SDE_GAMMA, ELFScheduler
from .scheduling_langflow import LangFlowScheduler
from .untied_functions import (
    combined_direction,
    history_direction,
    moment_projection,
    overlap_transform,
    retention,
    solver_history_direction,
    token_cosine_distance,
)


BASE_SCHEDULERS = {"elf": ELFScheduler, "langflow": LangFlowScheduler}
CORRECTION_ROUTINGS = ("solver", "self_conditioning", "both")
TRANSFORM_ASSIGNMENTS = ("overlap", "reversed", "random")
COSINE_DISTANCE_SOURCES = ("precomputed", "online")


def paper_coefficients() -> dict[str, dict[str, dict[str, float]]]:
    """The paper's coefficient table (ELF-B/M/L, LangFlow OWT/LM1B), keyed by preset name and NFE."""
    text = resources.files("untied_sc").joinpath("data/coefficients.json").read_text()
    return {name: table for name, table in json.loads(text).items() if not name.startswith("_")}


class UntiedSelfConditioningScheduler(SchedulerMixin, ConfigMixin):
    r"""
    Untied self-conditioning (paper Algorithm 1): one network evaluation per step, with

    1. the self-conditioning transform m̃_k = F_k m_k, which dampens the self-conditioning input along the directions
       its input map shares with the latent's (eq. released_self_conditioning, released_retention);
    2. the solver correction A_k = η_T·Π_k(U_k) toward the step-average prediction, normalised to calibrated
       moments (eq. direction_estimates, combined_direction, released_solver_correction);
    3. untied routing (eq. untied_state_update): z_{k+1} = S_k(z_k, p_k + A_k), O_{k+1} = (1 − κ_k)O_k +
       κ_k(p_k + A_k), m_{k+1} = p_k, E_{k+1} = (1 − α)E_k + α p_k.

    The base solver (grid, re-noising, update S_k) is the official scheduler of the chosen family, used unchanged,
    so with η_R = η_T = 0 every latent and token equals the official sampler's bit for bit. Swap it in with
    `UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config)` and back with
    `ELFScheduler.from_config(pipe.scheduler.config)` (or `LangFlowScheduler`).

    Trajectory state (E, O, m, κ_{k−1}, δ̄_{k−1}, the step index) lives here and is reset by `set_timesteps`,
    which also takes the [`SamplerStatistics`] (Q, ρ², base scales, μ, σ, δ̄ per NFE).

    Coefficients for N steps, first match wins: the `eta_r`/`eta_t`/`eta_o`/`alpha` config values; the paper
    table entry named by `coefficients` (e.g. `"elf-b"`, `"langflow-owt"`); the statistics' own coefficients.

    Args:
        solver (`str`): `"elf"` or `"langflow"`; inferred from an official scheduler's config by `from_config`.
        noise_scale, p_mean, p_std, sde_gamma, sde_gamma_by_steps, t_eps, sc_cfg_scale: [`ELFScheduler`]'s config.
        quantile_eps: [`LangFlowScheduler`]'s config.
        eta_r (`float`, *optional*): η_R ≥ 0, strength of the SC transform (λ_R = λ_R^(0)·η_R).
        eta_t (`float`, *optional*): η_T ≥ 0, strength of the solver correction.
        eta_o (`float`, *optional*): η_O ≥ 0, weight of the disagreement term in U_k.
        alpha (`float`, *optional*): α ∈ (0, 1], EMA weight of the current prediction in E.
        coefficients (`str`, *optional*): name of a paper coefficient preset.
        eps_fp (`float`, defaults to 0.01): floor of b_{k,i} in the retention.
        degeneracy_eps (`float`, defaults to 1e-12): G_k = 0 unless ‖H‖, ‖p − O‖ > eps·‖p‖.
        correction_routing (`str`, defaults to `"solver"`): where A_k goes: `"solver"`, `"self_conditioning"` or
            `"both"` (paper Table 3a).
        transform_assignment (`str`, defaults to `"overlap"`): which direction gets which retention: `"overlap"`,
            `"reversed"`, or `"random"` with `transform_seed` (paper Tables 5-7).
        transform_seed (`int`, defaults to 0): seed of the `"random"` assignment.
        global_scaling (`bool`, defaults to `True`): keep the common factor g_k in the retention.
        cosine_distance (`str`, defaults to `"precomputed"`): δ̄ from the statistics, or `"online"` from this
            trajectory's own H and G (per sample).
    """

    order = 1

    @register_to_config
    def __init__(
        self,
        solver: str | None = None,
        noise_scale: float = 2.0,
        p_mean: float = -1.5,
        p_std: float = 0.8,
        sde_gamma: float | None = None,
        sde_gamma_by_steps: dict[str, float] | None = None,
        t_eps: float = 0.05,
        sc_cfg_scale: float = 3.0,
        quantile_eps: float = 1e-5,
        eta_r: float | None = None,
        eta_t: float | None = None,
        eta_o: float | None = None,
        alpha: float | None = None,
        coefficients: str | None = None,
        eps_fp: float = 0.01,
        degeneracy_eps: float = 1e-12,
        correction_routing: str = "solver",
        transform_assignment: str = "overlap",
        transform_seed: int = 0,
        global_scaling: bool = True,
        cosine_distance: str = "precomputed",
    ):
        if solver not in BASE_SCHEDULERS:
            raise ValueError(
                f"solver must be 'elf' or 'langflow', got {solver!r}. `from_config` infers it from an ELFScheduler or "
                "LangFlowScheduler config; otherwise pass it explicitly."
            )
        if sde_gamma_by_steps is None:
            self.register_to_config(sde_gamma_by_steps=dict(DEFAULT_SDE_GAMMA))
        for name, value, allowed in (
            ("correction_routing", correction_routing, CORRECTION_ROUTINGS),
            ("transform_assignment", transform_assignment, TRANSFORM_ASSIGNMENTS),
            ("cosine_distance", cosine_distance, COSINE_DISTANCE_SOURCES),
        ):
            if value not in allowed:
                raise ValueError(f"{name} must be one of {allowed}, got {value!r}.")
        if coefficients is not None and coefficients not in paper_coefficients():
            raise ValueError(
                f"Unknown coefficient preset {coefficients!r}; choose one of {sorted(paper_coefficients())}."
            )
        self._check_coefficients({"eta_r": eta_r, "eta_t": eta_t, "eta_o": eta_o, "alpha": alpha})
        base_cls = BASE_SCHEDULERS[solver]
        self.base = base_cls.from_config(
            {k: v for k, v in self.config.items() if k in base_cls._get_init_keys(base_cls)}
        )
        self.init_noise_sigma = self.base.init_noise_sigma
        self.timesteps: torch.Tensor | None = None
        self.num_inference_steps: int | None = None
        self.step_statistics = None
        self._reset_state()

    @classmethod
    def from_config(cls, config=None, return_unused_kwargs=False, **kwargs):
        """Like `ConfigMixin.from_config`, inferring `solver` from an official scheduler's config."""
        config = dict(config) if config is not None else {}
        if "solver" not in config and "solver" not in kwargs:
            # An official config carries only its own family's keys.
            if config.get("_class_name") == "ELFScheduler" or (
                "noise_scale" in config and "quantile_eps" not in config
            ):
                config["solver"] = "elf"
            elif config.get("_class_name") == "LangFlowScheduler" or (
                "quantile_eps" in config and "noise_scale" not in config
            ):
                config["solver"] = "langflow"
        return super().from_config(config, return_unused_kwargs=return_unused_kwargs, **kwargs)

    @staticmethod
    def _check_coefficients(values: dict[str, float | None]) -> None:
        for name in ("eta_r", "eta_t", "eta_o"):
            if values[name] is not None and not values[name] >= 0:
                raise ValueError(f"{name} must be ≥ 0, got {values[name]}.")
        if values["alpha"] is not None and not 0 < values["alpha"] <= 1:
            raise ValueError(f"alpha must lie in (0, 1], got {values['alpha']}.")

    def _reset_state(self) -> None:
        self._step_index = 0
        self.ema = None  # E_k
        self.solver_average = None  # O_k
        self.raw_self_conditioning = None  # m_k
        self.self_conditioning = None  # m̃_k = F_k m_k, the network's next input
        self.previous_kappa = 0.0  # κ_{k−1}
        self.previous_cosine_distance: float | torch.Tensor = 0.0  # δ̄_{k−1}
        self.mask = None

    @property
    def step_index(self) -> int:
        return self._step_index

    @property
    def solver(self):
        return self.base.solver

    def resolve_coefficients(self, num_inference_steps: int, statistics: SamplerStatistics | None) -> dict[str, float]:
        """(η_R, η_T, η_O, α) for `num_inference_steps`: config values, else the named preset, else the statistics."""
        config = self.config
        resolved = {name: config[name] for name in COEFFICIENT_NAMES}
        if config.coefficients is not None:
            table = paper_coefficients()[config.coefficients]
            if str(num_inference_steps) not in table:
                raise ValueError(
                    f"The {config.coefficients!r} preset has no coefficients for {num_inference_steps} steps (it has "
                    f"{sorted(int(k) for k in table)}); set eta_r/eta_t/eta_o/alpha explicitly."
                )
            fallback = table[str(num_inference_steps)]
        elif statistics is not None and any(resolved[name] is None for name in COEFFICIENT_NAMES):
            fallback = statistics.for_steps(num_inference_steps).coefficients  # names the calibrated NFEs if absent
        else:
            fallback = {}
        for name in COEFFICIENT_NAMES:
            if resolved[name] is None:
                if name not in fallback:
                    raise ValueError(
                        f"No value for {name} at {num_inference_steps} steps: set it in the scheduler config, name a "
                        f"paper preset with `coefficients=` ({sorted(paper_coefficients())}), or load sampler "
                        "statistics that carry tuned coefficients (`untied-sc tune`)."
                    )
                resolved[name] = float(fallback[name])
        self._check_coefficients(resolved)
        return resolved

    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        generator: torch.Generator | None = None,
        proposal: tuple[float, float, float] | None = None,
        statistics: SamplerStatistics | None = None,
        mask: torch.Tensor | None = None,
    ) -> None:
        """
        Sets up the base solver's grid, the statistics for this NFE, and resets the trajectory state.

        Args:
            num_inference_steps (`int`): the NFE (≥ 2).
            device (`str` or `torch.device`, *optional*): where `timesteps` and the statistics live.
            generator (`torch.Generator`, *optional*): ELF only: the sampling generator (see [`ELFScheduler`]).
            proposal (`tuple`, *optional*): LangFlow only: the model's (loc, scale, cutoff).
            statistics ([`SamplerStatistics`], *optional*): required unless η_R = η_T = 0.
            mask (`torch.Tensor` of shape `(batch, length)`, *optional*): active positions of the correction.
        """
        coefficients = self.resolve_coefficients(num_inference_steps, statistics)
        if statistics is not None and statistics.config.solver != self.config.solver:
            raise ValueError(
                f"The sampler statistics are for the {statistics.config.solver!r} solver, this scheduler uses "
                f"{self.config.solver!r}: they belong to another model family."
            )
        uses_statistics = coefficients["eta_r"] > 0 or coefficients["eta_t"] > 0
        if uses_statistics and statistics is None:
            raise ValueError(
                "Untied sampling with η_R > 0 or η_T > 0 needs the model's SamplerStatistics: pass "
                "`statistics=` (pipelines do this from their `sampler_statistics` component), or calibrate with "
                "`untied-sc calibrate`."
            )
        base_kwargs = {"generator": generator} if self.config.solver == "elf" else {"proposal": proposal}
        self.base.set_timesteps(num_inference_steps, device=device, **base_kwargs)
        self.timesteps, self.num_inference_steps = self.base.timesteps, num_inference_steps
        self.coefficients = coefficients
        self.step_statistics = statistics.for_steps(num_inference_steps) if uses_statistics else None
        self._setup_transform(statistics if coefficients["eta_r"] > 0 else None, device)
        self._reset_state()
        self.mask = mask

    def _setup_transform(self, statistics: SamplerStatistics | None, device) -> None:
        """Q, ρ² (permuted for the assignment ablations) and λ_R = λ_R^(0)·η_R; no transform when η_R = 0."""
        self.basis = self.rho_sq = None
        if statistics is None:
            return
        rho_sq = statistics.rho_sq.double()
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
        """m̃_k = F_k m_k with â_k = κ_{k−1}(1 − δ̄_{k−1}) (eq. dampening_gate); identity when η_R = 0."""
        if self.basis is None or self.basis.shape[1] == 0:
            return raw
        a_hat = self.previous_kappa * (1 - self.previous_cosine_distance)
        if isinstance(a_hat, torch.Tensor):  # online δ̄: one retention per sample
            return torch.cat([self._transform_one(raw[b : b + 1], a.item()) for b, a in enumerate(a_hat)])
        return self._transform_one(raw, a_hat)

    def _transform_one(self, raw: torch.Tensor, a_hat: float) -> torch.Tensor:
        ell = retention(self.rho_sq, a_hat, self.transform_strength, self.config.eps_fp, self.config.global_scaling)
        return overlap_transform(raw, self.basis, ell.to(raw.dtype))

    def scale_model_input(self, sample: torch.Tensor, timestep: torch.Tensor | float | None = None) -> torch.Tensor:
        """The base solver's network input (ELF re-noises here; LangFlow passes the latent through)."""
        return self.base.scale_model_input(sample, timestep)

    def _correction(self, k: int, prediction: torch.Tensor) -> torch.Tensor | None:
        """A_k = η_T·Π_k(U_k) (eq. released_solver_correction); also records δ̄_k when it is computed online."""
        online = self.config.cosine_distance == "online" and self.basis is not None
        if self.coefficients["eta_t"] == 0 and not online:
            return None
        stats = self.step_statistics
        rms = stats.rms[k].item()
        history = history_direction(prediction, self.ema, active=rms > 0)
        solver_direction = solver_history_direction(
            prediction, history, self.solver_average, self.mask, self.config.degeneracy_eps
        )
        if online:
            distance = token_cosine_distance(history, solver_direction, self.mask)
            active = self.mask.sum(dim=1).clamp(min=1) if self.mask is not None else distance.shape[1]
            self.step_cosine_distance = distance.sum(dim=1) / active
        if self.coefficients["eta_t"] == 0:
            return None
        direction = combined_direction(history, solver_direction, self.coefficients["eta_o"], self.solver.delta_u(k))
        mean = stats.mean[k].to(device=prediction.device, dtype=prediction.dtype)
        return self.coefficients["eta_t"] * moment_projection(direction, mean, rms, self.mask)

    def step(
        self,
        model_output: torch.Tensor,
        timestep: torch.Tensor | float,
        sample: torch.Tensor,
        return_dict: bool = True,
    ) -> LanguageFlowSchedulerOutput | tuple:
        """
        One step of Algorithm 1 with the raw clean prediction p_k of this evaluation.

        Args:
            model_output (`torch.Tensor`): p_k (ELF: x̂; LangFlow: softmax(logits)·E_norm).
            timestep (`torch.Tensor` or `float`): the current entry of `timesteps`.
            sample (`torch.Tensor`): the current latent z_k.
            return_dict (`bool`, defaults to `True`): return a [`LanguageFlowSchedulerOutput`] or a tuple.

        The output's `pred_original_sample` is the prediction handed to the solver (p_k + A_k under the default
        routing) and `self_conditioning` is m̃_{k+1}, the next network's self-conditioning input.
        """
        if self.num_inference_steps is None:
            raise RuntimeError("Call `set_timesteps` before sampling.")
        k = self._step_index
        prediction = model_output
        if k >= num_update_steps(self.config.solver, self.num_inference_steps):
            # LangFlow's final evaluation: the base scheduler leaves the latent as it is; nothing to correct.
            prev_sample = self.base.step(prediction, timestep, sample).prev_sample
            solver_input = prediction
        else:
            if self.ema is None:
                self.ema = torch.zeros_like(prediction)
                self.solver_average = torch.zeros_like(prediction)
            self.step_cosine_distance = None
            correction = self._correction(k, prediction)
            corrected = prediction if correction is None else prediction + correction
            routing = self.config.correction_routing
            solver_input = prediction if routing == "self_conditioning" else corrected
            next_raw = prediction if routing == "solver" else corrected
            prev_sample = self.base.step(solver_input, timestep, sample).prev_sample
            kappa, alpha = self.solver.kappa(k), self.coefficients["alpha"]
            self.solver_average = (1 - kappa) * self.solver_average + kappa * solver_input
            self.ema = (1 - alpha) * self.ema + alpha * prediction
            self.raw_self_conditioning = next_raw
            self.previous_kappa = kappa
            if self.step_cosine_distance is not None:
                self.previous_cosine_distance = self.step_cosine_distance
            elif self.step_statistics is not None:
                self.previous_cosine_distance = self.step_statistics.cosine_distance[k].item()
            self.self_conditioning = self._transform(next_raw)
        self._step_index += 1
        if not return_dict:
            return (prev_sample, solver_input, self.self_conditioning)
        return LanguageFlowSchedulerOutput(prev_sample, solver_input, self.self_conditioning)

    def __len__(self) -> int:
        return self.num_inference_steps or 0
