"""The settings an official checkpoint is sampled with, and where each was read.

In order: the table of released checkpoints (`official_checkpoints.py`) for a recognised one; else the checkpoint's
own config file (ELF: the trainer's `config.yml` beside the checkpoint, whose `sampling_configs` the official
`eval.py` sweeps; LangFlow: the official sampler has no setting outside the weights); else what the caller gives
(`--tokenizer`, `--sde-gamma`, `--sc-cfg-scale`). A given value wins over a recorded one. Whatever is still missing
is an error that names it and the flag that gives it. Nothing here reads weights, so every refusal comes before the
checkpoint is loaded.
"""

import json
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from ..families import get_family
from .official_checkpoints import (
    ELF_PYTORCH,
    ELF_TEXT_ENCODER,
    LANGFLOW_GRID,
    OFFICIAL_CHECKPOINTS,
    ELFConditioning,
    ELFSampling,
    LangFlowSampling,
    OfficialCheckpoint,
    Sourced,
    StepValue,
    cache_snapshot,
    official_checkpoint,
    official_ids,
)


GIVEN = "given by the caller"
# What the official ELF `Config` class defaults to where a trainer's config.yml does not set a key (`config.yml`
# lists only the keys its YAML set); `max_length` has no such fallback here (see `convert.resolve_elf_max_length`).
ELF_CONFIG_DEFAULTS = {
    "denoiser_noise_scale": 1.0,
    "denoiser_p_mean": 0.8,
    "denoiser_p_std": 0.8,
    "t_eps": 0.05,
    "encoder_model_name": "t5-small",
}
ELF_CONFIG_CLASS = f"{ELF_PYTORCH} src/configs/config.py (the Config default)"
# Tokenizers whose vocabulary size a LangFlow config.json may show, for the hint of a missing --tokenizer.
KNOWN_VOCABULARIES = {50257: "gpt2", 30522: "bert-base-uncased", 32100: "t5-small"}


class ConditionalCheckpointError(ValueError):
    """A checkpoint trained to continue a prompt (summarisation, translation): the pipelines take no prompts."""


class UnconditionalCheckpointError(ValueError):
    """A checkpoint without a source text (unconditional) given where a conditional one is expected."""


class MissingSettingsError(ValueError):
    """A checkpoint whose sampling settings nothing records, and the caller did not give them."""


@dataclass(frozen=True)
class CheckpointOrigin:
    """
    Where a checkpoint came from, for the model card.

    Args:
        given: the source as the caller gave it (path or repo id).
        repo_id: its Hub repo id (the one given, or the repo of a Hugging Face cache snapshot it lies in).
        revision: the revision asked for (`None`: the default branch).
        commit: the commit the files were read at (a Hub snapshot's), where known.
        checkpoint: the official checkpoint recognised (`None`: not a released one).
    """

    given: str
    repo_id: str | None
    revision: str | None
    commit: str | None
    checkpoint: OfficialCheckpoint | None


@dataclass(frozen=True)
class OfficialSettings:
    """
    Everything a pipeline of an official checkpoint is built with besides the weights.

    Args:
        family: `"elf"` or `"langflow"`.
        origin: where the checkpoint came from.
        settings_from: what recorded the sampling settings (the table, a config file, the caller).
        tokenizer: the tokenizer's name or path, with where it was read (`None`: the caller passes an object).
        sampling: the official sampler's settings.
        max_length: ELF's sequence length where something records it (`None`: read later from the checkpoint's
            config, or given).
        conditioning: a conditional ELF checkpoint's source settings (text encoder, source length, guidance).
    """

    family: str
    origin: CheckpointOrigin
    settings_from: str
    tokenizer: Sourced[str] | None
    sampling: ELFSampling | LangFlowSampling
    max_length: Sourced[int] | None = None
    conditioning: ELFConditioning | None = None


