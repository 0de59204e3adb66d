"""LanguageFlowPipeline, the base of ELFPipeline and LangFlowPipeline: components, input checks, z_0 and calibration;
loading, saving, the network and the denoising loop come from their own modules."""

import torch
from diffusers import DiffusionPipeline
from diffusers.utils.torch_utils import randn_tensor

from .. import schedulers
from ..calibration import apply_calibration, calibrate_pipeline
from ..hardware import check_device
from ..per_nfe import check_steps
from ..schedulers.coefficients import entropy_matched_setting
from ..schedulers.noise import draw_normal, global_generator
from ..schedulers.sampler_statistics import CALIBRATION_SEED
from ..schedulers.scheduling_untied import UntiedSelfConditioningScheduler
from .checks import OUTPUT_TYPES, as_int, check_finite_latents, check_generator_input
from .denoising import DenoisingMixin
from .network import NetworkMixin
from .pretrained import PretrainedMixin
from .saving import SavingMixin


class LanguageFlowPipeline(PretrainedMixin, SavingMixin, NetworkMixin, DenoisingMixin, DiffusionPipeline):
    """
    Base class of the language flow pipelines. [`~LanguageFlowPipeline.denoise`] is the one denoising loop: the
    pipelines' `__call__`, calibration and the benchmark all run it. Subclasses define how the network is called
    (`_predict`, whose keyword arguments are the family's per-call network knobs) and how the final latents become
    token ids (`_tokens`); per-call knobs are passed down as arguments, never stored on the pipeline.

    The self-conditioning state lives in the scheduler (`scheduler.self_conditioning`, reset by `set_timesteps`).
    A scheduler without that attribute (a stock diffusers one) still runs, without self-conditioning.
    """

    family: str  # "elf" or "langflow", as the transformer's `family`
    _skip_special_tokens: bool  # whether `texts` drop the tokenizer's special tokens (the family's text protocol)

    model_cpu_offload_seq = "transformer"
    _optional_components = ["sampler_statistics", "ace_statistics"]
    _callback_tensor_inputs = ["latents", "prediction"]

    def __init__(self, transformer, scheduler, tokenizer, sampler_statistics=None, ace_statistics=None):
        super().__init__()
        self.register_modules(
            transformer=transformer,
            scheduler=scheduler,
            tokenizer=tokenizer,
            sampler_statistics=sampler_statistics,
            ace_statistics=ace_statistics,
        )
        if getattr(transformer, "family", None) != self.family:
            raise ValueError(
                f"{type(self).__name__} samples {self.family!r} models, but the transformer is a "
                f"{type(transformer).__name__} (family {getattr(transformer, 'family', None)!r}); use the pipeline "
                "of its family (or `untied_sc.pipelines.load_pipeline` on a folder)."
            )
        vocab_size = transformer.config.vocab_size
        if vocab_size not in (len(tokenizer), tokenizer.vocab_size):
            raise ValueError(
                f"The tokenizer has {len(tokenizer)} tokens but the transformer predicts {vocab_size}: they come "
                "from different models. Load the tokenizer that the model was trained with."
            )

    def to(self, *args, **kwargs):
        """
        diffusers' `to`, with a CUDA device this machine lacks refused first in one sentence (torch's own error is
        an assertion raised from deep inside the move).
        """
        for value in (*args, kwargs.get("device")):
            if isinstance(value, str | torch.device) and str(value).startswith("cuda"):
                check_device(value, f"{type(self).__name__}.to({str(value)!r})")
        return super().to(*args, **kwargs)

    @property
    def latent_shape(self) -> tuple[int, int]:
        """(length, dim) of one latent sequence."""
        raise NotImplementedError

    def _predict(self, model_input: torch.Tensor, timestep: torch.Tensor, self_conditioning: torch.Tensor | None):
        """
        One network evaluation → (clean prediction for the scheduler, logits or None). Subclasses add the family's
        per-call network knobs as keyword arguments with defaults ([`~LanguageFlowPipeline.denoise`] passes them).
        """
        raise NotImplementedError

    def _tokens(
        self, latents: torch.Tensor, last_logits: torch.Tensor | None, generator: torch.Generator
    ) -> torch.LongTensor:
        """Final token ids (`generator`: the call's, for a decoder that samples); subclasses add decode knobs."""
        raise NotImplementedError

    def _texts(self, sequences: torch.LongTensor) -> list[str]:
        """The decoded texts of the final token ids, with or without special tokens as the family's protocol has."""
        return self.tokenizer.batch_decode(sequences, skip_special_tokens=self._skip_special_tokens)

    def check_scheduler(self, scheduler) -> None:
        """Refuses a scheduler of the other family (it would run and give other text); stock schedulers pass."""
        family = getattr(scheduler, "family", None)
        if family is None or family == self.family:
            return
        names = sorted(
            name
            for name in dir(schedulers)
            if name.endswith("Scheduler") and getattr(getattr(schedulers, name), "family", None) == self.family
        )
        raise ValueError(
            f"{type(scheduler).__name__} belongs to the {family!r} family, but {type(self).__name__} samples "
            f"{self.family!r} models (it would run and give other text). Use one of this family's schedulers: "
            f"{', '.join(names)}, e.g. `pipe.scheduler = {names[0]}.from_config(pipe.scheduler.config)`."
        )

    def check_inputs(self, batch_size, num_inference_steps, latents):
        """The run's sizes and initial latents (the denoising run checks them, once per call)."""
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        check_steps(num_inference_steps)
        expected = (batch_size, *self.latent_shape)
        if latents is not None and tuple(latents.shape) != expected:
            raise ValueError(f"latents have shape {tuple(latents.shape)}, expected {expected} (batch, length, dim).")
        if latents is not None:
            check_finite_latents(latents)

    def check_output(self, output_type, callback_tensor_inputs=()):
        """What a `__call__` returns and shows its callback (checked before the run)."""
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        unknown = [name for name in callback_tensor_inputs if name not in self._callback_tensor_inputs]
        if unknown:
            raise ValueError(f"Unknown callback tensor inputs {unknown}; choose from {self._callback_tensor_inputs}.")

    def _call_generator(self, generator):
        """
        The call's generator: the one given, or for `None` torch's global generator of the execution device (as
        diffusers: `torch.manual_seed` makes the call reproducible), so that the loop and the decode after it draw
        from the same stream.
        """
        return global_generator(self._execution_device) if generator is None else generator

    def _checked_call(
        self, batch_size, num_inference_steps, generator, latents
    ) -> tuple[int, int, torch.Generator | list[torch.Generator]]:
        """A run's inputs checked (sizes given as numpy integers taken as ints), and its generator
        (`_call_generator`): the one place a call's sizes and generator are checked."""
        batch_size, num_inference_steps = as_int(batch_size), as_int(num_inference_steps)
        self.check_inputs(batch_size, num_inference_steps, latents)
        check_generator_input(generator, batch_size)
        return batch_size, num_inference_steps, self._call_generator(generator)

    def prepare_latents(self, batch_size, generator, latents, device, scheduler=None) -> torch.Tensor:
        """
        z_0 = init_noise_sigma·ε drawn from `generator` on its device and moved to `device` (float32: the solvers run
        in float32/float64), with the `init_noise_sigma` of `scheduler` (default: the pipeline's).
        """
        if latents is not None:
            return latents.to(device=device, dtype=torch.float32)
        shape = (batch_size, *self.latent_shape)
        if isinstance(generator, torch.Generator):  # drawn on the generator's device (a CUDA one: on the GPU)
            noise = draw_normal(shape, generator, device, torch.float32)
        else:  # a list (one generator per sample) or None: diffusers' convention
            noise = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
        return noise * getattr(self.scheduler if scheduler is None else scheduler, "init_noise_sigma", 1.0)

    def calibrate(
        self,
        nfe: list[int],
        bank_size: int = 64,
        seed: int = CALIBRATION_SEED,
        batch_size: int = 16,
        overwrite: bool = False,
        **kwargs,
    ) -> "CalibrationResult":  # noqa: F821
        """
        Computes (or extends) this pipeline's `sampler_statistics` for the NFEs in `nfe`; see
        [`~untied_sc.calibration.calibrate_pipeline`] for the arguments, and
        [`~untied_sc.calibration.apply_calibration`] for what is installed (the statistics, and the coefficients it
        ran at into the scheduler config where it has none; `overwrite=True` also replaces an NFE's entry that holds
        other coefficients than the ones given). It changes this object only: files are written by `save_pretrained`
        (or `untied-sc calibrate`, which refuses to replace a folder's NFEs without `--overwrite`). Returns the
        calibration result.
        """
        result = calibrate_pipeline(self, nfe, bank_size=bank_size, seed=seed, batch_size=batch_size, **kwargs)
        apply_calibration(self, result, overwrite=overwrite)
        return result


def call_diversity(scheduler, key: str, num_inference_steps: int, default: float) -> float:
    """The diversity knob a pipeline call uses when it gives none: an untied `scheduler`'s stored entropy-matching
    value ([`entropy_matched_setting`]), else `default` (the official sampler's value). Other schedulers: `default`."""
    if not isinstance(scheduler, UntiedSelfConditioningScheduler):
        return default
    stored = entropy_matched_setting(scheduler.config, num_inference_steps, key)
    return default if stored is None else stored
