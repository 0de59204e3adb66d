"""LangFlowPipeline: unconditional sampling from a LangFlow model."""

import os
from dataclasses import replace

import torch

from ..schedulers.run_context import RunContext
from .checks import check_finite_number
from .outputs import LanguageFlowPipelineOutput
from .pipeline_utils import LanguageFlowPipeline, call_diversity


class LangFlowPipeline(LanguageFlowPipeline):
    r"""
    Unconditional text generation with LangFlow.

    Each step calls the network once at γ_k with the scheduler's self-conditioning input; the clean prediction
    handed to the scheduler is x̂ = softmax(logits / T)·E_norm, T the `temperature` of the call (1 = the official
    sampler; T < 1 sharpens x̂, T > 1 flattens it: the diversity control). The tokens are the argmax of the final
    evaluation's logits (at γ_min; there is no extra denoising step), which T does not change. NFE = number of steps.

    Texts are decoded with special tokens kept, as the official Gen. PPL protocol does.

    Args:
        transformer ([`LangFlowTransformerModel`]): the network.
        scheduler ([`LangFlowScheduler`] or [`UntiedSelfConditioningScheduler`]): the sampler.
        tokenizer (`PreTrainedTokenizerBase`): the tokenizer of the model's vocabulary.
        sampler_statistics ([`SamplerStatistics`], *optional*): calibration for the untied scheduler.
        ace_statistics ([`ACEStatistics`], *optional*): ACE's repetition direction for the ACE schedulers
            (`untied-sc ace`).
    """

    family = "langflow"
    network_knobs = ("temperature",)
    _skip_special_tokens = False  # the official Gen. PPL protocol scores the texts with their special tokens

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
        temperature: float | None = None,
    ) -> LanguageFlowPipelineOutput | tuple:
        r"""
        Samples `batch_size` sequences with `num_inference_steps` network evaluations.

        Args:
            batch_size (`int`, defaults to 1): number of samples.
            num_inference_steps (`int`, defaults to 32): NFE, the number of network evaluations (≥ 2); the last
                one is the final evaluation whose logits give the tokens.
            generator (`torch.Generator`, *optional*): z_0, the only random draw, comes from it (`None`: torch's
                global generator of the execution device, as diffusers), on the generator's device: a CPU generator gives the official CPU z_0 on any
                device; a CUDA one draws z_0 on its GPU (what the official code does on CUDA, from the CUDA RNG).
            latents (`torch.Tensor` of shape `(batch_size, length, hidden_size)`, *optional*): the initial latent
                z_0.
            output_type (`str`, defaults to `"text"`): `"text"` (texts and token ids), `"seq"` (token ids) or
                `"latent"` (final latents only).
            return_dict (`bool`, defaults to `True`): return a [`LanguageFlowPipelineOutput`] or a tuple.
            callback_on_step_end (`Callable`, `PipelineCallback` or `MultiPipelineCallbacks`, *optional*): called
                after every step as `callback(pipe, step_index, timestep, callback_kwargs)`; may return
                `{"latents": z}` to continue from z.
            callback_on_step_end_tensor_inputs (`list[str]`, defaults to `["latents"]`): tensors passed to it
                (`"latents"`, `"prediction"`).
            temperature (`float`, *optional*): the softmax temperature T > 0 of the clean prediction
                x̂ = softmax(logits / T)·E_norm handed to the scheduler at every step: the diversity control of the
                official sampler (GenPPL–entropy curves). T = 1 is bit-identical to the official sampler. The final
                tokens are the argmax of the logits, which T does not change. `None` (default): 1, or, for an untied
                scheduler whose coefficients come from `coefficients_by_steps`, the entropy-matching temperature
                `untied-sc tune` stored there for this NFE (the untied sampler then runs at official's entropy).

        Returns:
            [`LanguageFlowPipelineOutput`] or `tuple`: `(texts, sequences, latents)`.
        """
        if temperature is None:
            temperature = call_diversity(self.scheduler, "temperature", num_inference_steps, 1.0)
        if not (isinstance(temperature, int | float) and temperature > 0):
            raise ValueError(f"temperature must be a positive number, got {temperature!r}.")
        check_finite_number("temperature", temperature, "1 is the official sampler")
        return self._generate(
            batch_size,
            num_inference_steps,
            generator,
            latents,
            output_type,
            return_dict,
            callback_on_step_end,
            callback_on_step_end_tensor_inputs,
            # T = 1 is `_predict`'s default: the untempered, official network call
            network_kwargs={} if temperature == 1 else {"temperature": float(temperature)},
            decode_kwargs={},
        )

    @property
    def latent_shape(self) -> tuple[int, int]:
        return self.transformer.config.max_length, self.transformer.config.hidden_size

    def _run_context(self, context: RunContext) -> RunContext:
        return replace(context, proposal=self.transformer.gumbel_parameters())

    def _network_session(self):
        # E_norm once per loop, not twice per step (see `reuse_embedding_matrix`); a transformer without it runs as is
        reuse = getattr(self.transformer, "reuse_embedding_matrix", None)
        return reuse() if reuse is not None else super()._network_session()

    def _predict(self, model_input, timestep, self_conditioning, temperature: float = 1.0):
        logits = self._call_network(model_input, timestep, self_conditioning).logits
        tempered = logits if temperature == 1.0 else logits.float() / temperature
        return self.transformer.clean_prediction(tempered), logits

    def _tokens(self, latents, last_logits, generator):
        return last_logits.argmax(dim=-1)

    @classmethod
    def from_official(
        cls, source: str | os.PathLike, tokenizer=None, official_id: str | None = None, **kwargs
    ) -> "LangFlowPipeline":
        """
        Builds a pipeline from an official LangFlow folder or repo (see [`load_official_langflow`]) with the official
        sampler: the Gumbel proposal of the weights, the official grid's end points. `pipe.save_pretrained(folder)`
        then writes the complete pipeline folder with a model card (what `untied-sc convert langflow` does).

        Args:
            source: folder or Hub repo id (`Continuous-Rivals-Discrete/langflow-owt`).
            tokenizer: a tokenizer or its name/path; `None` (default): the released checkpoint's, as the official
                code loads it (`"gpt2"` for OWT, `"bert-base-uncased"` for LM1B), required for another checkpoint
                (its config.json names none).
            official_id (`str`, *optional*): the Hub id of the released checkpoint a local copy is.
            kwargs: the Hub download's (`revision`, `cache_dir`, `token`, ...); `sampler_statistics` (a statistics
                folder or repo id) and `sampler_statistics_revision` install published statistics as
                `from_pretrained` does.
        """
        from .official import build_langflow

        statistics = kwargs.pop("sampler_statistics", None)
        revision = kwargs.pop("sampler_statistics_revision", None)
        pipe = build_langflow(cls, source, tokenizer, official_id, **kwargs)
        return cls._attach_official_statistics(pipe, statistics, revision, kwargs)
