"""The output of every scheduler in this package."""

from dataclasses import dataclass

import torch
from diffusers.utils import BaseOutput


@dataclass
class LanguageFlowSchedulerOutput(BaseOutput):
    """
    Output of a language flow scheduler's `step`.

    Args:
        prev_sample (`torch.Tensor` of shape `(batch, length, dim)`): the latent after the update, z_{k+1}.
        pred_original_sample (`torch.Tensor` of shape `(batch, length, dim)`): the clean prediction handed to the
            solver at this step.
        self_conditioning (`torch.Tensor` of shape `(batch, length, dim)`): the self-conditioning input for the
            next network call.
    """

    prev_sample: torch.Tensor
    pred_original_sample: torch.Tensor | None = None
    self_conditioning: torch.Tensor | None = None
