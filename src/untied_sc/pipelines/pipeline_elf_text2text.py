"""ELFText2TextPipeline: ELF with a source text (the conditional checkpoints: XSum summarisation, WMT14 De-En).

Every rule here is the official PyTorch port's (`github.com/lillian039/ELF@pytorch_elf`, b29d883): the layout of
source and target in one sequence (`utils/data_utils.py` `get_dataloader.collate_fn`), the encoder's masks
(`utils/encoder_utils.py` `build_self_attn_cond_masks`, `encode_text`), the held source and the guidance
(`utils/sampling_utils.py` `restore_cond`, `restore_vx`, `_forward_sample`), and the decode (`generation.py`
`test_generation_cond`: `shift_left`, the cut to `max_length − max_input_length`, `mask_after_eos`).
"""

import contextlib
import os
from dataclasses import dataclass, replace

import torch
from diffusers.utils import logging

from ..schedulers.run_context import RunContext, step_kwargs
from ..schedulers.scheduling_elf import ELFGuidance, copy_generator
from .checks import as_int, check_finite_number
from .outputs import DenoisingOutput, DenoisingStep, LanguageFlowPipelineOutput
from .pipeline_elf import ELFPipeline, _check_sc_cfg_scale, mask_after_eos, sample_tokens
from .pipeline_utils import call_diversity


logger = logging.get_logger(__name__)

# The official conditional sampler's settings (`src/configs/sampling_configs/cond_sampling_configs.yml`: ODE, 64
# steps, cfgs [2], self_cond_cfg_scales [1]) and the conditional training configs' latent normalisation and padding
# (`train_xsum_ELF-B.yml`, `train_de-en_ELF-B.yml`: latent_mean 0.0, latent_std 0.2, pad_token eos).
DEFAULT_GUIDANCE_SCALE = 2.0
DEFAULT_CONDITIONAL_SC_CFG_SCALE = 1.0
DEFAULT_CONDITIONAL_STEPS = 64
LATENT_MEAN, LATENT_STD = 0.0, 0.2
PAD_TOKENS = ("eos", "pad")


@dataclass
class SourceConditioning:
    """
    The encoded sources of a batch, as the sampler holds them.

    Args:
        latents (`torch.Tensor` of shape `(batch, length, latent_dim)`): the normalised encoder latents at the source
            positions, 0 elsewhere (official `restore_cond(zeros, cond_seq, cond_seq_mask)`).
        mask (`torch.Tensor` of shape `(batch, length)`, bool): the held (source) positions, a prefix of each row.
        lengths (`list[int]`): the number of source tokens of each row (after truncation).
    """

    latents: torch.Tensor
    mask: torch.Tensor
    lengths: list[int]

    def hold(self, latents: torch.Tensor) -> torch.Tensor:
        """The clean source at the held positions (official `restore_cond(z, cond_seq, cond_seq_mask)`)."""
        return torch.where(self.mask[..., None], self.latents.to(latents.dtype), latents)

    def drop(self, latents: torch.Tensor) -> torch.Tensor:
        """Zeros at the held positions: the unconditional branch (official `restore_cond(z, zeros, mask)`)."""
        return torch.where(self.mask[..., None], torch.zeros((), dtype=latents.dtype, device=latents.device), latents)


