"""The released ELF and LangFlow checkpoints and their official settings: one typed record per checkpoint.

Every value carries where it was read: a paper table, an official config file or an official script line (the
repositories at the commits named in `ELF_PYTORCH`, `ELF_DISTILLATION` and `LANGFLOW`). `untied-sc convert` and
`ELFPipeline.from_official` / `LangFlowPipeline.from_official` build a pipeline from these; a checkpoint not listed
takes its settings from its own config files (see `official_settings.py`).

A checkpoint is recognised by its Hub repo id (case-insensitive, as the Hub treats ids), by a local path inside a
Hugging Face cache snapshot of such a repo (`.../models--OWNER--NAME/snapshots/COMMIT/...`), or when the caller
names the repo id it is a copy of (`--official-id`). The weights themselves carry no name, so no other local file is
recognised: a fingerprint of the architecture would take a user's own model of the same shape for a released one.

This module imports the standard library only.
"""

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, Literal, TypeVar

from ..per_nfe import write_steps_table


T = TypeVar("T")

# The official repositories, at the commits read (docs: /work/shared/research/upstream.md).
ELF_PYTORCH = "github.com/lillian039/ELF@pytorch_elf (b29d883)"
ELF_DISTILLATION = "github.com/lillian039/ELF@distillation (346f00b)"
LANGFLOW = "github.com/nealchen2003/LangFlow@main (a712b08)"
UNTIED_SC_PAPER = "the Untied Self-Conditioning paper's protocol (arXiv 2608.22244; not in the official code)"


@dataclass(frozen=True)
class Sourced(Generic[T]):
    """A setting and where it was read."""

    value: T
    source: str


@dataclass(frozen=True)
class StepValue:
    """A setting at one number of steps (NFE), and where it was read."""

    steps: int
    value: float
    source: str


def by_steps(values: tuple[StepValue, ...]) -> dict[str, float]:
    """A per-NFE table as the configs key it (`{"8": 2.0, ...}`)."""
    return write_steps_table({v.steps: v.value for v in values})


@dataclass(frozen=True)
class ELFSampling:
    """
    The official ELF sampler's settings for one checkpoint.

    Args:
        sde_gamma_by_steps: the SDE churn γ at the step counts an official config (or the paper) lists; another step
            count takes the scheduler's default rule ([`default_sde_gamma`]).
        sc_cfg_scale_by_steps: the SC-CFG scale w at the step counts an official config lists.
        sc_cfg_scale: w at any other step count (the pipeline's `sc_cfg_scale`).
        noise_scale, p_mean, p_std, t_eps: the interpolant's noise scale, the logit-normal time grid and the velocity
            clamp (the training config's `denoiser_noise_scale`, `denoiser_p_mean`, `denoiser_p_std`, `t_eps`).
        sde_gamma: γ at every step count, where one was given for all (it wins over `sde_gamma_by_steps`).
    """

    sde_gamma_by_steps: tuple[StepValue, ...]
    sc_cfg_scale_by_steps: tuple[StepValue, ...]
    sc_cfg_scale: Sourced[float]
    noise_scale: Sourced[float]
    p_mean: Sourced[float]
    p_std: Sourced[float]
    t_eps: Sourced[float]
    sde_gamma: Sourced[float] | None = None


@dataclass(frozen=True)
class LangFlowSampling:
    """The official LangFlow sampler's settings: the quantile grid's end points (the Gumbel proposal is in the weights)."""

    quantile_eps: Sourced[float]
    proposal_source: str = (
        "the checkpoint's weights (`proposal.loc`, `proposal.scale`), as the official sampler reads them"
    )