def recognise(source: str, path: Path | None, official_id: str | None) -> CheckpointOrigin:
    """
    The released checkpoint `source` is, if any: `official_id` when given (it must be in the table), else `source`
    as a repo id, else the repo of the Hugging Face cache snapshot `path` lies in.
    """
    snapshot = cache_snapshot(path) if path is not None else None
    commit = snapshot[1] if snapshot is not None else None
    if official_id is not None:
        checkpoint = official_checkpoint(official_id)
        if checkpoint is None:
            raise ValueError(
                f"--official-id {official_id!r} (official_id=) is not a released checkpoint this package knows: "
                f"{', '.join(c.repo_id for c in OFFICIAL_CHECKPOINTS)}. Leave it out to read the settings from the checkpoint's "
                "config files."
            )
        return CheckpointOrigin(source, checkpoint.repo_id, None, commit, checkpoint)
    checkpoint = official_checkpoint(source)
    repo_id = checkpoint.repo_id if checkpoint is not None else None
    if checkpoint is None and snapshot is not None:
        repo_id = snapshot[0]
        checkpoint = official_checkpoint(repo_id)
    return CheckpointOrigin(source, repo_id, None, commit, checkpoint)


def refuse_conditional(checkpoint: OfficialCheckpoint | None, family: str) -> None:
    """A released conditional checkpoint, or one of the other family, is refused before anything is downloaded."""
    if checkpoint is None:
        return
    if checkpoint.family != family:
        raise ValueError(
            f"{checkpoint.repo_id} is a {checkpoint.family} checkpoint: convert it with "
            f"`untied-sc convert {checkpoint.family} ...` ({_pipeline(checkpoint.family)}.from_official)."
        )
    if checkpoint.conditional_task is not None:
        raise ConditionalCheckpointError(_conditional_message(checkpoint.repo_id, checkpoint.conditional_task))


def _pipeline(family: str) -> str:
    return get_family(family).pipeline.name


def _conditional_message(what: str, task: str) -> str:
    unconditional = ", ".join(official_ids("elf"))
    return (
        f"{what} is a conditional ELF checkpoint ({task}): it generates from a prompt, which ELFPipeline does not "
        "take. Build it with ELFText2TextPipeline.from_official (`untied-sc convert elf SOURCE OUTPUT` writes such a "
        f"folder; docs/usage.md, 'ELF with a source text'). The unconditional ELF checkpoints: {unconditional}."
    )


def _given_tokenizer(tokenizer) -> Sourced[str] | None:
    if tokenizer is None:
        return None
    return Sourced(str(tokenizer), f"{GIVEN} (--tokenizer)")


def _with_given_sampling(sampling: ELFSampling, sde_gamma: float | None, sc_cfg_scale: float | None) -> ELFSampling:
    """A given γ or w replaces the recorded ones at every step count."""
    if sde_gamma is not None:
        sampling = replace(sampling, sde_gamma=Sourced(float(sde_gamma), f"{GIVEN} (--sde-gamma)"))
    if sc_cfg_scale is not None:
        w = Sourced(float(sc_cfg_scale), f"{GIVEN} (--sc-cfg-scale)")
        sampling = replace(sampling, sc_cfg_scale_by_steps=(), sc_cfg_scale=w)
    return sampling


def _read_yaml(path: Path) -> dict:
    try:
        config = yaml.safe_load(path.read_text())  # YAML is a superset of JSON
    except (OSError, yaml.YAMLError) as error:
        raise ValueError(f"{path} is not a readable training config ({error}); fix or remove it.") from None
    if not isinstance(config, dict):
        raise ValueError(f"{path} is not a training config (a mapping of settings); fix or remove it.")
    return config


def elf_training_config(checkpoint_file: Path) -> tuple[Path, dict] | None:
    """The trainer's config beside an ELF checkpoint file (`config.yml`, `.yaml` or `.json`) and its contents."""
    from .convert import ELF_CONFIG_FILES

    for name in ELF_CONFIG_FILES:
        path = checkpoint_file.parent / name
        if path.is_file():
            return path, _read_yaml(path)
    return None


