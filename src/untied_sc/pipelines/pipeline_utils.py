"""What ELFPipeline and LangFlowPipeline share: Hub loading, input checks, the sampling loop and the output."""

import inspect
import os
from dataclasses import dataclass
from typing import Any

import torch
from diffusers import DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import randn_tensor

from ..hub import HUB_KWARGS, resolve_local
from ..schedulers.sampler_statistics import CALIBRATION_SEED


OUTPUT_TYPES = ("text", "seq", "latent")


@dataclass
class LanguageFlowPipelineOutput(BaseOutput):
    """
    Output of [`ELFPipeline`] and [`LangFlowPipeline`].

    Args:
        texts (`list[str]`, *optional*): decoded samples (`output_type="text"`).
        sequences (`torch.LongTensor` of shape `(batch, length)`, *optional*): token ids (`"text"` and `"seq"`).
        latents (`torch.Tensor` of shape `(batch, length, dim)`): the final latents.
    """

    texts: list[str] | None = None
    sequences: torch.LongTensor | None = None
    latents: torch.Tensor | None = None


def _accepted_kwargs(function, candidates: dict[str, Any]) -> dict[str, Any]:
    """The subset of `candidates` that `function` takes, so that stock diffusers schedulers can be swapped in."""
    parameters = inspect.signature(function).parameters
    return {name: value for name, value in candidates.items() if name in parameters}