@dataclass(frozen=True)
class ELFConditioning:
    """
    How a conditional ELF checkpoint takes its source text (`ELFText2TextPipeline`'s settings besides the sampler's).

    Args:
        text_encoder: the frozen encoder's Hub id, as the official code loads it (`T5EncoderModel.from_pretrained`).
        max_source_length: the source positions (the training config's `max_input_length`).
        guidance_scale: the classifier-free guidance scale of the official evaluation (`cfgs`).
        latent_mean, latent_std: the encoder latents' normalisation (the training config's).
        pad_token: `"eos"` or `"pad"`, the padding id (the training config's `pad_token`).
    """

    text_encoder: Sourced[str]
    max_source_length: Sourced[int]
    guidance_scale: Sourced[float]
    latent_mean: Sourced[float]
    latent_std: Sourced[float]
    pad_token: Sourced[str]


@dataclass(frozen=True)
class OfficialCheckpoint:
    """
    One released checkpoint.

    Args:
        repo_id: its Hub repo id.
        family: `"elf"` or `"langflow"`.
        description: what it is, for the model card.
        tokenizer: the tokenizer's Hub id, as the official code loads it.
        max_length: the sequence length it was trained at.
        sampling: the official sampler's settings.
        conditional_task: the task of a checkpoint that needs a prompt (`None`: unconditional).
        evaluation_steps: the step counts the official evaluation reports, for the model card.
        conditioning: how a conditional checkpoint takes its source (`None`: unconditional).
    """

    repo_id: str
    family: Literal["elf", "langflow"]
    description: str
    tokenizer: Sourced[str]
    max_length: Sourced[int]
    sampling: ELFSampling | LangFlowSampling
    conditional_task: str | None = None
    evaluation_steps: Sourced[tuple[int, ...]] | None = None
    conditioning: ELFConditioning | None = None


def _elf_train_config(size: str) -> str:
    return f"{ELF_PYTORCH} src/configs/training_configs/train_owt_ELF-{size}.yml"


ELF_UNCOND_SAMPLING = f"{ELF_PYTORCH} src/configs/sampling_configs/uncond_sampling_configs.yml"
ELF_FEWSTEP_SAMPLING = f"{ELF_DISTILLATION} src/configs/sampling_configs/uncond_fewstep_sampling_configs.yml"
ELF_TOKENIZER = (
    f"{ELF_PYTORCH} src/eval.py line 102, AutoTokenizer.from_pretrained(config.tokenizer_name or "
    "config.encoder_model_name), with encoder_model_name: t5-small in the training config"
)


def _elf_base_sampling(size: str) -> ELFSampling:
    train = _elf_train_config(size)
    return ELFSampling(
        sde_gamma_by_steps=(
            StepValue(8, 2.0, UNTIED_SC_PAPER),
            StepValue(16, 2.0, UNTIED_SC_PAPER),
            StepValue(32, 1.5, ELF_UNCOND_SAMPLING),
            StepValue(64, 1.0, ELF_UNCOND_SAMPLING),
        ),
        sc_cfg_scale_by_steps=(),  # one w for every NFE
        sc_cfg_scale=Sourced(3.0, f"{ELF_UNCOND_SAMPLING} (self_cond_cfg_scales: [3] at 32 and 64 steps)"),
        noise_scale=Sourced(2.0, f"{train} (denoiser_noise_scale)"),
        p_mean=Sourced(-1.5, f"{train} (denoiser_p_mean)"),
        p_std=Sourced(0.8, f"{train} (denoiser_p_std)"),
        t_eps=Sourced(0.05, f"{train} (t_eps)"),
    )


def _elf_owt(size: str, parameters: str) -> OfficialCheckpoint:
    return OfficialCheckpoint(
        repo_id=f"embedded-language-flows/ELF-{size}-owt-torch",
        family="elf",
        description=f"ELF-{size} ({parameters} parameters), unconditional, OpenWebText (T5 latents)",
        tokenizer=Sourced("t5-small", ELF_TOKENIZER),
        max_length=Sourced(1024, f"{_elf_train_config(size)} (max_length)"),
        sampling=_elf_base_sampling(size),
        evaluation_steps=Sourced((32, 64), ELF_UNCOND_SAMPLING),
    )


