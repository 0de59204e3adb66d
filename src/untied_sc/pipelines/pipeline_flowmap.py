"""FlowMapPipeline: unconditional sampling from the self-conditioned flow-map family (FMLM*, ELF*, the ELF teacher)."""

import os
from pathlib import Path

import torch
from diffusers import DiffusionPipeline

from ..hub import HUB_KWARGS, resolve_local
from ..models.flowmap_transformer import FlowMapTransformerModel, read_official_flowmap
from ..schedulers.flowmap_statistics import FlowMapStatistics
from ..schedulers.noise import global_generator
from ..schedulers.run_context import RunContext, start_run
from ..schedulers.scheduling_elf import ELFScheduler
from ..schedulers.scheduling_flowmap import CDEQScheduler, FlowMapLMScheduler
from .artifact_checks import check_pipeline_folder, check_statistics_folder
from .conversion import save_atomically
from .outputs import LanguageFlowPipelineOutput
from .saving import FlowMapStatisticsSavingMixin
from .statistics_repo import BASE_CHECKPOINT_FILE, BaseCheckpoint


# The SC-CFG scale w of the official evaluation configs: FMLM* 5.0 (`configs/sampling_configs/owt_FMLM_star.yml`),
# ELF* 3.0 (`owt_ELF_star.yml`), the ELF teacher 3 (`owt_ELF_b.yml`).
DEFAULT_SC_CFG_SCALE = {"fmlm-star": 5.0, "elf-star": 3.0, "elf": 3.0}
# The default step counts, the largest the official sampling configs run: FMLM* 1 / 2 / 4 (`owt_FMLM_star.yml`),
# ELF* 8 / 16 / 32 (`owt_ELF_star.yml`), the teacher 32 / 64 (`owt_ELF_b.yml`; 32 as the README's evaluation).
DEFAULT_STEPS = {"fmlm-star": 4, "elf-star": 32, "elf": 32}
# The teacher's SDE churn: 32 steps → 1.5, 64 → 1.0 (`owt_ELF_b.yml`); other counts as `ELFScheduler` interpolates.
TEACHER_SDE_GAMMA = {"32": 1.5, "64": 1.0}
OUTPUT_TYPES = ("text", "seq", "latent")
STATISTICS = "flowmap_statistics"  # the component's name, and its folder's in a pipeline folder


def load_flowmap_statistics(
    source: str | os.PathLike, revision: str | None = None, **hub_kwargs
) -> tuple[FlowMapStatistics, Path]:
    """
    The flow-map statistics of `source`, a local folder or Hub repo id (downloaded at `revision`, its own, with
    `hub_kwargs`: `token`, `cache_dir`, ...): a pipeline folder saved with them (their `flowmap_statistics/`) or the
    component's own folder (`pipe.flowmap_statistics.save_pretrained(DIR)`), checked whole. Returns them and the
    config file they were read from.
    """
    hub_kwargs = {key: value for key, value in hub_kwargs.items() if key in HUB_KWARGS and key != "revision"}
    try:
        folder = resolve_local(
            source,
            [f"{STATISTICS}/*", "config.json", "*.safetensors", BASE_CHECKPOINT_FILE],
            revision=revision,
            **hub_kwargs,
        )
    except FileNotFoundError as error:
        raise FileNotFoundError(f"The flow-map statistics {str(source)!r} could not be read: {error}") from None
    component = folder / STATISTICS if (folder / STATISTICS / "config.json").is_file() else folder
    if not (component / "config.json").is_file():
        raise FileNotFoundError(
            f"{str(source)!r} ({folder}) holds no flow-map statistics: no {STATISTICS}/config.json. Give a pipeline "
            "folder or repo saved with them (`pipe.save_pretrained`) or their own folder "
            "(`pipe.flowmap_statistics.save_pretrained(DIR)`)."
        )
    check_statistics_folder(component, FlowMapStatistics)
    statistics = FlowMapStatistics.from_pretrained(component)
    # a statistics folder's (`save_flowmap_statistics`) record of the weights they belong to
    record = folder / BASE_CHECKPOINT_FILE
    if component != folder and record.is_file():
        base = BaseCheckpoint.from_json(record.read_text(encoding="utf-8"), str(record))
        if base.model_fingerprint != statistics.config.model_fingerprint:
            raise ValueError(
                f"{record} records fingerprint {base.model_fingerprint!r}, its {STATISTICS}/ "
                f"{statistics.config.model_fingerprint!r}: the folder mixes two computations. Save the statistics "
                "again with `pipe.save_flowmap_statistics(DIR)`."
            )
    return statistics, component / "config.json"