def _number(config: dict, key: str, path: Path) -> Sourced[float]:
    if key not in config or config[key] is None:
        return Sourced(float(ELF_CONFIG_DEFAULTS[key]), f"{ELF_CONFIG_CLASS}: {path} does not set {key}")
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{path}: {key} = {value!r} is not a number; fix it.")
    return Sourced(float(value), f"{path} ({key})")


def _elf_sampling_from_config(config: dict, path: Path, sde_gamma, sc_cfg_scale) -> ELFSampling:
    """The official evaluation's settings in a trainer's config: its `sampling_configs`, the list `eval.py` sweeps."""
    entries = config.get("sampling_configs")
    flags = "--sde-gamma G and --sc-cfg-scale W"
    if not entries and (sde_gamma is None or sc_cfg_scale is None):
        raise MissingSettingsError(
            f"{path} has no sampling_configs (the trainer writes them there when its YAML sets "
            "sampling_configs_path), so the checkpoint's official sampling settings are unknown: pass "
            f"{flags} (sde_gamma=, sc_cfg_scale=): the SDE churn and the SC-CFG scale to sample with (the released "
            "OpenWebText models: γ 1.5 and w 3 at 32 steps)."
        )
    gammas: dict[int, StepValue] = {}
    scales: dict[int, StepValue] = {}
    first_scale = None
    for i, entry in enumerate(entries or []):
        where = f"{path}, sampling_configs[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is not a mapping of sampling settings; fix it.")
        method, schedule = entry.get("sampling_method", "ode"), entry.get("time_schedule", "logit_normal")
        if method != "sde" or schedule != "logit_normal":
            raise ValueError(
                f"{where}: sampling_method {method!r}, time_schedule {schedule!r}; ELFScheduler runs the official "
                f"SDE sampler on the logit-normal grid only. Remove that entry, or pass {flags} to set the settings."
            )
        cfgs = entry.get("cfgs", [1])
        if list(cfgs) != [1]:
            raise ConditionalCheckpointError(
                f"{where} samples with classifier-free guidance cfgs {cfgs} over a prompt: "
                + _conditional_message(str(path.parent), "a prompt-conditioned task")
            )
        w = entry.get("self_cond_cfg_scales", [1.0])
        if not isinstance(w, list) or len(w) != 1 or not isinstance(w[0], int | float):
            raise ValueError(
                f"{where}: self_cond_cfg_scales {w!r} is not one number, so the SC-CFG scale to sample with is "
                "ambiguous: pass --sc-cfg-scale W."
            )
        gamma = entry.get("sde_gamma", 0.0)
        for steps in entry.get("num_sampling_steps", []):
            if not isinstance(steps, int) or steps < 2:  # the pipelines need ≥ 2 network evaluations
                continue
            for table, value in ((gammas, float(gamma)), (scales, float(w[0]))):
                if steps in table and table[steps].value != value:
                    raise ValueError(f"{where} sets {steps} steps again, to other values; keep one entry per NFE.")
                table[steps] = StepValue(steps, value, where)
        first_scale = first_scale or Sourced(float(w[0]), f"{where} (the first entry's self_cond_cfg_scales)")
    if (entries and not gammas) and (sde_gamma is None or sc_cfg_scale is None):
        raise MissingSettingsError(f"{path}: no sampling_configs entry lists 2 or more steps; pass {flags}.")
    if len({v.value for v in scales.values()}) == 1:  # one w for every listed NFE: the default, no table
        only = next(iter(scales.values()))
        scales, first_scale = {}, Sourced(only.value, f"{path}, sampling_configs (every entry)")
    sampling = ELFSampling(
        sde_gamma_by_steps=tuple(gammas[n] for n in sorted(gammas)),
        sc_cfg_scale_by_steps=tuple(scales[n] for n in sorted(scales)),
        sc_cfg_scale=first_scale or Sourced(0.0, "unset"),  # replaced below when none is recorded
        noise_scale=_number(config, "denoiser_noise_scale", path),
        p_mean=_number(config, "denoiser_p_mean", path),
        p_std=_number(config, "denoiser_p_std", path),
        t_eps=_number(config, "t_eps", path),
    )
    return _with_given_sampling(sampling, sde_gamma, sc_cfg_scale)


