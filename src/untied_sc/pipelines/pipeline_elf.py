"""ELFPipeline: unconditional sampling from an ELF model."""

import functools
import os

import torch

from ..per_nfe import read_steps_table, write_steps_table
from .checks import as_int, check_finite_number
from .outputs import LanguageFlowPipelineOutput
from .pipeline_utils import LanguageFlowPipeline, call_diversity


# The SC-CFG scale of the released models: the pipeline's default when its config carries none.
DEFAULT_SC_CFG_SCALE = 3.0


def _check_sc_cfg_scale(value, where: str = "sc_cfg_scale") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{where} must be a number or None, got {value!r}.")
    return check_finite_number(where, value, "e.g. 3.0, the released models' SC-CFG scale, or None for the default")


def _check_sc_cfg_scale_by_steps(table) -> dict[str, float]:
    """`{"8": 2.5, ...}`: NFEs (≥ 2) to numbers, as the config keeps them (string keys, in NFE order)."""
    scales = read_steps_table(table, "sc_cfg_scale_by_steps", _sc_cfg_scale_entry)
    return write_steps_table(dict(sorted(scales.items())))


def _sc_cfg_scale_entry(steps: int, value, where: str) -> float:
    if steps < 2:
        raise ValueError(f"sc_cfg_scale_by_steps: {steps!r} is not an NFE (an integer ≥ 2).")
    return _check_sc_cfg_scale(value, where)


def mask_after_eos(ids: torch.LongTensor, eos_token_id: int, pad_token_id: int) -> torch.LongTensor:
    """Replaces the first EOS and everything after it with the pad id (the official ELF post-processing)."""
    keep = (ids == eos_token_id).int().cumsum(dim=1) == 0
    return torch.where(keep, ids, torch.full_like(ids, pad_token_id))


def sample_tokens(logits: torch.Tensor, temperature: float, generator: torch.Generator) -> torch.LongTensor:
    """
    One token per position from softmax(logits / T), by inverse CDF of a uniform drawn from `generator` on its device
    (after the denoising run, which leaves no draw ahead in flight on it).
    """
    u = torch.rand(logits.shape[:-1], generator=generator, device=generator.device, dtype=torch.float64)
    u = u.to(logits.device)
    ids = torch.empty(logits.shape[:-1], dtype=torch.long, device=logits.device)
    for row in range(logits.shape[0]):  # one sequence at a time: a float64 CDF of the whole batch can take GBs
        cdf = torch.softmax(logits[row].double() / temperature, dim=-1).cumsum(dim=-1)
        # the first index whose CDF exceeds u (clamped: rounding can leave the last CDF value just below 1)
        ids[row] = torch.searchsorted(cdf, u[row, :, None]).squeeze(-1).clamp_max(logits.shape[-1] - 1)
    return ids


def _refuses_prompt(call):
    """`__call__` refusing a `prompt` with the pipeline that takes one (Python's own error names no fix); the
    signature stays `call`'s."""

    @functools.wraps(call)
    def checked(self, *args, **kwargs):
        if "prompt" in kwargs:
            raise TypeError(
                f"{type(self).__name__} samples unconditional ELF models and takes no prompt. For a conditional "
                "checkpoint (XSum summarisation, WMT14 De-En translation) use ELFText2TextPipeline (`untied-sc "
                "convert elf` writes its folder; ELFText2TextPipeline.from_official builds it)(prompt=...)."
            )
        return call(self, *args, **kwargs)

    return checked


