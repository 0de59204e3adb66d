"""ELFPipeline: unconditional sampling from an ELF model."""

import os

import torch

from ..models import load_official_elf
from ..schedulers import ELFScheduler
from .pipeline_utils import LanguageFlowPipeline


# The SC-CFG scale of the released models, used when the scheduler (a stock one) does not carry it.
DEFAULT_SC_CFG_SCALE = 3.0


def mask_after_eos(ids: torch.LongTensor, eos_token_id: int, pad_token_id: int) -> torch.LongTensor:
    """Replaces the first EOS and everything after it with the pad id (the official ELF post-processing)."""
    keep = (ids == eos_token_id).int().cumsum(dim=1) == 0
    return torch.where(keep, ids, torch.full_like(ids, pad_token_id))


def sample_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.LongTensor:
    """One token per position from softmax(logits / T), by inverse CDF of a uniform drawn on the CPU `generator`."""
    u = torch.rand(logits.shape[:-1], generator=generator, dtype=torch.float64).to(logits.device)
    ids = torch.empty(logits.shape[:-1], dtype=torch.long, device=logits.device)
    for row in range(logits.shape[0]):  # one sequence at a time: a float64 CDF of the whole batch can take GBs
        cdf = torch.softmax(logits[row].double() / temperature, dim=-1).cumsum(dim=-1)
        # the first index whose CDF exceeds u (clamped: rounding can leave the last CDF value just below 1)
        ids[row] = torch.searchsorted(cdf, u[row, :, None]).squeeze(-1).clamp_max(logits.shape[-1] - 1)
    return ids


class ELFPipeline(LanguageFlowPipeline):
    r"""
    Unconditional text generation with ELF (Embedded Language Flows).

    Each step calls the network once on the (re-noised) latent with the scheduler's self-conditioning input and the
    SC-CFG scale w (`scheduler.config.sc_cfg_scale`, or the call's `sc_cfg_scale`). After the last step, one decode
    pass (t = 1, zero self-conditioning, mode tokens on) gives logits; the argmax (or, with the call's
    `decode_temperature` T > 0, a draw from softmax(logits / T)) is cut at the first EOS. NFE = number of steps.

    Args:
        transformer ([`ELFTransformerModel`]): the network.
        scheduler ([`ELFScheduler`] or [`UntiedSelfConditioningScheduler`]): the sampler.
        tokenizer (`PreTrainedTokenizerBase`): the tokenizer of the model's vocabulary (T5 for the released models).
        sampler_statistics ([`SamplerStatistics`], *optional*): calibration for the untied scheduler.

    Example:
        ```py
        >>> from untied_sc import ELFPipeline
        >>> pipe = ELFPipeline.from_pretrained("hub_artifacts/elf-small")
        >>> pipe(batch_size=4, num_inference_steps=8, generator=torch.Generator().manual_seed(0)).texts
        ```
    """

    _sc_cfg_scale = None  # w of the call in progress (set by `__call__`; None: the scheduler config's)
    _decode_temperature = 0.0  # T of the call in progress (0: argmax, the official decode)

    def __call__(self, *args, sc_cfg_scale: float | None = None, decode_temperature: float = 0.0, **kwargs):
        r"""
        Samples as [`LanguageFlowPipeline.__call__`] (same arguments), with two ELF-specific knobs.

        Args:
            sc_cfg_scale (`float`, *optional*): the SC-CFG scale w, a network input at every step and in the final
                decode pass; ELF's own quality/diversity trade-off. `None` (default): `scheduler.config.sc_cfg_scale`.
            decode_temperature (`float`, defaults to 0.0): the temperature T of the final decode: 0 takes the argmax
                (the official decode); T > 0 draws each token from softmax(logits / T) with the call's generator
                (after every sampling step, so the trajectory and its pairing with other samplers are unchanged).
                ELF's counterpart of LangFlow's softmax temperature on x̂: the diversity control of GenPPL–entropy
                curves (raising T raises the samples' entropy).
        """
        if sc_cfg_scale is not None and not isinstance(sc_cfg_scale, int | float):
            raise ValueError(f"sc_cfg_scale must be a number or None, got {sc_cfg_scale!r}.")
        if not (isinstance(decode_temperature, int | float) and decode_temperature >= 0):
            raise ValueError(f"decode_temperature must be a number ≥ 0 (0: argmax), got {decode_temperature!r}.")
        self._sc_cfg_scale = None if sc_cfg_scale is None else float(sc_cfg_scale)
        self._decode_temperature = float(decode_temperature)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self._sc_cfg_scale, self._decode_temperature = None, 0.0

    @property
    def latent_shape(self) -> tuple[int, int]:
        return self.transformer.config.max_length, self.transformer.config.latent_dim

    @property
    def sc_cfg_scale(self) -> float:
        """The SC-CFG scale w in use: the call's override, else the scheduler config's, else 3.0."""
        if self._sc_cfg_scale is not None:
            return self._sc_cfg_scale
        return getattr(self.scheduler.config, "sc_cfg_scale", DEFAULT_SC_CFG_SCALE)

    def _predict(self, model_input, timestep, self_conditioning):
        output = self.transformer(model_input, timestep, self_conditioning, self.sc_cfg_scale)
        return output.sample.float(), None

    def _tokens(self, latents, last_logits, generator):
        decode = self.transformer(latents, 1.0, None, self.sc_cfg_scale, decoder_step_active=True)
        if self._decode_temperature == 0.0:
            ids = decode.logits.argmax(dim=-1)
        else:
            ids = sample_tokens(decode.logits, self._decode_temperature, generator)
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        return ids if eos is None else mask_after_eos(ids, eos, pad if pad is not None else eos)

    def _texts(self, sequences):
        return self.tokenizer.batch_decode(sequences, skip_special_tokens=True)

    @classmethod
    def from_official(
        cls, checkpoint: str | os.PathLike, tokenizer="t5-small", max_length: int = 1024, **kwargs
    ) -> "ELFPipeline":
        """
        Builds a pipeline from an official ELF PyTorch checkpoint (see [`load_official_elf`]).

        Args:
            checkpoint: `checkpoint_<step>` file, folder, or Hub repo id.
            tokenizer: a tokenizer or its name/path (`"t5-small"` for the released models).
            max_length (`int`, defaults to 1024): the model's sequence length.
            kwargs: passed to [`load_official_elf`].
        """
        if isinstance(tokenizer, str | os.PathLike):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        transformer = load_official_elf(checkpoint, max_length=max_length, **kwargs)
        return cls(transformer=transformer, scheduler=ELFScheduler(), tokenizer=tokenizer)
