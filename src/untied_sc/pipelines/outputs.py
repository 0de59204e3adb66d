"""What the language flow pipelines return: the call's output, and the denoising loop's step and result."""

from dataclasses import dataclass

import torch
from diffusers.utils import BaseOutput


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


@dataclass
class DenoisingStep:
    """
    One step k of [`LanguageFlowPipeline.denoise`], as its `step_callback` sees it.

    Args:
        index (`int`): k, the position of the step in the scheduler's timesteps.
        timestep (`torch.Tensor`): t_k.
        sample (`torch.Tensor`): z_k, the latent the step started from.
        model_input (`torch.Tensor`): the network's latent input, `scheduler.scale_model_input(z_k, t_k)` (ELF
            re-noises z_k; LangFlow passes it through).
        self_conditioning (`torch.Tensor`, *optional*): the network's self-conditioning input (`None` at the first
            step, or with a scheduler that has none).
        prediction (`torch.Tensor`): the clean prediction handed to `scheduler.step`.
        logits (`torch.Tensor`, *optional*): the network's token logits (LangFlow; `None` for ELF).
        latents (`torch.Tensor`): z_{k+1}, the scheduler's output.
    """

    index: int
    timestep: torch.Tensor
    sample: torch.Tensor
    model_input: torch.Tensor
    self_conditioning: torch.Tensor | None
    prediction: torch.Tensor
    logits: torch.Tensor | None
    latents: torch.Tensor


@dataclass
class DenoisingOutput:
    """
    Output of [`LanguageFlowPipeline.denoise`].

    Args:
        latents (`torch.Tensor` of shape `(batch, length, dim)`): the final latents.
        logits (`torch.Tensor`, *optional*): the logits of the last network evaluation (LangFlow's tokens are their
            argmax); `None` for ELF, whose tokens come from a separate decode pass.
    """

    latents: torch.Tensor
    logits: torch.Tensor | None = None
