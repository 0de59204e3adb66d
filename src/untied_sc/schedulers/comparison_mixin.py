"""What the comparison samplers share: the official base solver, the routing of a modified prediction, the families.

A comparison sampler (Momentum, HiGS, ACE, HiGS + ACE, DPM-Solver++(2M); docs/algorithm.md §9) wraps the family's
official scheduler exactly as the untied scheduler does: the same grid, the same random stream (ELF's re-noising is
the official scheduler's own), one network evaluation per step. It changes only what the official scheduler is given:
the prediction handed to the solver, the next self-conditioning input, or both (its routing key).
"""

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..sampling_methods import ROUTINGS
from .baseline_functions import elf_log_snr, langflow_log_snr
from .comparison_names import ELF_COMPARISON_SCHEDULERS, LANGFLOW_COMPARISON_SCHEDULERS
from .contract import OfficialBaseMixin
from .outputs import LanguageFlowSchedulerOutput
from .run_context import RunContext, run_context
from .scheduling_elf import ELF_CONFIG_RANGES, ELFScheduler
from .scheduling_langflow import LANGFLOW_CONFIG_RANGES, LangFlowScheduler


def route(routing: str, solver_input: torch.Tensor, self_conditioning: torch.Tensor, modify):
    """
    `(solver_input, self_conditioning)` with `modify` applied to the pathways `routing` names: `"solver"` (the
    prediction handed to the solver), `"self_conditioning"` (the next self-conditioning input) or `"both"`.
    """
    if routing not in ROUTINGS:
        raise ValueError(f"A routing must be one of {ROUTINGS}, got {routing!r}.")
    if routing != "self_conditioning":
        solver_input = modify(solver_input)
    if routing != "solver":
        self_conditioning = modify(self_conditioning)
    return solver_input, self_conditioning


def check_routing(name: str, value: str) -> None:
    if value not in ROUTINGS:
        raise ValueError(f"{name} must be one of {ROUTINGS}, got {value!r}.")


@dataclass(frozen=True)
class MethodStep:
    """
    What a comparison method sees of update step k: k, the raw clean prediction p_k, and the family's log-SNRs
    (read only by the methods that need them).
    """

    index: int
    prediction: torch.Tensor
    family_log_snrs: Callable[[int], tuple[float, float]]

    def log_snrs(self) -> tuple[float, float]:
        """(λ at the time step k's network saw, λ at its target)."""
        return self.family_log_snrs(self.index)