class LanguageFlowPipeline(DiffusionPipeline):
    """
    Base class of the language flow pipelines. Subclasses define how the network is called (`_predict`) and how
    the final latents become token ids (`_tokens`).

    The self-conditioning state lives in the scheduler (`scheduler.self_conditioning`, reset by `set_timesteps`).
    A scheduler without that attribute (a stock diffusers one) still runs, without self-conditioning.
    """

    model_cpu_offload_seq = "transformer"
    _optional_components = ["sampler_statistics"]
    _callback_tensor_inputs = ["latents", "prediction"]

    def __init__(self, transformer, scheduler, tokenizer, sampler_statistics=None):
        super().__init__()
        self.register_modules(
            transformer=transformer, scheduler=scheduler, tokenizer=tokenizer, sampler_statistics=sampler_statistics
        )
        vocab_size = transformer.config.vocab_size
        if vocab_size not in (len(tokenizer), tokenizer.vocab_size):
            raise ValueError(
                f"The tokenizer has {len(tokenizer)} tokens but the transformer predicts {vocab_size}: they come "
                "from different models. Load the tokenizer that the model was trained with."
            )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs):
        """
        Loads a pipeline from a local folder or a Hub repo id.

        A repo id is downloaded with `huggingface_hub.snapshot_download` (honouring `HF_HUB_OFFLINE`, `cache_dir`,
        `revision`, `token`) and then loaded locally: stock diffusers cannot load third-party components by repo
        id. Other keyword arguments (`torch_dtype`, `device_map`, component overrides) go to diffusers.
        """
        hub_kwargs = {key: kwargs.pop(key) for key in HUB_KWARGS if key in kwargs}
        folder = resolve_local(pretrained_model_name_or_path, **hub_kwargs)
        return super().from_pretrained(folder, **kwargs)

    @property
    def latent_shape(self) -> tuple[int, int]:
        """(length, dim) of one latent sequence."""
        raise NotImplementedError

    def _predict(self, model_input: torch.Tensor, timestep: torch.Tensor, self_conditioning: torch.Tensor | None):
        """One network evaluation → (clean prediction for the scheduler, logits or None)."""
        raise NotImplementedError

    def _tokens(
        self, latents: torch.Tensor, last_logits: torch.Tensor | None, generator: torch.Generator
    ) -> torch.LongTensor:
        """Final token ids (`generator`: the call's, for a decoder that samples)."""
        raise NotImplementedError

    def _texts(self, sequences: torch.LongTensor) -> list[str]:
        raise NotImplementedError

    def _set_timesteps_kwargs(self, generator: torch.Generator) -> dict[str, Any]:
        """Extra arguments for the scheduler's `set_timesteps` (passed only where it accepts them)."""
        return {"generator": generator, "statistics": self.sampler_statistics}

    def check_inputs(self, batch_size, num_inference_steps, latents, output_type, callback_tensor_inputs):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        if not isinstance(num_inference_steps, int) or num_inference_steps < 2:
            raise ValueError(f"num_inference_steps must be an integer ≥ 2, got {num_inference_steps!r}.")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        expected = (batch_size, *self.latent_shape)
        if latents is not None and tuple(latents.shape) != expected:
            raise ValueError(f"latents have shape {tuple(latents.shape)}, expected {expected} (batch, length, dim).")
        unknown = [name for name in callback_tensor_inputs if name not in self._callback_tensor_inputs]
        if unknown:
            raise ValueError(f"Unknown callback tensor inputs {unknown}; choose from {self._callback_tensor_inputs}.")

    def prepare_latents(self, batch_size, generator, latents, device) -> torch.Tensor:
        """z_0 = init_noise_sigma·ε drawn from `generator` (float32: the solvers run in float32/float64)."""
        if latents is not None:
            return latents.to(device=device, dtype=torch.float32)
        shape = (batch_size, *self.latent_shape)
        noise = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
        return noise * getattr(self.scheduler, "init_noise_sigma", 1.0)

    def calibrate(
        self, nfe: list[int], bank_size: int = 64, seed: int = CALIBRATION_SEED, batch_size: int = 16, **kwargs
    ) -> "CalibrationResult":  # noqa: F821
        """
        Computes (or extends) this pipeline's `sampler_statistics` for the NFEs in `nfe`; see
        [`~untied_sc.calibration.calibrate_pipeline`] for the arguments. Returns the calibration result (statistics
        and a per-NFE summary).
        """
        from ..calibration import calibrate_pipeline

        result = calibrate_pipeline(self, nfe, bank_size=bank_size, seed=seed, batch_size=batch_size, **kwargs)
        self.register_modules(sampler_statistics=result.statistics)
        return result

    @property
    def num_timesteps(self) -> int:
        return self._num_timesteps

    @torch.no_grad()
    def __call__(
        self,
        batch_size: int = 1,
        num_inference_steps: int = 32,
        generator: torch.Generator | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "text",
        return_dict: bool = True,
        callback_on_step_end=None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
    ) -> LanguageFlowPipelineOutput | tuple:
        r"""
        Samples `batch_size` sequences with `num_inference_steps` network evaluations.

        Args:
            batch_size (`int`, defaults to 1): number of samples.
            num_inference_steps (`int`, defaults to 32): NFE, the number of network evaluations (≥ 2).
            generator (`torch.Generator`, *optional*): a CPU generator; every random draw comes from it (`None`:
                a freshly seeded one).
            latents (`torch.Tensor` of shape `(batch_size, length, dim)`, *optional*): the initial latent z_0.
            output_type (`str`, defaults to `"text"`): `"text"` (texts and token ids), `"seq"` (token ids) or
                `"latent"` (final latents only; no decoding).
            return_dict (`bool`, defaults to `True`): return a [`LanguageFlowPipelineOutput`] or a tuple.
            callback_on_step_end (`Callable`, `PipelineCallback` or `MultiPipelineCallbacks`, *optional*): called
                after every step as `callback(pipe, step_index, timestep, callback_kwargs)`; may return new tensors.
            callback_on_step_end_tensor_inputs (`list[str]`, defaults to `["latents"]`): tensors passed to it.
        """
        if isinstance(callback_on_step_end, PipelineCallback | MultiPipelineCallbacks):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        callback_on_step_end_tensor_inputs = callback_on_step_end_tensor_inputs or ["latents"]
        self.check_inputs(batch_size, num_inference_steps, latents, output_type, callback_on_step_end_tensor_inputs)
        device = self._execution_device
        if generator is None:
            generator = torch.Generator()
            generator.seed()

        scheduler = self.scheduler
        timestep_kwargs = _accepted_kwargs(scheduler.set_timesteps, self._set_timesteps_kwargs(generator))
        if timestep_kwargs.get("statistics") is not None:
            timestep_kwargs["statistics"].check_model(self.transformer)
        scheduler.set_timesteps(num_inference_steps, device=device, **timestep_kwargs)
        step_kwargs = _accepted_kwargs(scheduler.step, {"generator": generator})
        latents = self.prepare_latents(batch_size, generator, latents, device)
        timesteps = scheduler.timesteps
        self._num_timesteps = len(timesteps)

        logits = None
        with self.progress_bar(total=len(timesteps)) as progress_bar:
            for i, t in enumerate(timesteps):
                # Stock flow-matching schedulers have no `scale_model_input`; ELF's re-noises here.
                scale = getattr(scheduler, "scale_model_input", None)
                model_input = scale(latents, t) if scale is not None else latents
                self_conditioning = getattr(scheduler, "self_conditioning", None)
                prediction, logits = self._predict(model_input, t, self_conditioning)
                latents = scheduler.step(prediction, t, latents, **step_kwargs).prev_sample
                if callback_on_step_end is not None:
                    callback_kwargs = {}
                    for name in callback_on_step_end_tensor_inputs:
                        callback_kwargs[name] = locals()[name]
                    callback_outputs = callback_on_step_end(self, i, t, callback_kwargs)
                    latents = callback_outputs.pop("latents", latents)
                progress_bar.update()

        texts = sequences = None
        if output_type != "latent":
            sequences = self._tokens(latents, logits, generator)
            texts = self._texts(sequences) if output_type == "text" else None
        self.maybe_free_model_hooks()
        output = LanguageFlowPipelineOutput(texts=texts, sequences=sequences, latents=latents)
        return output if return_dict else output.to_tuple()
