"""The denoising loop of the language flow pipelines, and the body of their `__call__` around it."""

import contextlib
from collections.abc import Callable
from typing import Any

import torch
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from tqdm.auto import tqdm

from ..schedulers.run_context import RunContext, start_run, step_kwargs
from .checks import check_finite_number
from .outputs import DenoisingOutput, DenoisingStep, LanguageFlowPipelineOutput


class DenoisingMixin:
    """
    The denoising loop of [`LanguageFlowPipeline`] ([`~DenoisingMixin.denoise`]) and the body of the pipelines'
    `__call__` (`_generate`), with the hooks a family overrides: `_run_context`, `_network_session`.
    """

    network_knobs: tuple[str, ...] = ()  # the family's per-call network knobs: the keyword arguments of its `_predict`

    def _run_context(self, context: RunContext) -> RunContext:
        """The run's context with the family's own inputs added (LangFlow: the model's proposal); none here."""
        return context

    def _network_session(self) -> contextlib.AbstractContextManager:
        """The context the denoising loop's network calls run in (LangFlow: E_norm normalised once); none here."""
        return contextlib.nullcontext()

    @property
    def num_timesteps(self) -> int:
        """Number of steps of the loop in progress or last run (diffusers' convention, for callbacks)."""
        return self._num_timesteps

    def _start_run(
        self, batch_size, num_inference_steps, generator, latents, scheduler, statistics, ace_statistics, mask=None
    ):
        """
        A denoising run's start: the call checked, the scheduler (`self.scheduler` unless given) checked and its
        `set_timesteps` called with the run's [`RunContext`]: the generator, the statistics (a scheduler that takes
        them checks them against the transformer), `mask` (the (B, L) positions the sampler generates) and the
        family's inputs (`_run_context`). Returns the checked batch size, NFE and generator, the scheduler, the
        device and the context, whose `random` owns the run's draws (leave the run with `with context.random:`, so
        that a draw ahead not taken goes back to the generator).
        """
        batch_size, num_inference_steps, generator = self._checked_call(
            batch_size, num_inference_steps, generator, latents
        )
        scheduler = self.scheduler if scheduler is None else scheduler
        self.check_scheduler(scheduler)
        device = self._execution_device
        context = RunContext.for_call(
            generator,
            statistics=statistics,
            ace_statistics=ace_statistics,
            mask=None if mask is None else mask.to(device),
            model=self.transformer,
        )
        context = self._run_context(context)
        start_run(scheduler, num_inference_steps, device, context)
        return batch_size, num_inference_steps, generator, scheduler, device, context

    def _run_timesteps(self, scheduler, max_steps: int | None):
        """The timesteps a run takes: the scheduler's, or its first `max_steps`; kept for `num_timesteps`."""
        timesteps = scheduler.timesteps
        if max_steps is not None:
            if not isinstance(max_steps, int) or not 1 <= max_steps <= len(timesteps):
                raise ValueError(f"max_steps must be an integer in [1, {len(timesteps)}], got {max_steps!r}.")
            timesteps = timesteps[:max_steps]
        self._num_timesteps = len(timesteps)
        return timesteps

    @torch.no_grad()
    def denoise(
        self,
        batch_size: int = 1,
        num_inference_steps: int = 32,
        generator: torch.Generator | None = None,
        latents: torch.Tensor | None = None,
        *,
        scheduler=None,
        statistics=None,
        ace_statistics=None,
        max_steps: int | None = None,
        step_callback: Callable[[DenoisingStep], dict[str, torch.Tensor] | None] | None = None,
        progress: bool = True,
        **network_kwargs,
    ) -> DenoisingOutput:
        r"""
        The denoising loop: from z_0 to the final latents, one network evaluation per step. For k = 0, 1, …:
        `model_input = scheduler.scale_model_input(z_k, t_k)`, the network on `(model_input, t_k,
        scheduler.self_conditioning)` gives the clean prediction p_k, and `z_{k+1} = scheduler.step(p_k, t_k, z_k)`.
        `__call__` runs it and then decodes; calibration runs it with its reference scheduler; nothing is decoded
        here.

        Args:
            batch_size (`int`, defaults to 1): number of trajectories.
            num_inference_steps (`int`, defaults to 32): NFE, the number of network evaluations (≥ 2).
            generator (`torch.Generator`, *optional*): every random draw comes from it (`None`: torch's global
                generator of the execution device, as diffusers). Draw order: the scheduler's `set_timesteps`, z_0,
                then the steps' draws. A CPU generator gives the official CPU stream bit for bit on any device (on a GPU, ELF's noise is drawn ahead while
                the network runs: same numbers); a CUDA generator draws everything on its GPU, a device stream that
                reproduces itself for a seed but not the CPU numbers (docs/algorithm.md §2.1).
            latents (`torch.Tensor` of shape `(batch_size, length, dim)`, *optional*): the initial latent z_0.
            scheduler (*optional*): the scheduler to run instead of `self.scheduler` (e.g. calibration's reference
                recurrence, or a clone for a concurrent call); it gets the same run context.
            statistics ([`SamplerStatistics`], *optional*): in the run's [`RunContext`]; a scheduler that takes them
                (the untied ones) checks first that they belong to the transformer. `__call__` passes the pipeline's
                `sampler_statistics`; `None` (default) hands none.
            ace_statistics ([`ACEStatistics`], *optional*): ACE's repetition direction, in the run's context for the
                schedulers that take it (ACE, HiGS + ACE), after the same check; `__call__` passes the pipeline's
                `ace_statistics`.
            max_steps (`int`, *optional*): run only the first `max_steps` timesteps (default: all of them;
                calibration skips LangFlow's final evaluation, which updates nothing).
            step_callback (`Callable`, *optional*): called after every step as `step_callback(step)` with a
                [`DenoisingStep`]; may return `{"latents": z}` to continue from z instead of `step.latents`.
            progress (`bool`, defaults to `True`): show the pipeline's progress bar.
            network_kwargs: the family's per-call network knobs, passed to every network call (ELF:
                `sc_cfg_scale`; LangFlow: `temperature`; see the pipeline's `__call__`). Omitted: their defaults.

        Returns:
            [`DenoisingOutput`]: the final latents and the last evaluation's logits.
        """
        unknown = sorted(set(network_kwargs) - set(self.network_knobs))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.denoise got unknown network arguments {unknown}; this family takes "
                f"{list(self.network_knobs)}."
            )
        for name, value in network_kwargs.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                check_finite_number(name, value, "a network knob of every step")
        batch_size, num_inference_steps, generator, scheduler, device, context = self._start_run(
            batch_size, num_inference_steps, generator, latents, scheduler, statistics, ace_statistics
        )
        extra_step_kwargs = step_kwargs(scheduler, generator)
        latents = self.prepare_latents(batch_size, generator, latents, device, scheduler)
        timesteps = self._run_timesteps(scheduler, max_steps)

        logits = None
        with (
            self._progress_bar(len(timesteps), progress) as progress_bar,
            context.random or contextlib.nullcontext(),  # the run's end: a draw ahead not taken goes back
            self._network_session(),
        ):
            for i, t in enumerate(timesteps):
                # Stock flow-matching schedulers have no `scale_model_input`; ELF's re-noises here.
                scale = getattr(scheduler, "scale_model_input", None)
                model_input = scale(latents, t) if scale is not None else latents
                self_conditioning = getattr(scheduler, "self_conditioning", None)
                prediction, logits = self._predict(model_input, t, self_conditioning, **network_kwargs)
                sample, latents = latents, scheduler.step(prediction, t, latents, **extra_step_kwargs).prev_sample
                if step_callback is not None:
                    step = DenoisingStep(i, t, sample, model_input, self_conditioning, prediction, logits, latents)
                    latents = (step_callback(step) or {}).get("latents", latents)
                progress_bar.update()
        return DenoisingOutput(latents=latents, logits=logits)

    def _progress_bar(self, total: int, show: bool):
        """The pipeline's progress bar, or a silent one."""
        return self.progress_bar(total=total) if show else tqdm(total=total, disable=True)

    def _generate(
        self,
        batch_size: int,
        num_inference_steps: int,
        generator: torch.Generator | None,
        latents: torch.Tensor | None,
        output_type: str,
        return_dict: bool,
        callback_on_step_end,
        callback_on_step_end_tensor_inputs: list[str] | None,
        network_kwargs: dict[str, Any],
        decode_kwargs: dict[str, Any],
    ) -> LanguageFlowPipelineOutput | tuple:
        """
        The body of the pipelines' `__call__`: [`denoise`] with the pipeline's scheduler and statistics, diffusers'
        `callback_on_step_end`, then the decode (`_tokens` with `decode_kwargs`) and the output.
        """
        if isinstance(callback_on_step_end, PipelineCallback | MultiPipelineCallbacks):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        tensor_inputs = callback_on_step_end_tensor_inputs or ["latents"]
        self.check_output(output_type, tensor_inputs)  # the run's own inputs are checked by `denoise`, once
        generator = self._call_generator(generator)

        step_callback = None
        if callback_on_step_end is not None:

            def step_callback(step: DenoisingStep) -> dict[str, torch.Tensor] | None:
                tensors = {name: getattr(step, name) for name in tensor_inputs}
                return callback_on_step_end(self, step.index, step.timestep, tensors)

        denoised = self.denoise(
            batch_size,
            num_inference_steps,
            generator,
            latents,
            statistics=self.sampler_statistics,
            ace_statistics=getattr(self, "ace_statistics", None),
            step_callback=step_callback,
            **network_kwargs,
        )
        texts = sequences = None
        if output_type != "latent":
            sequences = self._tokens(denoised.latents, denoised.logits, generator, **decode_kwargs)
            texts = self._texts(sequences) if output_type == "text" else None
        self.maybe_free_model_hooks()
        output = LanguageFlowPipelineOutput(texts=texts, sequences=sequences, latents=denoised.latents)
        return output if return_dict else output.to_tuple()