class ELFPipeline(LanguageFlowPipeline):
    r"""
    Unconditional text generation with ELF (Embedded Language Flows).

    Each step calls the network once on the (re-noised) latent with the scheduler's self-conditioning input and the
    SC-CFG scale w. After the last step, one decode pass (t = 1, zero self-conditioning, mode tokens on) gives
    logits; the argmax (or, with the call's `decode_temperature` T > 0, a draw from softmax(logits / T)) is cut at
    the first EOS. NFE = number of steps.

    The SC-CFG scale w of a call is the call's `sc_cfg_scale`, else the pipeline's value for the call's NFE
    ([`sc_cfg_scale_for`]): N's entry of `config.sc_cfg_scale_by_steps` where that table lists N (a checkpoint whose
    official w depends on the number of steps, as ELF-B-PD's), else `config.sc_cfg_scale`. That default is fixed
    when the pipeline is built: the `sc_cfg_scale` argument (`model_index.json`'s value when loading), else 3.0
    (`DEFAULT_SC_CFG_SCALE`, the released models'). `save_pretrained` writes both to `model_index.json` (the table
    only where there is one).

    Args:
        transformer ([`ELFTransformerModel`]): the network.
        scheduler ([`ELFScheduler`] or [`UntiedSelfConditioningScheduler`]): the sampler.
        tokenizer (`PreTrainedTokenizerBase`): the tokenizer of the model's vocabulary (T5 for the released models).
        sampler_statistics ([`SamplerStatistics`], *optional*): calibration for the untied scheduler.
        sc_cfg_scale (`float`, *optional*): the default SC-CFG scale w (see above for `None`).
        ace_statistics ([`ACEStatistics`], *optional*): ACE's repetition direction for the ACE schedulers
            (`untied-sc ace`).
        sc_cfg_scale_by_steps (`dict[str, float]`, *optional*): w per NFE, over `sc_cfg_scale` at the NFEs it lists.

    Example:
        ```py
        >>> from untied_sc import ELFPipeline
        >>> pipe = ELFPipeline.from_pretrained("hub_artifacts/elf-small")
        >>> pipe(batch_size=4, num_inference_steps=8, generator=torch.Generator().manual_seed(0)).texts
        ```
    """

    family = "elf"
    network_knobs = ("sc_cfg_scale",)
    _skip_special_tokens = True  # texts without the pad ids `_tokens` writes from the first EOS on

    def __init__(
        self,
        transformer,
        scheduler,
        tokenizer,
        sampler_statistics=None,
        sc_cfg_scale: float | None = None,
        ace_statistics=None,
        sc_cfg_scale_by_steps: dict[str, float] | None = None,
    ):
        super().__init__(transformer, scheduler, tokenizer, sampler_statistics, ace_statistics)
        if sc_cfg_scale is None:
            sc_cfg_scale = DEFAULT_SC_CFG_SCALE
        self.register_to_config(sc_cfg_scale=_check_sc_cfg_scale(sc_cfg_scale, "the pipeline's sc_cfg_scale"))
        if sc_cfg_scale_by_steps:  # only where there is one: a folder without a table saves none
            self.register_to_config(sc_cfg_scale_by_steps=_check_sc_cfg_scale_by_steps(sc_cfg_scale_by_steps))

    @_refuses_prompt
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
        sc_cfg_scale: float | None = None,
        decode_temperature: float | None = None,
    ) -> LanguageFlowPipelineOutput | tuple:
        r"""
        Samples `batch_size` sequences with `num_inference_steps` network evaluations.

        Args:
            batch_size (`int`, defaults to 1): number of samples.
            num_inference_steps (`int`, defaults to 32): NFE, the number of network evaluations (≥ 2).
            generator (`torch.Generator`, *optional*): every random draw comes from it (`None`: torch's global
                generator of the execution device, as diffusers). The batch shares one random time grid. A CPU generator gives the official CPU run bit for
                bit on any device (on a GPU the re-noising draws are made ahead on a background thread while the
                network runs: same numbers); a CUDA generator draws the grid, z_0, the noise and the decode's
                uniforms on its GPU, in the official order (the official code on CUDA): reproducible for a seed,
                but not the CPU numbers.
            latents (`torch.Tensor` of shape `(batch_size, length, latent_dim)`, *optional*): the initial latent z_0.
            output_type (`str`, defaults to `"text"`): `"text"` (texts and token ids), `"seq"` (token ids) or
                `"latent"` (final latents only; no decode pass).
            return_dict (`bool`, defaults to `True`): return a [`LanguageFlowPipelineOutput`] or a tuple.
            callback_on_step_end (`Callable`, `PipelineCallback` or `MultiPipelineCallbacks`, *optional*): called
                after every step as `callback(pipe, step_index, timestep, callback_kwargs)`; may return
                `{"latents": z}` to continue from z.
            callback_on_step_end_tensor_inputs (`list[str]`, defaults to `["latents"]`): tensors passed to it
                (`"latents"`, `"prediction"`).
            sc_cfg_scale (`float`, *optional*): the SC-CFG scale w, a network input at every step and in the final
                decode pass; ELF's own quality/diversity trade-off. `None` (default): the pipeline's for this NFE,
                `self.sc_cfg_scale_for(num_inference_steps)`.
            decode_temperature (`float`, *optional*): the temperature T of the final decode: 0 takes the argmax
                (the official decode); T > 0 draws each token from softmax(logits / T) with the call's generator
                (after every sampling step, so the trajectory and its pairing with other samplers are unchanged).
                ELF's counterpart of LangFlow's softmax temperature on x̂: the diversity control of GenPPL–entropy
                curves (raising T raises the samples' entropy). `None` (default): 0, or, for an untied scheduler whose
                coefficients come from `coefficients_by_steps`, the entropy-matching decode temperature `untied-sc
                tune` stored there for this NFE (the untied sampler then runs at official's entropy).

        Returns:
            [`LanguageFlowPipelineOutput`] or `tuple`: `(texts, sequences, latents)`, texts cut at the first EOS.
        """
        if sc_cfg_scale is not None:
            sc_cfg_scale = _check_sc_cfg_scale(sc_cfg_scale)
        if decode_temperature is None:
            decode_temperature = call_diversity(self.scheduler, "decode_temperature", num_inference_steps, 0.0)
        if not (isinstance(decode_temperature, int | float) and decode_temperature >= 0):
            raise ValueError(f"decode_temperature must be a number ≥ 0 (0: argmax), got {decode_temperature!r}.")
        check_finite_number("decode_temperature", decode_temperature, "0 takes the argmax, T > 0 draws")
        scale = self._scale(sc_cfg_scale, num_inference_steps)
        return self._generate(
            batch_size,
            num_inference_steps,
            generator,
            latents,
            output_type,
            return_dict,
            callback_on_step_end,
            callback_on_step_end_tensor_inputs,
            network_kwargs={"sc_cfg_scale": scale},
            decode_kwargs={"sc_cfg_scale": scale, "decode_temperature": float(decode_temperature)},
        )

    @property
    def latent_shape(self) -> tuple[int, int]:
        return self.transformer.config.max_length, self.transformer.config.latent_dim

    @property
    def sc_cfg_scale(self) -> float:
        """The default SC-CFG scale w of this pipeline (`config.sc_cfg_scale`); a call's `sc_cfg_scale` overrides it."""
        return self.config.sc_cfg_scale

    def sc_cfg_scale_for(self, num_inference_steps: int) -> float:
        """w at N steps: N's entry of `config.sc_cfg_scale_by_steps` where it lists N, else `config.sc_cfg_scale`."""
        table = read_steps_table(self.config.get("sc_cfg_scale_by_steps"), "sc_cfg_scale_by_steps")
        return float(table.get(as_int(num_inference_steps), self.sc_cfg_scale))

    def _scale(self, sc_cfg_scale: float | None, num_inference_steps: int | None = None) -> float:
        """The SC-CFG scale w a call runs at: its own, or (`None`) the pipeline's for its NFE (without one: default)."""
        if sc_cfg_scale is not None:
            return sc_cfg_scale
        return self.sc_cfg_scale if num_inference_steps is None else self.sc_cfg_scale_for(num_inference_steps)

    def denoise(self, batch_size: int = 1, num_inference_steps: int = 32, *args, sc_cfg_scale=None, **kwargs):
        """[`LanguageFlowPipeline.denoise`] at the call's SC-CFG scale, or (`None`) the pipeline's for its NFE."""
        scale = self._scale(sc_cfg_scale, num_inference_steps)
        return super().denoise(batch_size, num_inference_steps, *args, sc_cfg_scale=scale, **kwargs)

    def _predict(self, model_input, timestep, self_conditioning, sc_cfg_scale: float | None = None):
        output = self._call_network(model_input, timestep, self_conditioning, self._scale(sc_cfg_scale))
        return output.sample.float(), None

    def _tokens(
        self, latents, last_logits, generator, sc_cfg_scale: float | None = None, decode_temperature: float = 0.0
    ):
        decode = self._call_network(latents, 1.0, None, self._scale(sc_cfg_scale), decoder_step_active=True)
        if decode_temperature == 0.0:
            ids = decode.logits.argmax(dim=-1)
        else:
            ids = sample_tokens(decode.logits, decode_temperature, generator)
        eos, pad = self.tokenizer.eos_token_id, self.tokenizer.pad_token_id
        return ids if eos is None else mask_after_eos(ids, eos, pad if pad is not None else eos)

    @classmethod
    def from_official(
        cls,
        checkpoint: str | os.PathLike,
        tokenizer=None,
        max_length: int | None = None,
        official_id: str | None = None,
        sde_gamma: float | None = None,
        sc_cfg_scale: float | None = None,
        **kwargs,
    ) -> "ELFPipeline":
        """
        Builds a pipeline from an official ELF PyTorch checkpoint (see [`load_official_elf`]) with the official
        sampler at the checkpoint's official settings: for a released checkpoint (recognised by its Hub id, a Hugging
        Face cache path of it, or `official_id`) those of the table of released checkpoints (`ELF-B-PD`'s γ and w
        per NFE included); for another, the `sampling_configs` of the trainer's `config.yml` beside it.
        `pipe.save_pretrained(folder)` then writes the complete pipeline folder with a model card naming the source
        and every setting's origin (what `untied-sc convert elf` does). The conditional checkpoints (XSum, WMT14
        De-En) are refused, naming [`ELFText2TextPipeline.from_official`], which builds them: this pipeline takes no
        prompts.

        Args:
            checkpoint: `checkpoint_<step>` file, folder, or Hub repo id.
            tokenizer: a tokenizer or its name/path; `None` (default): the checkpoint's (`t5-small` for the released
                models, as the official code loads it; else its config.yml's `tokenizer_name` or
                `encoder_model_name`).
            max_length (`int`, *optional*): the model's sequence length; see [`load_official_elf`] (read where the
                checkpoint's config or the table records it, required otherwise).
            official_id (`str`, *optional*): the Hub id of the released checkpoint a local copy is.
            sde_gamma (`float`, *optional*): the SDE churn γ at every NFE, over the recorded ones (required when
                nothing records them).
            sc_cfg_scale (`float`, *optional*): the SC-CFG scale w at every NFE, likewise.
            kwargs: `weights`, `allow_pickle` ([`load_official_elf`]) and the Hub download's (`revision`,
                `cache_dir`, `token`, ...); `sampler_statistics` (a statistics folder or repo id) and
                `sampler_statistics_revision` install published statistics as `from_pretrained` does.
        """
        from .official import build_elf

        statistics = kwargs.pop("sampler_statistics", None)
        revision = kwargs.pop("sampler_statistics_revision", None)
        pipe = build_elf(cls, checkpoint, tokenizer, max_length, official_id, sde_gamma, sc_cfg_scale, **kwargs)
        return cls._attach_official_statistics(pipe, statistics, revision, kwargs)
