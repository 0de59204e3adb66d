"""The model card (README.md) of a pipeline built from an official checkpoint: where it came from and every setting
with its source."""

from ..models.official_checkpoints import ELFSampling, LangFlowSampling, Sourced


def _row(name: str, value, source: str) -> str:
    return f"| {name} | {value} | {source} |"


def _sourced(name: str, sourced: Sourced | None) -> list[str]:
    return [] if sourced is None else [_row(name, f"`{sourced.value}`", sourced.source)]


def _elf_rows(sampling: ELFSampling) -> list[str]:
    rows = []
    if sampling.sde_gamma is not None:
        rows.append(_row("SDE churn γ, every NFE", sampling.sde_gamma.value, sampling.sde_gamma.source))
    else:
        rows += [_row(f"SDE churn γ at {v.steps} steps", v.value, v.source) for v in sampling.sde_gamma_by_steps]
        rows.append(_row("SDE churn γ at other NFEs", "log2-interpolated default", "`ELFScheduler.sde_gamma_for`"))
    rows += [_row(f"SC-CFG scale w at {v.steps} steps", v.value, v.source) for v in sampling.sc_cfg_scale_by_steps]
    other = "other NFEs" if sampling.sc_cfg_scale_by_steps else "every NFE"
    rows.append(_row(f"SC-CFG scale w, {other}", sampling.sc_cfg_scale.value, sampling.sc_cfg_scale.source))
    for name, value in (
        ("noise scale", sampling.noise_scale),
        ("time grid p_mean", sampling.p_mean),
        ("time grid p_std", sampling.p_std),
        ("velocity clamp t_eps", sampling.t_eps),
    ):
        rows.append(_row(name, value.value, value.source))
    return rows


def _langflow_rows(sampling: LangFlowSampling, proposal: list[float] | None) -> list[str]:
    eps = sampling.quantile_eps
    rows = [_row("grid quantiles", f"1 − {eps.value} … {eps.value}", eps.source)]
    if proposal is not None:
        rows.append(_row("Gumbel proposal [loc, scale, cutoff]", proposal, sampling.proposal_source))
    return rows


def _conditioning_rows(conversion) -> list[str]:
    """A conditional checkpoint's source settings: the text encoder loaded, the source length, the guidance scale
    and the latent normalisation, each with its source."""
    conditioning = conversion.settings.conditioning
    rows = _sourced("text encoder (T5EncoderModel)", getattr(conversion, "text_encoder", None))
    for name, value in (
        ("source positions (max_source_length)", conditioning.max_source_length),
        ("classifier-free guidance scale", conditioning.guidance_scale),
        ("encoder latent mean", conditioning.latent_mean),
        ("encoder latent std", conditioning.latent_std),
        ("padding token", conditioning.pad_token),
    ):
        rows += _sourced(name, value)
    return rows


def official_model_card(conversion, pipeline_class: str, scheduler_config) -> str:
    """The README.md text of a pipeline that `from_official` built (`conversion`: its [`Conversion`] record)."""
    settings, origin = conversion.settings, conversion.settings.origin
    released = origin.checkpoint
    family = settings.family
    title = released.description if released is not None else f"{family} checkpoint {origin.given}"
    header = ["---", "library_name: diffusers", "tags:", "- untied-sc", f"- {family}", "- text-generation"]
    if origin.repo_id is not None:
        header.append(f"base_model: {origin.repo_id}")
    header.append("---")
    source_rows = [
        _row("source", f"`{origin.given}`", "as given to `untied-sc convert` / `from_official`"),
    ]
    if origin.repo_id is not None:
        source_rows.append(_row("Hub repo", f"[{origin.repo_id}](https://huggingface.co/{origin.repo_id})", ""))
    if origin.revision is not None:
        source_rows.append(_row("revision asked for", f"`{origin.revision}`", ""))
    if origin.commit is not None:
        source_rows.append(_row("commit read", f"`{origin.commit}`", "the Hugging Face cache snapshot"))
    weights = f"its `{conversion.weights}` weights" if conversion.weights else ""
    source_rows.append(_row("checkpoint file", f"`{conversion.checkpoint_file.name}`", weights))
    source_rows.append(
        _row(
            "recognised as",
            f"`{released.repo_id}`" if released is not None else "not a released checkpoint",
            "the table of released checkpoints (untied_sc/models/official_checkpoints.py)",
        )
    )
    source_rows.append(_row("sampling settings from", settings.settings_from, ""))
    setting_rows = [
        _row("tokenizer", f"`{conversion.tokenizer.value}`", conversion.tokenizer.source),
        _row("sequence length", conversion.max_length, settings.max_length.source if settings.max_length else ""),
    ]
    if settings.conditioning is not None:
        setting_rows += _conditioning_rows(conversion)
    if isinstance(settings.sampling, ELFSampling):
        setting_rows += _elf_rows(settings.sampling)
        scheduler = "ELFScheduler"
    else:
        setting_rows += _langflow_rows(settings.sampling, scheduler_config.get("proposal"))
        scheduler = "LangFlowScheduler"
    steps = released.evaluation_steps if released is not None else None
    lines = [
        *header,
        "",
        f"# {title}",
        "",
        f"A `{pipeline_class}` of the `untied-sc` package, converted from an official checkpoint, with the official "
        f"sampler (`{scheduler}`) at the checkpoint's official settings.",
        "",
        "| | | |",
        "|---|---|---|",
        *source_rows,
        "",
        "## Official sampler settings",
        "",
        "| setting | value | source |",
        "|---|---|---|",
        *setting_rows,
        "",
    ]
    if steps is not None:
        lines += [f"The official evaluation samples at {', '.join(map(str, steps.value))} steps ({steps.source}).", ""]
    if settings.conditioning is not None:
        call = 'texts = pipe(prompt=["A source text."], num_inference_steps=64).texts  # the official sampler'
        calibrate = "untied-sc calibrate PIPELINE_DIR --nfe 8 16 64 --prompts sources.txt   # calibrated on prompts"
    else:
        call = "texts = pipe(batch_size=4, num_inference_steps=32).texts  # the official sampler"
        calibrate = "untied-sc calibrate PIPELINE_DIR --nfe 8 16 32 64   # sampler statistics for the untied sampler"
    lines += [
        "## Use",
        "",
        "```python",
        f"from untied_sc import {pipeline_class}",
        "",
        f'pipe = {pipeline_class}.from_pretrained("PIPELINE_DIR")',
        call,
        "```",
        "",
        "```bash",
        calibrate,
        *(
            []
            if settings.conditioning is not None
            else ["untied-sc generate PIPELINE_DIR --nfe 8 --out samples.jsonl"]
        ),
        "```",
        "",
    ]
    return "\n".join(lines)