def _elf_pd_sampling() -> ELFSampling:
    distill = f"{ELF_DISTILLATION} src/configs/training_configs/distill_curriculum_ELF-B.yml"
    # The official config also lists 1 step; the pipelines need at least 2 network evaluations.
    few, more = (2, 4, 8), (16, 32)
    return ELFSampling(
        sde_gamma_by_steps=tuple(StepValue(n, 1.5 if n in few else 2.0, ELF_FEWSTEP_SAMPLING) for n in few + more),
        sc_cfg_scale_by_steps=tuple(StepValue(n, 2.5 if n in few else 2.0, ELF_FEWSTEP_SAMPLING) for n in few + more),
        # a step count the config does not list: the few-step value (the student was distilled for few steps)
        sc_cfg_scale=Sourced(2.5, f"{ELF_FEWSTEP_SAMPLING} (its value up to 8 steps)"),
        noise_scale=Sourced(2.0, f"{distill} (denoiser_noise_scale)"),
        p_mean=Sourced(-1.5, f"{distill} (denoiser_p_mean)"),
        p_std=Sourced(0.8, f"{distill} (denoiser_p_std)"),
        t_eps=Sourced(0.05, f"{distill} (t_eps)"),
    )


ELF_COND_SAMPLING = f"{ELF_PYTORCH} src/configs/sampling_configs/cond_sampling_configs.yml"
ELF_TEXT_ENCODER = (
    f"{ELF_PYTORCH} src/eval.py line 120, get_encoder(config.encoder_model_name), which runs "
    "T5EncoderModel.from_pretrained(model_name) (src/modules/t5_encoder.py line 51)"
)


def _elf_conditional(task: str, name: str, max_length: int, max_source_length: int) -> OfficialCheckpoint:
    # The two conditional training configs set the same keys on the same lines.
    train = f"{ELF_PYTORCH} src/configs/training_configs/train_{name}_ELF-B.yml"
    sampling = ELFSampling(
        sde_gamma_by_steps=(),
        sc_cfg_scale_by_steps=(),
        sc_cfg_scale=Sourced(1.0, f"{ELF_COND_SAMPLING} line 4 (self_cond_cfg_scales: [1])"),
        noise_scale=Sourced(2.0, f"{train} line 23 (denoiser_noise_scale)"),
        p_mean=Sourced(-1.5, f"{train} line 21 (denoiser_p_mean)"),
        p_std=Sourced(0.8, f"{train} line 22 (denoiser_p_std)"),
        t_eps=Sourced(0.05, f"{train} line 24 (t_eps)"),
        sde_gamma=Sourced(0.0, f"{ELF_COND_SAMPLING} line 1 (sampling_method: ode: no churn)"),
    )
    conditioning = ELFConditioning(
        text_encoder=Sourced("t5-small", f"{ELF_TEXT_ENCODER}, with encoder_model_name: t5-small ({train} line 9)"),
        max_source_length=Sourced(max_source_length, f"{train} line 5 (max_input_length)"),
        guidance_scale=Sourced(2.0, f"{ELF_COND_SAMPLING} line 3 (cfgs: [2])"),
        latent_mean=Sourced(0.0, f"{train} line 10 (latent_mean)"),
        latent_std=Sourced(0.2, f"{train} line 11 (latent_std)"),
        pad_token=Sourced("eos", f"{train} line 6 (pad_token)"),
    )
    return OfficialCheckpoint(
        repo_id=f"embedded-language-flows/ELF-B-{name}-torch",
        family="elf",
        description=f"ELF-B, conditional: {task}",
        tokenizer=Sourced("t5-small", ELF_TOKENIZER),
        max_length=Sourced(max_length, f"{train} line 4 (max_length)"),
        sampling=sampling,
        conditional_task=task,
        evaluation_steps=Sourced((64,), f"{ELF_COND_SAMPLING} line 2 (num_sampling_steps: [64])"),
        conditioning=conditioning,
    )