class ELFText2TextPipeline(ELFPipeline):
    r"""
    Text-to-text generation with a conditional ELF model (summarisation, translation): the source text is encoded by
    the frozen T5 encoder and held clean in front of the generated positions at every step, and classifier-free
    guidance contrasts the prediction with and without the source, as the official conditional sampler does.

    A class of its own rather than a `prompt` argument of [`ELFPipeline`], as diffusers separates unconditional and
    text-conditioned pipelines (`DDPMPipeline` / `StableDiffusionPipeline`): it has one more component (the
    `text_encoder`), other settings (the source length, the guidance scale) and other outputs (only the target
    positions), and a folder says by its `model_index.json` class which kind of model it holds.

    Sequence layout (official `get_dataloader.collate_fn`): the source tokens, `tokenizer(text,
    add_special_tokens=False)` as the official `load_jsonl_dataset` tokenises, truncated to `max_source_length`
    tokens (the official `condition_input_ids[:max_input_length]`: a longer prompt is truncated, with a warning),
    come first, with no separator; the generated text fills the remaining `max_length − n` positions, and the
    first `max_length − max_source_length` of them are returned (official `shift_left` and cut), cut at the first
    EOS. The encoder sees the whole sequence, the source positions attending to the source only (official
    `build_self_attn_cond_masks`), so the source latents do not depend on what follows them.

    Each step (official `_forward_sample`), with the source held clean in the latent and in the self-conditioning
    input: x̂_c = network(z, m); with guidance scale g ≠ 1 also x̂_u = network(z, m) with the source positions of both
    set to 0 (the source dropped, as in training with `label_drop_prob`), and the step combines velocities
    v_u + g·(v_c − v_u) ([`ELFGuidance`]); the next self-conditioning input is x̂_u + g·(x̂_c − x̂_u) with the
    source held. NFE = steps × (2 if g ≠ 1 else 1). The SC-CFG scale w is a network input of both calls.

    Args:
        transformer ([`ELFTransformerModel`]): the conditional network.
        scheduler ([`ELFScheduler`] or [`UntiedELFScheduler`]): the sampler; the official setting is the ODE
            (`sde_gamma=0.0`).
        tokenizer (`PreTrainedTokenizerBase`): the model's tokenizer (T5's for the released models).
        text_encoder (`T5EncoderModel`): the frozen encoder whose outputs are the model's latents.
        sampler_statistics, ace_statistics: as [`ELFPipeline`].
        sc_cfg_scale (`float`, *optional*): the default SC-CFG scale w (official: 1.0).
        sc_cfg_scale_by_steps (`dict[str, float]`, *optional*): w per NFE.
        max_source_length (`int`): the source positions (the training config's `max_input_length`: 1024 for XSum,
            64 for WMT14 De-En); the generated text has `max_length − max_source_length` positions.
        guidance_scale (`float`, defaults to 2.0): the default guidance scale (the official `cfgs: [2]`).
        latent_mean, latent_std (`float`, defaults to 0.0, 0.2): the encoder latents' normalisation
            (official `encode_text`).
        pad_token (`str`, defaults to `"eos"`): the padding id, `"eos"` or `"pad"` (the training config's
            `pad_token`; the released models use `eos`).

    Example:
        ```py
        >>> pipe = ELFText2TextPipeline.from_pretrained("elf-b-de-en")
        >>> pipe(prompt="Das Haus ist klein.", num_inference_steps=64, generator=torch.Generator().manual_seed(0)).texts
        ```
    """

    model_cpu_offload_seq = "text_encoder->transformer"

    def __init__(
        self,
        transformer,
        scheduler,
        tokenizer,
        text_encoder,
        sampler_statistics=None,
        sc_cfg_scale: float | None = None,
        ace_statistics=None,
        sc_cfg_scale_by_steps: dict[str, float] | None = None,
        max_source_length: int | None = None,
        guidance_scale: float = DEFAULT_GUIDANCE_SCALE,
        latent_mean: float = LATENT_MEAN,
        latent_std: float = LATENT_STD,
        pad_token: str = "eos",
    ):
        if sc_cfg_scale is None:
            sc_cfg_scale = DEFAULT_CONDITIONAL_SC_CFG_SCALE
        super().__init__(
            transformer, scheduler, tokenizer, sampler_statistics, sc_cfg_scale, ace_statistics, sc_cfg_scale_by_steps
        )
        self.register_modules(text_encoder=text_encoder)
        length = transformer.config.max_length
        if isinstance(max_source_length, bool) or not isinstance(max_source_length, int):
            raise ValueError(
                f"max_source_length must be the number of source positions (the training config's max_input_length, "
                f"e.g. 1024 for XSum, 64 for WMT14 De-En), got {max_source_length!r}."
            )
        if not 1 <= max_source_length < length:
            raise ValueError(
                f"max_source_length={max_source_length} must be in [1, {length - 1}]: the transformer has "
                f"max_length={length} positions, the source first and the generated text after it."
            )
        width, encoder_width = transformer.config.latent_dim, getattr(text_encoder.config, "d_model", None)
        if encoder_width != width:
            raise ValueError(
                f"The text_encoder gives {encoder_width}-wide latents but the transformer conditions on "
                f"latent_dim={width}: they come from different models. Pass the encoder the model was trained with "
                "(t5-small, 512 wide, for the released ELF checkpoints)."
            )
        encoder_vocab = getattr(text_encoder.config, "vocab_size", None)
        if encoder_vocab is not None and len(tokenizer) > encoder_vocab:
            raise ValueError(
                f"The tokenizer has {len(tokenizer)} tokens but the text_encoder embeds {encoder_vocab}: pass the "
                "tokenizer of the encoder (the model's own)."
            )
        if pad_token not in PAD_TOKENS:
            raise ValueError(f"pad_token must be one of {PAD_TOKENS} (the training config's), got {pad_token!r}.")
        check_finite_number("guidance_scale", guidance_scale, "e.g. 2.0, the official value")
        if not (isinstance(latent_std, int | float) and latent_std > 0):
            raise ValueError(f"latent_std must be a positive number, got {latent_std!r}.")
        self.register_to_config(
            max_source_length=max_source_length,
            guidance_scale=float(guidance_scale),
            latent_mean=float(latent_mean),
            latent_std=float(latent_std),
            pad_token=pad_token,
        )

    @property
    def max_target_length(self) -> int:
        """The generated positions returned: `max_length − max_source_length` (official `gen_length`)."""
        return self.transformer.config.max_length - self.config.max_source_length

    @property
    def pad_token_id(self) -> int:
        """The padding id (official `get_pad_token_id(tokenizer, config.pad_token)`)."""
        token_id = self.tokenizer.eos_token_id if self.config.pad_token == "eos" else self.tokenizer.pad_token_id
        if token_id is None:
            raise ValueError(f"The tokenizer has no {self.config.pad_token} token; set the pipeline's pad_token.")
        return token_id

    def tokenize_prompt(self, prompt: str | list[str]) -> list[list[int]]:
        """The source ids of each prompt, truncated to `max_source_length` (the official rule), with a warning."""
        prompts = [prompt] if isinstance(prompt, str) else prompt
        if not isinstance(prompts, list | tuple) or not prompts or not all(isinstance(p, str) for p in prompts):
            raise ValueError(
                f"prompt must be a source text or a non-empty list of them (the text to translate or summarise), "
                f"got {prompt!r}."
            )
        limit, sources = self.config.max_source_length, []
        for i, text in enumerate(prompts):
            ids = list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
            if not ids:
                raise ValueError(
                    f"prompt[{i}] = {text!r} has no tokens: the model generates from a source text, so pass a "
                    "non-empty one (for text without a source, use ELFPipeline with an unconditional checkpoint)."
                )
            if len(ids) > limit:
                logger.warning(
                    f"prompt[{i}] has {len(ids)} tokens; the model takes {limit} (max_source_length): the rest is "
                    "cut off, as the official code truncates its sources."
                )
            sources.append(ids[:limit])
        return sources

    @torch.no_grad()
    def encode_prompt(self, prompt: str | list[str], device: torch.device | None = None) -> SourceConditioning:
        """
        The sources' normalised encoder latents at their positions (official `encode_text`: (h − mean)/std, then the
        transformer's dtype). The encoder sees the whole sequence, the source positions attending to the source only
        (official `build_self_attn_cond_masks`); the positions after a source hold the pad id, which the source
        positions do not see.
        """
        device = self._execution_device if device is None else device
        sources = self.tokenize_prompt(prompt)
        batch, length = len(sources), self.transformer.config.max_length
        input_ids = torch.full((batch, length), self.pad_token_id, dtype=torch.long)
        for row, ids in enumerate(sources):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        lengths = torch.tensor([len(ids) for ids in sources])
        mask = torch.arange(length)[None, :] < lengths[:, None]
        encoder_device = self.text_encoder.device
        hidden = self.text_encoder(
            input_ids=input_ids.to(encoder_device), attention_mask=mask.to(encoder_device, torch.float32)
        ).last_hidden_state
        latents = ((hidden.float() - self.config.latent_mean) / self.config.latent_std).to(device)
        latents = latents.to(self.transformer.dtype).float()
        mask = mask.to(device)
        return SourceConditioning(torch.where(mask[..., None], latents, 0.0), mask, lengths.tolist())

    @torch.no_grad()
    def __call__(
        self,
        prompt: str | list[str] | None = None,
        num_inference_steps: int = DEFAULT_CONDITIONAL_STEPS,
        guidance_scale: float | None = None,
        generator: torch.Generator | None = None,
        latents: torch.Tensor | None = None,
        output_type: str = "text",
        return_dict: bool = True,
        callback_on_step_end=None,
        callback_on_step_end_tensor_inputs: list[str] | None = None,
        sc_cfg_scale: float | None = None,
        decode_temperature: float | None = None,
        batch_size: int | None = None,
    ) -> LanguageFlowPipelineOutput | tuple:
        r"""
        One generated text per prompt.

        Args:
            prompt (`str` or `list[str]`): the source text(s): the text to translate or to summarise. Prompts of
                different lengths batch together (each row holds its own source).
            num_inference_steps (`int`, defaults to 64): the number of steps (the official 64); NFE = steps ×
                (2 if `guidance_scale` ≠ 1 else 1).
            guidance_scale (`float`, *optional*): the classifier-free guidance scale g; 1 runs the conditional
                prediction alone. `None`: the pipeline's (`config.guidance_scale`, official 2.0).
            generator (`torch.Generator`, *optional*): every random draw comes from it, as in [`ELFPipeline`].
            latents (`torch.Tensor` of shape `(len(prompt), max_length, latent_dim)`, *optional*): z_0 (the source
                positions are overwritten by the source).
            output_type (`str`, defaults to `"text"`): `"text"`, `"seq"` or `"latent"`.
            return_dict (`bool`, defaults to `True`): return a [`LanguageFlowPipelineOutput`] or a tuple.
            callback_on_step_end, callback_on_step_end_tensor_inputs: as [`ELFPipeline`].
            sc_cfg_scale (`float`, *optional*): the SC-CFG scale w (official 1.0; `None`: the pipeline's).
            decode_temperature (`float`, *optional*): 0 (argmax, official) or T > 0, as [`ELFPipeline`].
            batch_size: not taken: the batch is one row per prompt (an error says so).

        Returns:
            [`LanguageFlowPipelineOutput`]: `texts`, `sequences` of shape `(len(prompt), max_length −
            max_source_length)` (the target positions, pad from the first EOS on) and the final `latents`.
        """
        if prompt is None:
            raise ValueError(
                "ELFText2TextPipeline generates from a source text: pass `prompt=` (the text to translate or "
                "summarise). For unconditional text, load an unconditional checkpoint with ELFPipeline."
            )
        if batch_size is not None:
            raise ValueError("batch_size is not taken: the batch has one row per prompt; pass a list of prompts.")
        if sc_cfg_scale is not None:
            sc_cfg_scale = _check_sc_cfg_scale(sc_cfg_scale)
        guidance_scale = self.config.guidance_scale if guidance_scale is None else guidance_scale
        if isinstance(guidance_scale, bool) or not isinstance(guidance_scale, int | float):
            raise ValueError(
                f"guidance_scale must be a number (1: no guidance; official 2.0), got {guidance_scale!r}."
            )
        check_finite_number("guidance_scale", guidance_scale, "1: no guidance; official 2.0")
        if decode_temperature is None:
            decode_temperature = call_diversity(self.scheduler, "decode_temperature", num_inference_steps, 0.0)
        if not (isinstance(decode_temperature, int | float) and decode_temperature >= 0):
            raise ValueError(f"decode_temperature must be a number ≥ 0 (0: argmax), got {decode_temperature!r}.")
        conditioning = self.encode_prompt(prompt)
        scale = self._scale(sc_cfg_scale, as_int(num_inference_steps))
        return self._generate(
            len(conditioning.lengths),
            num_inference_steps,
            generator,
            latents,
            output_type,
            return_dict,
            callback_on_step_end,
            callback_on_step_end_tensor_inputs,
            network_kwargs={"sc_cfg_scale": scale, "conditioning": conditioning, "guidance_scale": guidance_scale},
            decode_kwargs={
                "sc_cfg_scale": scale,
                "decode_temperature": float(decode_temperature),
                "conditioning": conditioning,
            },
        )

    def _run_context(self, context: RunContext) -> RunContext:
        """
        The grid of the official conditional run: on the CPU, `generation.py` `test_generation_cond` iterates its
        `DataLoader` before the grid, whose iterator draws its base seed (one int64, `torch.empty((), dtype=int64)
        .random_()`) from the global RNG the grid then continues; so the grid comes from a copy of the generator
        advanced by that draw. (On CUDA the official code draws the grid from the global CUDA RNG: the generator's
        own stream is used, as [`ELFScheduler`] does.)
        """
        if context.generator.device.type != "cpu":
            return context
        grid = copy_generator(context.generator)
        torch.empty((), dtype=torch.int64).random_(generator=grid)
        return replace(context, grid_generator=grid)

    @torch.no_grad()
    def denoise(
        self,
        batch_size: int = 1,
        num_inference_steps: int = DEFAULT_CONDITIONAL_STEPS,
        generator: torch.Generator | None = None,
        latents: torch.Tensor | None = None,
        *,
        conditioning: SourceConditioning,
        guidance_scale: float = DEFAULT_GUIDANCE_SCALE,
        sc_cfg_scale: float | None = None,
        scheduler=None,
        statistics=None,
        ace_statistics=None,
        max_steps: int | None = None,
        step_callback=None,
        progress: bool = True,
    ) -> DenoisingOutput:
        """
        [`LanguageFlowPipeline.denoise`] with the source of `conditioning` ([`encode_prompt`]) held and the official
        guidance: the source replaces z_0 and each network input (official `restore_cond`), each step calls the
        network with and (`guidance_scale` ≠ 1) without the source, and the step's output holds the source again.
        """
        if conditioning is None or len(conditioning.lengths) != batch_size:
            raise ValueError("denoise needs the batch's `conditioning` (encode_prompt), one row per trajectory.")
        scale = self._scale(sc_cfg_scale, num_inference_steps)
        # The untied sampler acts on the generated positions only (its correction, and calibration's moments): the
        # held source positions are masked out (and restored after every step below).
        batch_size, num_inference_steps, generator, scheduler, device, context = self._start_run(
            batch_size,
            num_inference_steps,
            generator,
            latents,
            scheduler,
            statistics,
            ace_statistics,
            mask=~conditioning.mask,
        )
        guided = guidance_scale != 1  # official `_forward_sample`: g = 1 returns the conditional branch alone
        # A scheduler that takes no `guidance` (a comparison sampler, a stock one) gets the combined prediction: the
        # same update in exact arithmetic.
        takes_guidance = getattr(scheduler, "takes_guidance", False)
        extra_step_kwargs = step_kwargs(scheduler, generator)
        latents = conditioning.hold(self.prepare_latents(batch_size, generator, latents, device, scheduler))
        timesteps = self._run_timesteps(scheduler, max_steps)
        with self._progress_bar(len(timesteps), progress) as progress_bar, context.random or contextlib.nullcontext():
            for i, t in enumerate(timesteps):
                scale_input = getattr(scheduler, "scale_model_input", None)
                model_input = conditioning.hold(scale_input(latents, t) if scale_input is not None else latents)
                previous = getattr(scheduler, "self_conditioning", None)
                # Official `_generate_samples_single_batch`: the first self-conditioning input is the held source.
                previous = torch.zeros_like(model_input) if previous is None else previous
                self_conditioning = conditioning.hold(previous)
                conditional = self._call_network(model_input, t, self_conditioning, scale).sample.float()
                guidance = None
                if guided:
                    unconditional = self._call_network(
                        conditioning.drop(model_input), t, conditioning.drop(previous), scale
                    ).sample.float()
                    combined = unconditional + guidance_scale * (conditional - unconditional)
                    guidance = ELFGuidance(conditional, unconditional, float(guidance_scale))
                else:
                    combined = conditional
                prediction = conditioning.hold(combined)
                kwargs = dict(extra_step_kwargs, guidance=guidance) if guided and takes_guidance else extra_step_kwargs
                sample = latents
                latents = conditioning.hold(scheduler.step(prediction, t, latents, **kwargs).prev_sample)
                if step_callback is not None:
                    step = DenoisingStep(i, t, sample, model_input, self_conditioning, prediction, None, latents)
                    latents = conditioning.hold((step_callback(step) or {}).get("latents", latents))
                progress_bar.update()
        return DenoisingOutput(latents=latents, logits=None)

    def _tokens(
        self,
        latents,
        last_logits,
        generator,
        sc_cfg_scale: float | None = None,
        decode_temperature: float = 0.0,
        conditioning: SourceConditioning | None = None,
    ):
        # Official `_dlm_decode_batch` on the whole sequence (zero self-conditioning, t = 1, mode tokens on), then
        # `shift_left` past each source and the cut to `gen_length`, then `mask_after_eos` with the pad id.
        decode = self._call_network(latents, 1.0, None, self._scale(sc_cfg_scale), decoder_step_active=True)
        if decode_temperature == 0.0:
            ids = decode.logits.argmax(dim=-1)
        else:
            ids = sample_tokens(decode.logits, decode_temperature, generator)
        width = self.max_target_length
        ids = torch.stack([row[n : n + width] for row, n in zip(ids, conditioning.lengths, strict=True)])
        eos = self.tokenizer.eos_token_id
        return ids if eos is None else mask_after_eos(ids, eos, self.pad_token_id)

    @classmethod
    def from_official(
        cls,
        checkpoint: str | os.PathLike,
        tokenizer=None,
        text_encoder=None,
        max_length: int | None = None,
        max_source_length: int | None = None,
        official_id: str | None = None,
        sde_gamma: float | None = None,
        sc_cfg_scale: float | None = None,
        guidance_scale: float | None = None,
        **kwargs,
    ) -> "ELFText2TextPipeline":
        """
        Builds the pipeline of an official conditional ELF checkpoint (`ELF-B-xsum-torch`, `ELF-B-de-en-torch`, or a
        trainer's output folder whose `config.yml` sets `max_input_length`) with the official conditional sampler at
        its official settings: the ODE (γ = 0), SC-CFG scale 1 and guidance scale 2 of the official
        `cond_sampling_configs.yml`, the source length and latent normalisation of the training config, the T5
        tokenizer and the frozen T5 encoder the official code loads (`t5-small`). `pipe.save_pretrained(folder)`
        writes the complete folder (what `untied-sc convert elf` does), with a model card naming every setting's
        source. An unconditional checkpoint is refused, naming [`ELFPipeline.from_official`].

        Args:
            checkpoint: `checkpoint_<step>` file, folder, or Hub repo id.
            tokenizer: a tokenizer or its name/path; `None`: the checkpoint's (`t5-small`).
            text_encoder: a `T5EncoderModel` or its name/path; `None`: the checkpoint's (`t5-small`, through the
                Hugging Face cache, as the official `T5EncoderModel.from_pretrained(encoder_model_name)`).
            max_length, official_id, sde_gamma, sc_cfg_scale: as [`ELFPipeline.from_official`].
            max_source_length (`int`, *optional*): the source positions, where nothing records them (the training
                config's `max_input_length`; must agree with a recorded one).
            guidance_scale (`float`, *optional*): the default guidance scale, over the recorded one.
            kwargs: as [`ELFPipeline.from_official`] (`weights`, `allow_pickle`, the Hub download's, and
                `sampler_statistics`, `sampler_statistics_revision`).
        """
        from .official_text2text import build_elf_text2text

        statistics = kwargs.pop("sampler_statistics", None)
        revision = kwargs.pop("sampler_statistics_revision", None)
        pipe = build_elf_text2text(
            cls,
            checkpoint,
            tokenizer,
            text_encoder,
            max_length,
            max_source_length,
            official_id,
            sde_gamma,
            sc_cfg_scale,
            guidance_scale,
            **kwargs,
        )
        return cls._attach_official_statistics(pipe, statistics, revision, kwargs)
