"""LangFlowPipeline: unconditional sampling from a LangFlow model."""

import os

from ..models import load_official_langflow
from ..schedulers import LangFlowScheduler
from .pipeline_utils import LanguageFlowPipeline


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
    """

    _temperature = 1.0  # T of the call in progress (set by `__call__`)

    def __call__(self, *args, temperature: float = 1.0, **kwargs):
        r"""
        Samples as [`LanguageFlowPipeline.__call__`] (same arguments), with one LangFlow-specific knob.

        Args:
            temperature (`float`, defaults to 1.0): the softmax temperature T > 0 of the clean prediction
                x̂ = softmax(logits / T)·E_norm handed to the scheduler at every step: the diversity control of the
                official sampler (GenPPL–entropy curves). T = 1 is bit-identical to the official sampler. The final
                tokens are the argmax of the logits, which T does not change.
        """
        if not (isinstance(temperature, int | float) and temperature > 0):
            raise ValueError(f"temperature must be a positive number, got {temperature!r}.")
        self._temperature = float(temperature)
        try:
            return super().__call__(*args, **kwargs)
        finally:
            self._temperature = 1.0

    @property
    def latent_shape(self) -> tuple[int, int]:
        return self.transformer.config.max_length, self.transformer.config.hidden_size

    def _set_timesteps_kwargs(self, generator):
        return {**super()._set_timesteps_kwargs(generator), "proposal": self.transformer.gumbel_parameters()}

    def _predict(self, model_input, timestep, self_conditioning):
        logits = self.transformer(model_input, timestep, self_conditioning).logits
        tempered = logits if self._temperature == 1.0 else logits.float() / self._temperature
        return self.transformer.clean_prediction(tempered), logits

    def _tokens(self, latents, last_logits, generator):
        return last_logits.argmax(dim=-1)

    def _texts(self, sequences):
        return self.tokenizer.batch_decode(sequences, skip_special_tokens=False)

    @classmethod
    def from_official(cls, source: str | os.PathLike, tokenizer="gpt2", **kwargs) -> "LangFlowPipeline":
        """
        Builds a pipeline from an official LangFlow folder or repo (see [`load_official_langflow`]).

        Args:
            source: folder or Hub repo id (`Continuous-Rivals-Discrete/langflow-owt`).
            tokenizer: a tokenizer or its name/path (`"gpt2"` for OWT, `"bert-base-uncased"` for LM1B).
            kwargs: passed to [`load_official_langflow`].
        """
        if isinstance(tokenizer, str | os.PathLike):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        transformer = load_official_langflow(source, **kwargs)
        return cls(transformer=transformer, scheduler=LangFlowScheduler(), tokenizer=tokenizer)