def _elf_sampling_from_flags(checkpoint_file: Path, sde_gamma, sc_cfg_scale) -> ELFSampling:
    missing = [
        flag for flag, value in (("--sde-gamma G", sde_gamma), ("--sc-cfg-scale W", sc_cfg_scale)) if value is None
    ]
    if missing:
        raise MissingSettingsError(
            f"{checkpoint_file} is not a released ELF checkpoint this package knows, and no config.yml beside it "
            "records its sampling settings (the official trainer writes one into its output folder). Pass "
            f"{' and '.join(missing)} (sde_gamma=, sc_cfg_scale=): the SDE churn and the SC-CFG scale (the released "
            "OpenWebText models: γ 1.5 and w 3 at 32 steps); or, for a copy of a released checkpoint, its Hub id "
            f"with --official-id ({', '.join(official_ids('elf'))})."
        )
    train = f"{ELF_PYTORCH} src/configs/training_configs/train_owt_ELF-B.yml"
    sampling = ELFSampling(
        sde_gamma_by_steps=(),
        sc_cfg_scale_by_steps=(),
        sc_cfg_scale=Sourced(0.0, "unset"),
        noise_scale=Sourced(2.0, f"the released models' training value, no config.yml ({train})"),
        p_mean=Sourced(-1.5, f"the released models' training value, no config.yml ({train})"),
        p_std=Sourced(0.8, f"the released models' training value, no config.yml ({train})"),
        t_eps=Sourced(0.05, f"the released models' training value, no config.yml ({train})"),
    )
    return _with_given_sampling(sampling, sde_gamma, sc_cfg_scale)


def elf_settings(
    origin: CheckpointOrigin,
    checkpoint_file: Path,
    tokenizer=None,
    sde_gamma: float | None = None,
    sc_cfg_scale: float | None = None,
) -> OfficialSettings:
    """The settings of the ELF checkpoint `checkpoint_file` (see the module docstring for the order)."""
    released = origin.checkpoint
    if released is not None:
        refuse_conditional(released, "elf")
        return OfficialSettings(
            "elf",
            origin,
            f"the table of released checkpoints ({released.repo_id})",
            _given_tokenizer(tokenizer) or released.tokenizer,
            _with_given_sampling(released.sampling, sde_gamma, sc_cfg_scale),
            released.max_length,
        )
    found = elf_training_config(checkpoint_file)
    if found is None:
        sampling = _elf_sampling_from_flags(checkpoint_file, sde_gamma, sc_cfg_scale)
        if tokenizer is None:
            raise MissingSettingsError(
                f"{checkpoint_file}: no config.yml beside it names its tokenizer; pass --tokenizer NAME_OR_PATH "
                "(tokenizer=; the released ELF models use t5-small)."
            )
        return OfficialSettings("elf", origin, GIVEN, _given_tokenizer(tokenizer), sampling)
    path, config = found
    if config.get("eval_data_path"):
        raise ConditionalCheckpointError(
            _conditional_message(str(checkpoint_file), f"{path} sets eval_data_path {config['eval_data_path']!r}")
        )
    sampling = _elf_sampling_from_config(config, path, sde_gamma, sc_cfg_scale)
    name = config.get("tokenizer_name") or config.get("encoder_model_name")
    recorded = (
        Sourced(str(name), f"{path} (tokenizer_name or encoder_model_name, as the official eval.py reads it)")
        if name
        else Sourced(ELF_CONFIG_DEFAULTS["encoder_model_name"], f"{ELF_CONFIG_CLASS}: {path} names no tokenizer")
    )
    return OfficialSettings("elf", origin, str(path), _given_tokenizer(tokenizer) or recorded, sampling)