class FlowMapPipeline(FlowMapStatisticsSavingMixin, DiffusionPipeline):
    r"""
    Samples token sequences from an FMLM*, ELF* or ELF-teacher network with one of the official samplers: the
    scheduler says which ([`FlowMapLMScheduler`]: ctm or flow_map, for FMLM*; [`CDEQScheduler`]: cdeq, for ELF*;
    [`ELFScheduler`]: the teacher's self-conditioned SDE, its grid drawn from the generator first). The final latent
    is decoded by the network's own decoder head at t = s = 1 with a zero self-conditioning input (official
    `dlm_decode_batch`), argmax per position.

    Randomness as the official evaluation (`eval_lightning.py` lines 238-264), one generator for everything: the
    random grid (cdeq, the teacher), then z_0 = noise_scale·randn(B, L, D), then the sampler's draws in step order.

    Args:
        transformer ([`FlowMapTransformerModel`]): the network.
        scheduler ([`FlowMapLMScheduler`], [`CDEQScheduler`] or [`ELFScheduler`]): the sampler.
        tokenizer (*optional*): the GPT-2 tokenizer, for `output_type="text"`.
        sc_cfg_scale (`float`, *optional*): the default SC-CFG scale w (5.0 for FMLM*, 3.0 for ELF* and the teacher).
        flowmap_statistics ([`FlowMapStatistics`], *optional*): the statistics of the untied transform
            ([`UntiedFlowMapLMScheduler`] at η_R > 0; `untied_sc.calibration.flowmap.flowmap_statistics` computes
            them). Every call hands them to the scheduler in its [`RunContext`], where they are checked against the
            transformer; `save_pretrained` writes them to the folder's `flowmap_statistics/`.
    """

    family = "flowmap"
    model_cpu_offload_seq = "transformer"
    _optional_components = ["tokenizer", STATISTICS]

    def __init__(
        self,
        transformer,
        scheduler,
        tokenizer=None,
        sc_cfg_scale: float | None = None,
        flowmap_statistics: FlowMapStatistics | None = None,
    ):
        super().__init__()
        if not isinstance(transformer, FlowMapTransformerModel):
            raise TypeError(f"transformer must be a FlowMapTransformerModel, got {type(transformer).__name__}.")
        if not isinstance(scheduler, FlowMapLMScheduler | CDEQScheduler | ELFScheduler):
            raise TypeError(
                "scheduler must be a FlowMapLMScheduler (FMLM*), CDEQScheduler (ELF*) or ELFScheduler (the ELF "
                f"teacher), got {type(scheduler).__name__}."
            )
        if flowmap_statistics is not None and not isinstance(flowmap_statistics, FlowMapStatistics):
            raise TypeError(
                "flowmap_statistics must be a FlowMapStatistics (`untied_sc.calibration.flowmap.flowmap_statistics`), "
                f"got {type(flowmap_statistics).__name__}."
            )
        self.register_modules(
            transformer=transformer, scheduler=scheduler, tokenizer=tokenizer, flowmap_statistics=flowmap_statistics
        )
        self.register_to_config(sc_cfg_scale=sc_cfg_scale)

    @property
    def variant(self) -> str:
        if isinstance(self.scheduler, ELFScheduler):
            return "elf"
        return "elf-star" if isinstance(self.scheduler, CDEQScheduler) else "fmlm-star"

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs) -> "FlowMapPipeline":
        """
        diffusers' `from_pretrained`, for a local folder or a Hub repo id: a repo id is downloaded whole first
        ([`resolve_local`]; `revision`, `token`, `cache_dir`... apply), since diffusers' own download would look for
        the components' `untied_sc` module files in the repo. The folder is checked first (`check_pipeline_folder`:
        every listed component whole, the flow-map statistics' tensors and format version), and the statistics
        loaded are checked against the transformer, naming their file.

        `flowmap_statistics` given as a folder or repo id (a str or path; a pipeline folder saved with them, or their
        own folder) loads the pipeline with those statistics instead of the folder's ([`load_flowmap_statistics`];
        `flowmap_statistics_revision` is their repo's revision, `token` and `cache_dir` apply to it too). A
        [`FlowMapStatistics`] object (or `None`) is used as it is, as diffusers does.
        """
        statistics_revision = kwargs.pop(f"{STATISTICS}_revision", None)
        source = kwargs.get(STATISTICS)
        if not isinstance(source, str | os.PathLike):
            if statistics_revision is not None:
                raise TypeError(
                    f"{STATISTICS}_revision is the revision of a statistics repo: give the repo too, "
                    f"`from_pretrained(..., {STATISTICS}='owner/name', {STATISTICS}_revision=...)`."
                )
            source = None
        hub_kwargs = {key: kwargs.pop(key) for key in HUB_KWARGS if key in kwargs}
        where = None
        if source is not None:  # the small download first: a wrong or unreachable repo fails at once
            shared = {key: value for key, value in hub_kwargs.items() if key != "revision"}
            kwargs[STATISTICS], where = load_flowmap_statistics(source, revision=statistics_revision, **shared)
        folder = resolve_local(pretrained_model_name_or_path, **hub_kwargs)
        check_pipeline_folder(folder, cls, passed=set(kwargs))
        pipe = super().from_pretrained(folder, **kwargs)
        statistics = pipe.flowmap_statistics
        if statistics is not None and (where is not None or STATISTICS not in kwargs):
            statistics.check_model(pipe.transformer, where=str(where or folder / STATISTICS / "config.json"))
        return pipe

    @classmethod
    def from_official(
        cls, source: str | os.PathLike, variant: str, tokenizer=None, **load_kwargs
    ) -> "FlowMapPipeline":
        """
        The pipeline of an official FMLM*/ELF*/teacher checkpoint ([`read_official_flowmap`], `load_kwargs` its
        arguments: `max_length`, `self_conditioning`, `weights`, `allow_pickle`, Hub `revision`...): the network, the
        official sampler of `variant` (FMLM*: ctm in the checkpoint's self-conditioning regime; ELF*: cdeq; the
        teacher: ELF's SDE) at the official settings and the official SC-CFG scale. `tokenizer`: a tokenizer, or
        its Hub id or folder (the released models use GPT-2's, `gpt2`); `None` samples ids only.
        """
        if variant not in DEFAULT_STEPS:
            raise ValueError(f"Unknown variant {variant!r}; choose one of {sorted(DEFAULT_STEPS)} (--variant).")
        if isinstance(tokenizer, str | os.PathLike):
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(tokenizer)
        model, settings = read_official_flowmap(source, variant, **load_kwargs)
        if variant == "fmlm-star":
            scheduler = FlowMapLMScheduler(self_conditioning=settings.self_conditioning)
        elif variant == "elf-star":
            scheduler = CDEQScheduler()
        else:
            scheduler = ELFScheduler(sde_gamma_by_steps=TEACHER_SDE_GAMMA)
        return cls(model, scheduler, tokenizer=tokenizer, sc_cfg_scale=DEFAULT_SC_CFG_SCALE[variant])

    def _network(self, sample, target, source, self_conditioning, scale, phase=None):
        return self.transformer(
            sample,
            target,
            source_timestep=source,
            self_conditioning=self_conditioning,
            sc_cfg_scale=scale,
            phase=phase,
        ).sample

    @torch.no_grad()
    def __call__(
        self,
        batch_size: int = 1,
        num_inference_steps: int | None = None,
        generator: torch.Generator | None = None,
        sc_cfg_scale: float | None = None,
        output_type: str = "text",
        return_dict: bool = True,
    ) -> LanguageFlowPipelineOutput | tuple:
        r"""
        Args:
            batch_size (`int`, defaults to 1): number of sequences.
            num_inference_steps (`int`, *optional*): network calls (FMLM* default 4, ELF* 32).
            generator (`torch.Generator`, *optional*): all randomness; `None`: torch's global generator.
            sc_cfg_scale (`float`, *optional*): w; default the pipeline's, else the official config's.
            output_type (`str`, defaults to `"text"`): `"text"` (needs the tokenizer), `"seq"` or `"latent"`.
            return_dict (`bool`, defaults to `True`): return a [`LanguageFlowPipelineOutput`] or a tuple.
        """
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        if output_type == "text" and self.tokenizer is None:
            raise ValueError("output_type='text' needs a tokenizer; load one, or ask for output_type='seq'.")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        steps = num_inference_steps if num_inference_steps is not None else DEFAULT_STEPS[self.variant]
        scale = sc_cfg_scale if sc_cfg_scale is not None else self.config.sc_cfg_scale
        scale = float(scale if scale is not None else DEFAULT_SC_CFG_SCALE[self.variant])
        device = self._execution_device
        config = self.transformer.config
        scheduler = self.scheduler
        context = self._run_context(global_generator(device) if generator is None else generator)
        start_run(scheduler, steps, device, context)  # cdeq and the teacher draw their grid first
        shape = (batch_size, config.max_length, config.latent_dim)
        with context.random:  # the run's end: a draw ahead not taken goes back
            latents = context.random.normal(shape, device) * scheduler.config.noise_scale
            for k, t in enumerate(self.progress_bar(scheduler.timesteps)):
                latents = self.denoise_step(latents, k, float(t), scale)
        return self.decode(latents, scale, output_type, return_dict)

    def _run_context(self, generator: torch.Generator) -> RunContext:
        """The call's [`RunContext`]: every draw from `generator`; the teacher draws its grid from the generator
        itself, first, as the official run does (not from a copy, as ELF's own sampler); the pipeline's
        `flowmap_statistics`, which the untied scheduler checks against `model`."""
        grid_generator = generator if isinstance(self.scheduler, ELFScheduler) else None
        return RunContext.for_call(
            generator,
            grid_generator=grid_generator,
            flowmap_statistics=self.flowmap_statistics,
            model=self.transformer,
        )

    def denoise_step(self, latents, k, t, scale):
        """One official step: the network call(s) the scheduler asks for, then its `step` (its draws: the run's)."""
        scheduler = self.scheduler
        if isinstance(scheduler, ELFScheduler):  # the teacher: m_k = x̂_{k−1} (zeros at k = 0), one call per step
            model_input = scheduler.scale_model_input(latents, t)
            prediction = self._network(model_input, t, t, scheduler.self_conditioning, scale)
            return scheduler.step(prediction, t, latents).prev_sample
        if isinstance(scheduler, CDEQScheduler):
            model_input = scheduler.scale_model_input(latents)
            t_b = scheduler.model_timestep()
            prediction = self._network(model_input, t_b, t_b, None, scale, phase=scheduler.config.phase)
            return scheduler.step(prediction, t, latents).prev_sample
        if scheduler.needs_prepass:
            scheduler.set_prepass(self._network(latents, t, t, None, scale))
        target = scheduler.prediction_timesteps[k]
        prediction = self._network(latents, target, t, scheduler.self_conditioning_input(latents), scale)
        return scheduler.step(prediction, t, latents).prev_sample

    def decode(self, latents, scale, output_type="seq", return_dict=True):
        """The official decode: argmax of the decoder head at t = s = 1, zero self-conditioning input."""
        if output_type == "latent":
            output = LanguageFlowPipelineOutput(latents=latents)
            return output if return_dict else (None, None, latents)
        logits = self.transformer(
            latents, 1.0, source_timestep=1.0, sc_cfg_scale=scale, decoder_step_active=True
        ).logits
        ids = torch.argmax(logits, dim=-1)
        texts = None
        if output_type == "text":
            texts = [self.tokenizer.decode(row.tolist(), skip_special_tokens=True) for row in ids.cpu()]
        if not return_dict:
            return (texts, ids, latents)
        return LanguageFlowPipelineOutput(texts=texts, sequences=ids, latents=latents)


def convert_flowmap_pipeline(
    source: str | os.PathLike,
    output_dir: str | os.PathLike,
    variant: str,
    overwrite: bool = False,
    tokenizer=None,
    **load_kwargs,
) -> FlowMapPipeline:
    """
    An official FMLM*/ELF*/teacher checkpoint → a pipeline folder that `FlowMapPipeline.from_pretrained` loads
    ([`FlowMapPipeline.from_official`]). Written whole or not at all ([`save_atomically`]); a non-empty `output_dir`
    is replaced only with `overwrite=True`.
    """
    output = Path(output_dir).expanduser()
    if output.exists() and (not output.is_dir() or any(output.iterdir())) and not overwrite:
        raise FileExistsError(f"{output} already exists and is not empty; pass --overwrite to replace it.")
    pipe = FlowMapPipeline.from_official(source, variant, tokenizer=tokenizer, **load_kwargs)
    save_atomically(pipe, output, overwrite)
    return pipe