class ComparisonMethod:
    r"""
    One comparison method (Momentum, HiGS, ACE, DPM-Solver++(2M)) as an object. Built from its scheduler's config by
    `from_config` (its constructor checks its settings), it holds its own trajectory state (`reset` clears it for a
    new run) and changes the pathways of each update step: `pathways(step, q, m)` returns the prediction handed to
    the solver and the next self-conditioning input. At zero strength it returns `(q, m)` themselves.
    """

    @classmethod
    def from_config(cls, config) -> "ComparisonMethod":
        raise NotImplementedError

    def reset(self) -> None:
        """Forgets the trajectory (a new run); methods without trajectory state keep nothing."""

    def pathways(
        self, step: MethodStep, solver_input: torch.Tensor, self_conditioning: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        raise NotImplementedError


class ComparisonSamplerMixin(OfficialBaseMixin):
    r"""
    A comparison sampler on an official solver. At update step k, with the raw clean prediction p_k:

        (q_k, m_{k+1}) = the method's pathways of p_k      (q_k = m_{k+1} = p_k at zero strength)
        z_{k+1} = S_k(z_k, q_k)                             (the official scheduler's step, unchanged)

    and the network's next self-conditioning input is m_{k+1}. LangFlow's final evaluation only reads out tokens:
    nothing is modified there.

    A concrete scheduler lists its methods' classes in `method_classes` (each a [`ComparisonMethod`], in the order
    they apply) and mixes in a family mixin ([`ELFComparisonMixin`] or [`LangFlowComparisonMixin`]), this mixin, then
    `CompatibleSchedulerMixin, SchedulerMixin, ConfigMixin`. Its `__init__` declares the family's official keys and
    the method keys and calls `_init_comparison()`, which builds the methods from the config (`self.methods`).
    """

    family: str
    base_scheduler_class: type
    method_classes: tuple[type[ComparisonMethod], ...] = ()
    order = 1

    def _init_comparison(self) -> None:
        """Builds the methods (checking their keys) and the official base scheduler from the config."""
        self.methods = tuple(method.from_config(self.config) for method in self.method_classes)
        self._build_base()
        self._reset_state()

    def _reset_state(self) -> None:
        self._step_index = 0
        self.self_conditioning: torch.Tensor | None = None
        for method in self.methods:
            method.reset()

    def _set_timesteps(self, num_inference_steps: int, device, **base_kwargs) -> None:
        """The official grid (`base_kwargs` go to the official `set_timesteps`) and a fresh trajectory state."""
        self.base.set_timesteps(num_inference_steps, device=device, **base_kwargs)
        self.timesteps, self.num_inference_steps = self.base.timesteps, num_inference_steps
        self._reset_state()

    def step(
        self,
        model_output: torch.Tensor,
        timestep: torch.Tensor | float,
        sample: torch.Tensor,
        return_dict: bool = True,
    ) -> LanguageFlowSchedulerOutput | tuple:
        """
        One step with the raw clean prediction p_k of this evaluation.

        Args:
            model_output (`torch.Tensor`): p_k (ELF: x̂; LangFlow: softmax(logits)·E_norm).
            timestep (`torch.Tensor` or `float`): the current entry of `timesteps`, `timesteps[step_index]` (checked).
            sample (`torch.Tensor`): the current latent z_k.
            return_dict (`bool`, defaults to `True`): return a [`LanguageFlowSchedulerOutput`] or a tuple.

        The output's `pred_original_sample` is the prediction handed to the solver, q_k, and `self_conditioning`
        is m_{k+1}, the next network's self-conditioning input.
        """
        self._check_step(timestep)
        k, prediction = self._step_index, model_output
        solver_input = next_self_conditioning = prediction
        if k < self.solver.num_update_steps:  # not LangFlow's final evaluation, which updates nothing
            step = MethodStep(k, prediction, self.log_snrs)
            for method in self.methods:
                solver_input, next_self_conditioning = method.pathways(step, solver_input, next_self_conditioning)
        prev_sample = self.base.step(solver_input, timestep, sample).prev_sample
        self.self_conditioning = next_self_conditioning
        self._step_index += 1
        if not return_dict:
            return (prev_sample, solver_input, next_self_conditioning)
        return LanguageFlowSchedulerOutput(prev_sample, solver_input, next_self_conditioning)


class ELFComparisonMixin:
    """The ELF side of a comparison sampler: the official [`ELFScheduler`] as base, ELF's log-SNR."""

    family = "elf"
    base_scheduler_class = ELFScheduler
    _compatibles = ["ELFScheduler", "UntiedELFScheduler", *ELF_COMPARISON_SCHEDULERS]
    _config_ranges = ELF_CONFIG_RANGES

    def log_snrs(self, k: int) -> tuple[float, float]:
        """(λ at the evaluation of step k, λ at its target): λ(s_k) and λ(t_{k+1}) of ELF's interpolant."""
        noise_scale = self.config.noise_scale
        return elf_log_snr(self.solver.eval_time(k), noise_scale), elf_log_snr(self.solver.grid[k + 1], noise_scale)

    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        generator: torch.Generator | None = None,
        *,
        context: RunContext | None = None,
    ) -> None:
        """
        Draws the official ELF grid and resets the trajectory state.

        Args:
            num_inference_steps (`int`): the NFE (≥ 2).
            device (`str` or `torch.device`, *optional*): where `timesteps` lives.
            generator (`torch.Generator`, *optional*): the sampling generator (see [`ELFScheduler.set_timesteps`]).
            context ([`RunContext`], *optional*): the run's inputs (pipelines pass it); its fields stand for the
                arguments not given.
        """
        run = run_context(context, generator=generator)
        self._set_timesteps(
            num_inference_steps,
            device,
            context=RunContext(generator=run.generator, grid_generator=run.grid_generator, random=run.random),
        )


class LangFlowComparisonMixin:
    """The LangFlow side of a comparison sampler: the official [`LangFlowScheduler`] as base, LangFlow's log-SNR."""

    family = "langflow"
    base_scheduler_class = LangFlowScheduler
    _compatibles = ["LangFlowScheduler", "UntiedLangFlowScheduler", *LANGFLOW_COMPARISON_SCHEDULERS]
    _config_ranges = LANGFLOW_CONFIG_RANGES

    def log_snrs(self, k: int) -> tuple[float, float]:
        """(λ at the evaluation of step k, λ at its target): −γ_k/2 and −γ_{k+1}/2."""
        gammas = self.solver.gammas
        return langflow_log_snr(gammas[k].item()), langflow_log_snr(gammas[k + 1].item())

    def set_timesteps(
        self,
        num_inference_steps: int,
        device: str | torch.device | None = None,
        proposal: tuple[float, float, float] | None = None,
        *,
        context: RunContext | None = None,
    ) -> None:
        """
        Builds the official LangFlow γ grid and resets the trajectory state.

        Args:
            num_inference_steps (`int`): the NFE (≥ 2).
            device (`str` or `torch.device`, *optional*): where `timesteps` lives.
            proposal (`tuple`, *optional*): the model's (loc, scale, cutoff); `None` uses the config's `proposal`
                (see [`LangFlowScheduler.set_timesteps`]).
            context ([`RunContext`], *optional*): the run's inputs (pipelines pass it); its fields stand for the
                arguments not given.
        """
        run = run_context(context, proposal=proposal)
        self._set_timesteps(num_inference_steps, device, proposal=run.proposal)