def langflow_settings(origin: CheckpointOrigin, folder: Path, tokenizer=None) -> OfficialSettings:
    """
    The settings of the LangFlow checkpoint in `folder`: the official sampler has none outside the weights (the
    Gumbel proposal) and its grid's end points, so only the tokenizer can be missing (config.json names none).
    """
    released = origin.checkpoint
    if released is not None:
        refuse_conditional(released, "langflow")
        return OfficialSettings(
            "langflow",
            origin,
            f"the table of released checkpoints ({released.repo_id})",
            _given_tokenizer(tokenizer) or released.tokenizer,
            released.sampling,
            released.max_length,
        )
    if tokenizer is None:
        hint = ""
        try:
            vocab = json.loads((folder / "config.json").read_text()).get("vocab_size")
        except (OSError, ValueError, AttributeError):
            vocab = None
        if vocab in KNOWN_VOCABULARIES:
            hint = f" Its config.json's vocab_size {vocab} is {KNOWN_VOCABULARIES[vocab]}'s: --tokenizer {KNOWN_VOCABULARIES[vocab]}."
        raise MissingSettingsError(
            f"{folder} is not a released LangFlow checkpoint this package knows, and its config.json names no "
            f"tokenizer: pass --tokenizer NAME_OR_PATH (tokenizer=), the tokenizer it was trained with; or, for a "
            f"copy of a released checkpoint, its Hub id with --official-id ({', '.join(official_ids('langflow'))})."
            + hint
        )
    sampling = LangFlowSampling(quantile_eps=Sourced(1e-5, LANGFLOW_GRID))
    return OfficialSettings("langflow", origin, LANGFLOW_GRID, _given_tokenizer(tokenizer), sampling)


# What the official `Config` class defaults to for the conditional keys a trainer's config.yml may leave out.
ELF_CONDITIONAL_DEFAULTS = {"latent_mean": 0.0, "latent_std": 1.0, "pad_token": "pad"}
CONDITIONAL_FLAGS = "--sde-gamma G, --sc-cfg-scale W and --guidance-scale G"


def is_conditional_config(config: dict) -> bool:
    """Whether a trainer's config is a conditional run's: it names an evaluation set of sources or a source length
    (the official `eval.py` generates from sources when `eval_data_path` is set)."""
    return bool(config.get("eval_data_path")) or config.get("max_input_length") is not None


def _conditional_value(config: dict, key: str, path: Path, kind: type) -> Sourced:
    if config.get(key) is None:
        return Sourced(ELF_CONDITIONAL_DEFAULTS[key], f"{ELF_CONFIG_CLASS}: {path} does not set {key}")
    value = config[key]
    if isinstance(value, bool) or not isinstance(value, kind):
        raise ValueError(f"{path}: {key} = {value!r} is not a {kind.__name__}; fix it.")
    return Sourced(value, f"{path} ({key})")


def _single(entry: dict, key: str, where: str, flag: str) -> float:
    values = entry.get(key, [1.0])
    if not isinstance(values, list) or len(values) != 1 or not isinstance(values[0], int | float):
        raise ValueError(
            f"{where}: {key} {values!r} is not one number, so the value to sample with is ambiguous: pass {flag}."
        )
    return float(values[0])