LANGFLOW_GRID = f"{LANGFLOW} langflow/model.py line 520, linspace(1 - eps, eps, num_steps) with eps = 1e-5"


def _langflow(name: str, corpus: str, tokenizer: Sourced[str], max_length: int, steps: int) -> OfficialCheckpoint:
    return OfficialCheckpoint(
        repo_id=f"Continuous-Rivals-Discrete/langflow-{name}",
        family="langflow",
        description=f"LangFlow DiT-small (12 blocks, 768 wide), unconditional, {corpus}",
        tokenizer=tokenizer,
        max_length=Sourced(max_length, "the checkpoint's config.json (model_length)"),
        sampling=LangFlowSampling(quantile_eps=Sourced(1e-5, LANGFLOW_GRID)),
        evaluation_steps=Sourced((steps,), f"{LANGFLOW} gen_ppl.py docstring (--num-steps {steps})"),
    )


OFFICIAL_CHECKPOINTS: tuple[OfficialCheckpoint, ...] = (
    _elf_owt("B", "105M"),
    _elf_owt("M", "342M"),
    _elf_owt("L", "652M"),
    OfficialCheckpoint(
        repo_id="embedded-language-flows/ELF-B-PD-owt-torch",
        family="elf",
        description="ELF-B after five rounds of progressive distillation (few-step student), unconditional, OpenWebText",
        tokenizer=Sourced("t5-small", ELF_TOKENIZER),
        max_length=Sourced(1024, f"{ELF_DISTILLATION} src/configs/training_configs/distill_curriculum_ELF-B.yml"),
        sampling=_elf_pd_sampling(),
        evaluation_steps=Sourced((2, 4, 8, 16, 32), ELF_FEWSTEP_SAMPLING),
    ),
    _elf_conditional("summarisation (XSum)", "xsum", 1088, 1024),
    _elf_conditional("translation (WMT14 De-En)", "de-en", 128, 64),
    _langflow(
        "owt",
        "OpenWebText",
        Sourced("gpt2", f"{LANGFLOW} inference.py line 68, AutoTokenizer.from_pretrained('gpt2')"),
        1024,
        1024,
    ),
    _langflow(
        "lm1b",
        "LM1B",
        Sourced("bert-base-uncased", f"{LANGFLOW} gen_ppl.py line 6 (--tokenizer bert-base-uncased)"),
        128,
        128,
    ),
)
_BY_ID = {checkpoint.repo_id.lower(): checkpoint for checkpoint in OFFICIAL_CHECKPOINTS}
# A file or folder inside a Hugging Face cache snapshot: `models--OWNER--NAME/snapshots/COMMIT`.
_CACHE_SNAPSHOT = re.compile(r"models--(?P<owner>[^/]+?)--(?P<name>[^/]+)/snapshots/(?P<commit>[0-9a-f]{40})(/|$)")


def official_checkpoint(repo_id: str) -> OfficialCheckpoint | None:
    """The record of a released checkpoint by its Hub repo id (case-insensitive); `None` for any other id."""
    return _BY_ID.get(str(repo_id).lower())


def cache_snapshot(path: str | Path) -> tuple[str, str] | None:
    """(repo id, commit) of a path inside a Hugging Face cache snapshot; `None` for any other path."""
    match = _CACHE_SNAPSHOT.search(Path(path).expanduser().resolve().as_posix())
    return None if match is None else (f"{match['owner']}/{match['name']}", match["commit"])


def official_ids(family: str, conditional: bool = False) -> list[str]:
    """The repo ids of the released unconditional (or, `conditional`, conditional) checkpoints of `family`, for
    messages."""
    return [
        c.repo_id
        for c in OFFICIAL_CHECKPOINTS
        if c.family == family and (c.conditional_task is not None) == conditional
    ]
