"""What one sampling run hands its scheduler: [`RunContext`], built once per pipeline call.

A pipeline call builds one context (the generator, the statistics, LangFlow's proposal, the generated positions) and
hands it to the scheduler as `set_timesteps(N, device=..., context=...)`; every scheduler of this package takes it so
([`TakesRunContext`]) and reads the fields it uses. A stock diffusers scheduler gets diffusers' own call,
`set_timesteps(N, device=...)` ([`start_run`]), and its `step` the generator where it takes one ([`step_kwargs`]).
A direct call may give the same inputs as keyword arguments
(`set_timesteps(N, generator=g)`, diffusers' style); without a context every field has its default.
"""

import inspect
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import torch

from .noise import RunRandom


if TYPE_CHECKING:  # types only: the statistics modules need not load with every scheduler
    from .flowmap_statistics import FlowMapStatistics
    from .sampler_statistics import SamplerStatistics


@dataclass(frozen=True)
class RunContext:
    r"""
    The inputs of one sampling run that a scheduler's `set_timesteps` takes besides the NFE and the device.

    Args:
        generator (`torch.Generator`, *optional*): the run's sampling generator (see [`ELFScheduler.set_timesteps`];
            `None`: torch's global generator of the device).
        grid_generator (`torch.Generator`, *optional*): ELF's grid generator, for a run whose official grid stream
            is not the generator's start (the conditional generation, [`ELFText2TextPipeline`]).
        statistics ([`SamplerStatistics`], *optional*): the untied sampler's statistics.
        ace_statistics ([`ACEStatistics`], *optional*): ACE's repetition direction (the ACE schedulers).
        flowmap_statistics ([`FlowMapStatistics`], *optional*): the untied flow-map sampler's statistics
            ([`UntiedFlowMapLMScheduler`]); a field of their own, as ACE's, since they are another model's record
            than `statistics` and no scheduler reads both.
        proposal (`tuple[float, float, float]`, *optional*): LangFlow's Gumbel proposal (loc, scale, cutoff) of the
            model ([`LangFlowTransformerModel.gumbel_parameters`]).
        mask (`torch.Tensor` of shape `(batch, length)`, *optional*): the positions the sampler generates (the
            untied correction acts on them only; a conditional run holds the source at the others).
        model (`torch.nn.Module`, *optional*): the network the run samples; a scheduler that takes the statistics
            checks them against it ([`~RunContext.checked_statistics`]).
        random ([`RunRandom`], *optional*): the run's draws from `generator`, owned by the run: a scheduler's noise
            stream belongs to it, so that the run's end gives a draw ahead not taken back to the generator (default:
            the scheduler owns its stream).
    """

    generator: torch.Generator | list[torch.Generator] | None = None
    grid_generator: torch.Generator | None = None
    statistics: "SamplerStatistics | None" = None
    ace_statistics: Any = None  # an `ACEStatistics` (calibration, a floor above the schedulers)
    flowmap_statistics: "FlowMapStatistics | None" = None
    proposal: tuple[float, float, float] | None = None
    mask: torch.Tensor | None = None
    model: torch.nn.Module | None = None
    random: RunRandom | None = None

    @classmethod
    def for_call(cls, generator: torch.Generator | list[torch.Generator] | None, **inputs) -> "RunContext":
        """A pipeline call's context: `generator`, the run's draws from it ([`RunRandom`]; none for a generator list,
        whose draws are diffusers') and the other fields in `inputs`."""
        random = RunRandom(generator) if isinstance(generator, torch.Generator) else None
        return cls(generator=generator, random=random, **inputs)

    def given(self, **inputs) -> "RunContext":
        """This context with the keyword arguments of a direct `set_timesteps` call that are not `None` in place."""
        chosen = {name: value for name, value in inputs.items() if value is not None}
        return replace(self, **chosen) if chosen else self

    def random_for(self, generator: torch.Generator) -> RunRandom:
        """The run's draws from `generator`: `random` when it draws from that generator, else a run of its own."""
        if self.random is not None and self.random.generator is generator:
            return self.random
        return RunRandom(generator)

    def _checked(self, statistics):
        """`statistics`, after a check that they belong to `model` (when both are given)."""
        if statistics is not None and self.model is not None:
            statistics.check_model(self.model)
        return statistics

    def checked_statistics(self) -> "SamplerStatistics | None":
        """`statistics`, after a check that they belong to `model` (when both are given)."""
        return self._checked(self.statistics)

    def checked_ace_statistics(self):
        """`ace_statistics`, after a check that they belong to `model` (when both are given)."""
        return self._checked(self.ace_statistics)

    def checked_flowmap_statistics(self) -> "FlowMapStatistics | None":
        """`flowmap_statistics`, after a check that they belong to `model` (when both are given)."""
        return self._checked(self.flowmap_statistics)


def run_context(context: RunContext | None, **inputs) -> RunContext:
    """The context a `set_timesteps` call runs with: `context` (default: all fields unset) with the call's keyword
    arguments that are not `None` in place."""
    return (RunContext() if context is None else context).given(**inputs)


class TakesRunContext:
    """A scheduler whose `set_timesteps` takes `context=` ([`RunContext`]): every scheduler of this package."""


def start_run(scheduler, num_inference_steps: int, device, context: RunContext) -> None:
    """A run's `set_timesteps`: with `context` for a scheduler of this package, diffusers' call for a stock one."""
    if isinstance(scheduler, TakesRunContext):
        scheduler.set_timesteps(num_inference_steps, device=device, context=context)
    else:
        scheduler.set_timesteps(num_inference_steps, device=device)


def step_kwargs(scheduler, generator) -> dict[str, Any]:
    """
    The extra arguments of each `scheduler.step` of a run: none for a scheduler of this package (its draws come from
    the run's context); `generator` for a stock diffusers scheduler whose `step` takes one. A stock class declares
    nothing, so its signature says (as diffusers' own pipelines read it, `prepare_extra_step_kwargs`).
    """
    if isinstance(scheduler, TakesRunContext):
        return {}
    return {"generator": generator} if "generator" in inspect.signature(scheduler.step).parameters else {}