def _conditional_sampling_from_config(config: dict, path: Path) -> tuple[ELFSampling | None, Sourced[float] | None]:
    """The conditional evaluation's settings in a trainer's `sampling_configs`: per-NFE γ (0 for the ODE) and w, and
    the one guidance scale `cfgs` gives. `(None, None)` when the config lists none."""
    entries = config.get("sampling_configs") or []
    gammas, scales, guidance = {}, {}, None
    for i, entry in enumerate(entries):
        where = f"{path}, sampling_configs[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} is not a mapping of sampling settings; fix it.")
        method, schedule = entry.get("sampling_method", "ode"), entry.get("time_schedule", "logit_normal")
        if method not in ("ode", "sde") or schedule != "logit_normal":
            raise ValueError(
                f"{where}: sampling_method {method!r}, time_schedule {schedule!r}; ELFScheduler runs the official ODE "
                f"and SDE samplers on the logit-normal grid only. Remove that entry, or pass {CONDITIONAL_FLAGS}."
            )
        cfg = _single(entry, "cfgs", where, "--guidance-scale G")
        if guidance is not None and guidance.value != cfg:
            raise ValueError(
                f"{where}: cfgs {cfg} differs from an earlier entry's {guidance.value}: pass --guidance-scale G."
            )
        guidance = guidance or Sourced(cfg, f"{where} (cfgs)")
        w = _single(entry, "self_cond_cfg_scales", where, "--sc-cfg-scale W")
        gamma = float(entry.get("sde_gamma", 0.0)) if method == "sde" else 0.0
        for steps in entry.get("num_sampling_steps", []):
            if isinstance(steps, int) and steps >= 2:
                gammas[steps], scales[steps] = StepValue(steps, gamma, where), StepValue(steps, w, where)
    if not gammas:
        return None, guidance
    first = scales[min(scales)]
    one_w = len({v.value for v in scales.values()}) == 1
    sampling = ELFSampling(
        sde_gamma_by_steps=tuple(gammas[n] for n in sorted(gammas)),
        sc_cfg_scale_by_steps=() if one_w else tuple(scales[n] for n in sorted(scales)),
        sc_cfg_scale=Sourced(first.value, f"{first.source} (self_cond_cfg_scales)"),
        noise_scale=_number(config, "denoiser_noise_scale", path),
        p_mean=_number(config, "denoiser_p_mean", path),
        p_std=_number(config, "denoiser_p_std", path),
        t_eps=_number(config, "t_eps", path),
    )
    return sampling, guidance


def _given(value, flag: str) -> Sourced | None:
    return None if value is None else Sourced(value, f"{GIVEN} ({flag})")


def elf_conditional_settings(
    origin: CheckpointOrigin,
    checkpoint_file: Path,
    tokenizer=None,
    text_encoder=None,
    sde_gamma: float | None = None,
    sc_cfg_scale: float | None = None,
    guidance_scale: float | None = None,
    max_source_length: int | None = None,
) -> OfficialSettings:
    """
    The settings of the conditional ELF checkpoint `checkpoint_file`: the table's for a released one, else those of
    the trainer's `config.yml` beside it (`max_input_length`, `encoder_model_name`, `latent_mean`, `latent_std`,
    `pad_token`, `sampling_configs`); a given value wins. An unconditional checkpoint is refused naming ELFPipeline.
    """
    conditional = ", ".join(official_ids("elf", conditional=True))
    released = origin.checkpoint
    if released is not None and released.conditioning is None:
        raise UnconditionalCheckpointError(
            f"{released.repo_id} is an unconditional checkpoint: it takes no source text. Use ELFPipeline.from_official "
            f"(`untied-sc convert elf` without --text-encoder / --guidance-scale / --max-source-length); the "
            f"conditional ones are {conditional}."
        )
    if released is not None:
        conditioning, sampling = released.conditioning, released.sampling
        settings_from, recorded_tokenizer = (
            f"the table of released checkpoints ({released.repo_id})",
            released.tokenizer,
        )
        max_length = released.max_length
    else:
        found = elf_training_config(checkpoint_file)
        if found is None:
            raise MissingSettingsError(
                f"{checkpoint_file} is not a released conditional ELF checkpoint this package knows, and no config.yml "
                "beside it records its source settings (the official trainer writes one into its output folder). "
                f"For a copy of a released checkpoint pass its Hub id with --official-id ({conditional})."
            )
        path, config = found
        if not is_conditional_config(config):
            raise UnconditionalCheckpointError(
                f"{path} sets neither eval_data_path nor max_input_length: {checkpoint_file} is an unconditional "
                "checkpoint, which takes no source text. Use ELFPipeline.from_official (`untied-sc convert elf` "
                "without --text-encoder / --guidance-scale / --max-source-length)."
            )
        length = config.get("max_input_length")
        if length is not None and (isinstance(length, bool) or not isinstance(length, int) or length < 1):
            raise ValueError(f"{path}: max_input_length = {length!r} is not a positive integer; fix it.")
        name = config.get("encoder_model_name") or ELF_CONFIG_DEFAULTS["encoder_model_name"]
        tokenizer_name = config.get("tokenizer_name") or name
        sampling, guidance = _conditional_sampling_from_config(config, path)
        if sampling is None:
            missing = [
                flag for flag, v in (("--sde-gamma G", sde_gamma), ("--sc-cfg-scale W", sc_cfg_scale)) if v is None
            ]
            if missing:
                raise MissingSettingsError(
                    f"{path} has no sampling_configs (the trainer writes them there when its YAML sets "
                    f"sampling_configs_path): pass {' and '.join(missing)} (the released conditional models: the ODE, "
                    "γ 0, and w 1 at 64 steps, with --guidance-scale 2)."
                )
            sampling = replace(
                _elf_sampling_from_flags(checkpoint_file, sde_gamma, sc_cfg_scale),
                noise_scale=_number(config, "denoiser_noise_scale", path),
                p_mean=_number(config, "denoiser_p_mean", path),
                p_std=_number(config, "denoiser_p_std", path),
                t_eps=_number(config, "t_eps", path),
            )
        if guidance is None and guidance_scale is None:
            raise MissingSettingsError(
                f"{path} records no classifier-free guidance scale (sampling_configs' cfgs): pass --guidance-scale G "
                "(guidance_scale=; the released conditional models: 2)."
            )
        conditioning = ELFConditioning(
            text_encoder=Sourced(str(name), f"{path} (encoder_model_name), loaded as {ELF_TEXT_ENCODER}"),
            max_source_length=Sourced(length, f"{path} (max_input_length)") if length is not None else None,
            guidance_scale=guidance,
            latent_mean=_conditional_value(config, "latent_mean", path, int | float),
            latent_std=_conditional_value(config, "latent_std", path, int | float),
            pad_token=_conditional_value(config, "pad_token", path, str),
        )
        settings_from = str(path)
        recorded_tokenizer = Sourced(str(tokenizer_name), f"{path} (tokenizer_name or encoder_model_name)")
        max_length = None
    recorded_length = conditioning.max_source_length
    if recorded_length is not None and max_source_length is not None and max_source_length != recorded_length.value:
        raise ValueError(
            f"--max-source-length {max_source_length} (max_source_length=) disagrees with {recorded_length.value}, "
            f"the source length the checkpoint was trained with ({recorded_length.source}): leave it out."
        )
    if recorded_length is None and max_source_length is None:
        raise MissingSettingsError(
            f"Nothing records the source length of {checkpoint_file} (the training config's max_input_length): pass "
            "--max-source-length N (max_source_length=; the released models: 1024 for XSum, 64 for WMT14 De-En)."
        )
    conditioning = replace(
        conditioning,
        text_encoder=_given(text_encoder, "--text-encoder") or conditioning.text_encoder,
        guidance_scale=_given(guidance_scale, "--guidance-scale") or conditioning.guidance_scale,
        max_source_length=recorded_length or _given(max_source_length, "--max-source-length"),
    )
    return OfficialSettings(
        "elf",
        origin,
        settings_from,
        _given_tokenizer(tokenizer) or recorded_tokenizer,
        _with_given_sampling(sampling, sde_gamma, sc_cfg_scale),
        max_length,
        conditioning,
    )
