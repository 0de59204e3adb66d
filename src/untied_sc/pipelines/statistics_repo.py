"""Sampler statistics published on their own: a small folder or Hub repo beside the weights they belong to.

A calibration of a large model (ELF-B: hundreds of MB of weights) is a few MB of statistics and coefficients. A
statistics repo holds only those, and a record of the base weights:

- `sampler_statistics/`: the component, as a pipeline folder holds it;
- `coefficients.json`: the scheduler config's per-NFE coefficients and tuning records (`coefficients_by_steps`,
  `tuning_by_steps`, what `untied-sc calibrate` and `untied-sc tune` write);
- `base_checkpoint.json`: the weights they were computed for ([`BaseCheckpoint`]: the pipeline repo and the official
  checkpoint with their revisions and commits where known, and the weights' [`model_fingerprint`]);
- `README.md`: a model card saying what it is and how to load it.

`pipe.save_sampler_statistics(DIR)` writes one, `pipe.push_sampler_statistics(REPO)` uploads one, and
`ELFPipeline.from_pretrained(BASE, sampler_statistics=REPO_OR_DIR)` loads the base with them, refusing statistics whose
fingerprint is not the base's. A whole pipeline folder or repo is read as a statistics source too (its
`sampler_statistics/` and its scheduler config's coefficients; from the Hub, without its weights).
"""

import json
import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path

from ..hub import HUB_KWARGS, check_endpoint, resolve_local, upload_folder_to_hub
from ..models.official_checkpoints import cache_snapshot
from ..per_nfe import read_steps_table
from ..schedulers.coefficients import (
    StepCoefficients,
    TuningRecord,
    coefficients_table,
    stored_tuning,
    tables_config,
    tuning_table,
)
from ..schedulers.flowmap_statistics import FAMILY as FLOWMAP_FAMILY
from ..schedulers.flowmap_statistics import FlowMapStatistics
from ..schedulers.sampler_statistics import (
    CalibratedStatistics,
    SamplerStatistics,
    input_projection_weights,
    model_fingerprint,
)
from .artifact_checks import CONVERSION_RECORD
from .atomic_folder import refuse_non_empty, replace_atomically


BASE_CHECKPOINT_FILE = "base_checkpoint.json"
COEFFICIENTS_FILE = "coefficients.json"
# The scheduler config keys a statistics repo carries: the ones calibration and tuning write.
SCHEDULER_KEYS = ("coefficients_by_steps", "tuning_by_steps")
FORMAT_VERSION = 1
# What a statistics source is downloaded as: a statistics repo's files, or a pipeline repo's statistics and scheduler
# config (never its weights).
DOWNLOAD_PATTERNS = [
    "sampler_statistics/*",
    COEFFICIENTS_FILE,
    BASE_CHECKPOINT_FILE,
    "README.md",
    "model_index.json",
    "scheduler/scheduler_config.json",
]


@dataclass(frozen=True)
class StatisticsLayout:
    """
    What a statistics folder of one kind of pipeline holds, and what its model card says.

    Args:
        component (`str`): the statistics component, its folder in the statistics folder and the loading keyword
            (`from_pretrained(BASE, sampler_statistics=DIR)`).
        statistics_class (`type`): the component's class.
        coefficients (`bool`): whether the scheduler config's per-NFE tables (`coefficients.json`) travel with them.
        compute_hint (`str`): how to compute statistics for a pipeline that has none.
        imports (`str`): the card's import of the pipeline class and the untied scheduler (`{cls}`: the class).
        scheduler_swap (`str`): the card's line that samples with the untied scheduler.
        contents (`str`): the card's sentence saying what the folder holds.
        tag (`str`): the card's tag of the kind.
    """

    component: str
    statistics_class: type[CalibratedStatistics]
    coefficients: bool
    compute_hint: str
    imports: str
    scheduler_swap: str
    contents: str
    tag: str


SAMPLER_LAYOUT = StatisticsLayout(
    component="sampler_statistics",
    statistics_class=SamplerStatistics,
    coefficients=True,
    compute_hint="calibrate it first (`pipe.calibrate(nfe=[8])` or `untied-sc calibrate PIPELINE_DIR --nfe 8`)",
    imports="from untied_sc import {cls}, UntiedSelfConditioningScheduler",
    scheduler_swap="pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config)  # the untied "
    "sampler",
    contents="Sampler statistics and coefficients of the untied self-conditioning sampler (`untied-sc`) for one model, "
    "without its weights: `sampler_statistics/` (the pipeline component), `coefficients.json` (the scheduler "
    f"config's per-NFE coefficients and tuning records) and `{BASE_CHECKPOINT_FILE}` (the weights they belong "
    "to).",
    tag="sampler-statistics",
)
FLOWMAP_LAYOUT = StatisticsLayout(
    component="flowmap_statistics",
    statistics_class=FlowMapStatistics,
    coefficients=False,  # the flow-map scheduler's strength is a setting of its own, no calibrated table
    compute_hint="compute them first (`untied_sc.calibration.flowmap.flowmap_statistics(pipe.transformer, "
    'FlowMapLMScheduler(self_conditioning="chained"), [N], sc_cfg_scale=...)`, then '
    "`pipe.register_modules(flowmap_statistics=...)`)",
    imports="from untied_sc import {cls}\nfrom untied_sc.schedulers.scheduling_flowmap import UntiedFlowMapLMScheduler",
    scheduler_swap="pipe.scheduler = UntiedFlowMapLMScheduler.from_config(pipe.scheduler.config, eta_r=1.0)  # the "
    "untied flow-map sampler",
    contents="Statistics of the untied flow-map sampler (`untied-sc`) for one model, without its weights: "
    f"`flowmap_statistics/` (the pipeline component) and `{BASE_CHECKPOINT_FILE}` (the weights they belong to).",
    tag="flowmap-statistics",
)


def statistics_layout(pipe) -> StatisticsLayout:
    """The layout of `pipe`'s statistics: a flow map's `flowmap_statistics`, else Algorithm 1's `sampler_statistics`."""
    return FLOWMAP_LAYOUT if pipe.family == FLOWMAP_FAMILY else SAMPLER_LAYOUT


@dataclass(frozen=True)
class HubSource:
    """
    Files read from a Hub repo.

    Args:
        repo_id (`str`): the repo.
        revision (`str`, *optional*): the revision asked for (`None`: the default branch).
        commit (`str`, *optional*): the commit the files were read at, where known.
    """

    repo_id: str
    revision: str | None = None
    commit: str | None = None

    def describe(self) -> str:
        """`'owner/name' at commit 0123456789ab (revision 'v1')`, as far as it is known."""
        text = repr(self.repo_id)
        if self.commit is not None:
            text += f" at commit {self.commit[:12]}"
        if self.revision is not None and self.revision != self.commit:
            text += f" (revision {self.revision!r})" if self.commit is not None else f" at revision {self.revision!r}"
        return text

    @property
    def pin(self) -> str | None:
        """The revision that loads these very files: the commit where known, else the revision asked for."""
        return self.commit or self.revision

    @classmethod
    def from_dict(cls, data: Mapping | None) -> "HubSource | None":
        if data is None:
            return None
        return cls(str(data["repo_id"]), data.get("revision"), data.get("commit"))


@dataclass(frozen=True)
class PipelineOrigin:
    """
    Where a loaded pipeline's weights came from (`pipe.origin`, set by `from_pretrained` and `from_official`).

    Args:
        given (`str`): the source as the caller gave it (a folder or a repo id).
        pipeline ([`HubSource`], *optional*): the Hub repo of the pipeline folder, for a folder read from the Hub (or
            from a Hugging Face cache snapshot).
        official ([`HubSource`], *optional*): the official checkpoint the pipeline was converted from (`untied-sc
            convert`, `from_official`), where it was a Hub repo.
        conversion ([`ConversionRecord`], *optional*): the folder's `converted_from.json`, which a save writes again.
    """

    given: str
    pipeline: HubSource | None = None
    official: HubSource | None = None
    conversion: "ConversionRecord | None" = None

    def describe(self) -> str:
        """The pipeline repo (else the folder given), and the official checkpoint it was converted from."""
        text = f"the pipeline {self.pipeline.describe()}" if self.pipeline is not None else f"{self.given!r}"
        if self.official is not None:
            text += f", converted from {self.official.describe()}"
        return text


@dataclass(frozen=True)
class BaseCheckpoint:
    """
    The weights a statistics repo was computed for (`base_checkpoint.json`).

    Args:
        family (`str`): `"elf"` or `"langflow"`.
        pipeline_class (`str`): `"ELFPipeline"` or `"LangFlowPipeline"`.
        model_fingerprint (`str`): [`model_fingerprint`] of the weights (their input projections); loading checks it.
        pipeline ([`HubSource`], *optional*): the pipeline repo calibrated, where it was read from the Hub.
        official ([`HubSource`], *optional*): the official checkpoint that pipeline was converted from.
        format_version (`int`): the layout of this record.
    """

    family: str
    pipeline_class: str
    model_fingerprint: str
    pipeline: HubSource | None = None
    official: HubSource | None = None
    format_version: int = FORMAT_VERSION

    def describe(self) -> str:
        """Where the weights were read, as far as recorded."""
        parts = []
        if self.pipeline is not None:
            parts.append(f"the pipeline {self.pipeline.describe()}")
        if self.official is not None:
            parts.append(f"{'converted from ' if parts else 'the official checkpoint '}{self.official.describe()}")
        return ", ".join(parts) or "a local pipeline folder (no Hub repo recorded)"

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=2, sort_keys=True) + "\n"

    @classmethod
    def from_json(cls, text: str, where: str = BASE_CHECKPOINT_FILE) -> "BaseCheckpoint":
        try:
            data = json.loads(text)
            version = int(data.get("format_version", FORMAT_VERSION))
            if version > FORMAT_VERSION:
                raise ValueError(f"format version {version}; this untied-sc reads up to {FORMAT_VERSION}")
            return cls(
                family=str(data["family"]),
                pipeline_class=str(data["pipeline_class"]),
                model_fingerprint=str(data["model_fingerprint"]),
                pipeline=HubSource.from_dict(data.get("pipeline")),
                official=HubSource.from_dict(data.get("official")),
                format_version=version,
            )
        except (ValueError, KeyError, TypeError, AttributeError) as error:
            raise ValueError(
                f"{where} is not a readable base-checkpoint record ({type(error).__name__}: {error}). Restore it from "
                "the statistics repo, or save the statistics again with `pipe.save_sampler_statistics(DIR)`."
            ) from None


@dataclass
class PublishedStatistics:
    """
    A statistics source as read: the statistics, the scheduler config entries, and what they were computed for.

    Args:
        source (`str`): the folder or repo id given.
        folder (`Path`): where its files lie on disk.
        statistics ([`SamplerStatistics`]): the component.
        coefficients_by_steps (`dict[int, StepCoefficients]`), tuning_by_steps (`dict[int, TuningRecord]`): the
            scheduler config entries per NFE (empty where there are none).
        base ([`BaseCheckpoint`], *optional*): the weights recorded (`None` for a pipeline folder given as source,
            which records none).
        hub ([`HubSource`], *optional*): the statistics repo and commit, for a source read from the Hub.
    """

    source: str
    folder: Path
    statistics: SamplerStatistics
    coefficients_by_steps: dict[int, StepCoefficients]
    tuning_by_steps: dict[int, TuningRecord]
    base: BaseCheckpoint | None
    hub: HubSource | None = None

    def describe(self) -> str:
        return f"the statistics repo {self.hub.describe()}" if self.hub is not None else f"{self.source!r}"


# --- where a pipeline came from -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ConversionRecord:
    """
    What a pipeline folder was converted from (`converted_from.json`, written by `untied-sc convert` and by every later
    save of the pipeline, so that a copy keeps it).

    Args:
        given (`str`): the source as given to `convert` / `from_official`.
        checkpoint_file (`str`, *optional*): the checkpoint file's name.
        max_length (`int`, *optional*): the length the network was built for, which no weight fixes (checked when
            the folder loads: `artifact_checks.check_recorded_length`).
        official ([`HubSource`], *optional*): the official checkpoint's Hub repo, revision and commit, for a Hub source.
    """

    given: str
    checkpoint_file: str | None = None
    max_length: int | None = None
    official: HubSource | None = None

    def to_dict(self) -> dict:
        record = {"given": self.given, "checkpoint_file": self.checkpoint_file, "max_length": self.max_length}
        record = {key: value for key, value in record.items() if value is not None}
        if self.official is not None:
            record.update(asdict(self.official))
        return record

    @classmethod
    def from_dict(cls, data: Mapping) -> "ConversionRecord":
        official = HubSource.from_dict(data) if data.get("repo_id") is not None else None  # None: a local source
        length = data.get("max_length")
        return cls(
            given=str(data.get("given", official.repo_id if official is not None else "")),
            checkpoint_file=data.get("checkpoint_file"),
            max_length=length if isinstance(length, int) and not isinstance(length, bool) else None,
            official=official,
        )


# Written beside `converted_from.json` when a pipeline read from a Hub pipeline repo is saved elsewhere: that repo,
# its revision and commit, so that statistics published from the copy name the repo the weights came from.
PIPELINE_SOURCE_RECORD = "loaded_from.json"


def conversion_record(conversion) -> ConversionRecord:
    """The [`ConversionRecord`] of a [`Conversion`]: the source as given, the checkpoint file, the length the network
    was built for, and the Hub repo, revision and commit where the source is one."""
    origin = conversion.settings.origin
    official = HubSource(origin.repo_id, origin.revision, origin.commit) if origin.repo_id is not None else None
    return ConversionRecord(origin.given, conversion.checkpoint_file.name, conversion.max_length, official)


def _read_record(path: Path) -> dict | None:
    """A provenance record's content; `None` where it is missing or unreadable (a record for people: the fingerprint
    and the length check are what loading relies on)."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def folder_origin(folder: Path, given: str, revision: str | None = None) -> PipelineOrigin:
    """
    The origin of a pipeline folder: its Hub repo and commit where it is a cache snapshot (else the repo its
    `loaded_from.json` records, for a copy saved from one), and the conversion its `converted_from.json` records.
    """
    snapshot = cache_snapshot(folder)
    pipeline = HubSource(snapshot[0], revision, snapshot[1]) if snapshot is not None else None
    if pipeline is None:
        saved = _read_record(folder / PIPELINE_SOURCE_RECORD)
        try:
            pipeline = HubSource.from_dict(saved)
        except (KeyError, TypeError, AttributeError):
            pipeline = None
    data = _read_record(folder / CONVERSION_RECORD)
    try:
        conversion = ConversionRecord.from_dict(data) if data is not None else None
    except (KeyError, TypeError, AttributeError):
        conversion = None
    return PipelineOrigin(given, pipeline, conversion.official if conversion else None, conversion)


def pipeline_origin(pipe) -> PipelineOrigin:
    """`pipe.origin`, else what `from_official` recorded (`pipe.conversion`), else an unknown local pipeline."""
    origin = getattr(pipe, "origin", None)
    if isinstance(origin, PipelineOrigin):
        return origin
    conversion = getattr(pipe, "conversion", None)
    if conversion is not None:
        record = conversion_record(conversion)
        return PipelineOrigin(record.given, None, record.official, record)
    return PipelineOrigin("a pipeline in memory")


def write_provenance(pipe, folder: str | os.PathLike) -> None:
    """
    Writes into a saved pipeline folder where its weights came from: `converted_from.json` (the conversion, from
    `from_official` or from the folder the pipeline was loaded from) and `loaded_from.json` (the Hub pipeline repo it
    was read from). A copy keeps both, so a later load checks the network's length and statistics published from the
    copy name the repo and the official checkpoint.
    """
    folder = Path(folder)
    conversion = getattr(pipe, "conversion", None)
    origin = pipeline_origin(pipe)
    record = conversion_record(conversion) if conversion is not None else origin.conversion
    if record is None and origin.official is not None:  # an origin set by hand: its official source
        record = ConversionRecord(origin.official.repo_id, official=origin.official)
    # A record of other weights, left by an earlier save into the folder, goes: it would name their source and length.
    for name, content in ((CONVERSION_RECORD, record and record.to_dict()), (PIPELINE_SOURCE_RECORD, origin.pipeline)):
        path = folder / name
        if content is None:
            path.unlink(missing_ok=True)
        else:
            content = asdict(content) if isinstance(content, HubSource) else content
            path.write_text(json.dumps(content, indent=2, sort_keys=True) + "\n")


def base_checkpoint(pipe) -> BaseCheckpoint:
    """The [`BaseCheckpoint`] record of `pipe`'s weights."""
    origin = pipeline_origin(pipe)
    return BaseCheckpoint(
        family=pipe.family,
        pipeline_class=type(pipe).__name__,
        model_fingerprint=model_fingerprint(pipe.transformer),
        pipeline=origin.pipeline,
        official=origin.official,
    )


# --- writing ------------------------------------------------------------------------------------------------------


def _load_lines(record: BaseCheckpoint, layout: StatisticsLayout, repo: str, steps: int) -> list[str]:
    """The model card's loading instructions for a base as recorded (sampling at `steps`, a calibrated NFE)."""
    cls = record.pipeline_class
    swap, keyword = layout.scheduler_swap, layout.component
    call = f"texts = pipe(batch_size=4, num_inference_steps={steps}).texts"
    if cls == "ELFText2TextPipeline":  # a conditional model generates from a source text
        call = f'texts = pipe(prompt=["A source text."], num_inference_steps={steps}).texts'
    python = ["```python", *layout.imports.format(cls=cls).splitlines(), ""]
    if record.pipeline is not None:
        pin = f', revision="{record.pipeline.pin}"' if record.pipeline.pin else ""
        return [
            *python,
            f'pipe = {cls}.from_pretrained("{record.pipeline.repo_id}"{pin}, {keyword}="{repo}")',
            swap,
            call,
            "```",
        ]
    if record.official is not None:
        official = record.official
        pin = f" --revision {official.pin}" if official.pin else ""
        pin_python = f', revision="{official.pin}"' if official.pin else ""
        return [
            "Convert the official checkpoint once (the weights stay the official ones), then load it with these "
            "statistics:",
            "",
            "```bash",
            f"untied-sc convert {record.family} {official.repo_id} BASE_DIR{pin}",
            "```",
            "",
            *python,
            f'pipe = {cls}.from_pretrained("BASE_DIR", {keyword}="{repo}")',
            f'# or in one step: {cls}.from_official("{official.repo_id}"{pin_python}, {keyword}="{repo}")',
            swap,
            call,
            "```",
        ]
    return [
        "The base is a local pipeline folder: load it with these statistics.",
        "",
        *python,
        f'pipe = {cls}.from_pretrained("BASE_DIR", {keyword}="{repo}")',
        swap,
        call,
        "```",
    ]


def statistics_model_card(
    record: BaseCheckpoint, statistics: CalibratedStatistics, scheduler_config, repo: str, layout=SAMPLER_LAYOUT
) -> str:
    """The README.md of a statistics repo."""
    header = ["---", "library_name: untied-sc", "tags:", "- untied-sc", f"- {record.family}", f"- {layout.tag}"]
    base_model = record.pipeline or record.official
    if base_model is not None:
        header.append(f"base_model: {base_model.repo_id}")
    header.append("---")
    steps = sorted(statistics.config.calibrated_steps or [])
    rows = [f"| base weights | {record.describe()} |", f"| model fingerprint | `{record.model_fingerprint}` |"]
    rows.append(f"| calibrated NFEs | {', '.join(map(str, steps)) or 'none'} |")
    table = read_steps_table(scheduler_config.get("coefficients_by_steps"), "coefficients_by_steps")  # as stored
    table = table if layout.coefficients else {}
    tuning = stored_tuning(scheduler_config) if layout.coefficients else {}
    for n in sorted(table):
        entry = ", ".join(f"{name} {value:g}" for name, value in table[n].items())
        tuned = " (tuned)" if n in tuning else ""
        rows.append(f"| coefficients at {n} NFE{tuned} | {entry} |")
    lines = [
        *header,
        "",
        f"# {statistics.statistics_name.capitalize()} for {record.describe()}",
        "",
        f"{layout.contents} Loading checks the weights' fingerprint and refuses statistics of another model.",
        "",
        "| | |",
        "|---|---|",
        *rows,
        "",
        "## Use",
        "",
        *_load_lines(record, layout, repo, steps[0] if steps else 8),
        "",
    ]
    return "\n".join(lines)


def save_statistics_folder(
    pipe, save_directory: str | os.PathLike, repo_id: str | None = None, overwrite: bool = False
) -> Path:
    """
    `save_sampler_statistics` / `save_flowmap_statistics`'s body: the statistics repo of `pipe` in `save_directory`
    ([`statistics_layout`]), written whole into a folder beside it and renamed onto it ([`replace_atomically`]), so
    that an error leaves the folder as it was.
    """
    layout = statistics_layout(pipe)
    statistics = getattr(pipe, layout.component, None)
    if statistics is None:
        raise ValueError(
            f"The pipeline has no {layout.statistics_class.statistics_name} to save: {layout.compute_hint}."
        )
    statistics.check_model(pipe.transformer)  # never publish statistics of another model under this one's name
    folder = Path(save_directory).expanduser()
    refuse_non_empty(folder, overwrite, "pass overwrite=True (CLI: --overwrite)")
    # The statistics' own fingerprint: the float32 weights', also for a network loaded in bf16 (which they matched).
    record = replace(base_checkpoint(pipe), model_fingerprint=statistics.config.model_fingerprint)
    card = statistics_model_card(record, statistics, pipe.scheduler.config, repo_id or str(folder), layout)

    def write(staging: Path) -> None:
        statistics.save_pretrained(staging / layout.component)
        if layout.coefficients:
            coefficients = {key: pipe.scheduler.config.get(key) for key in SCHEDULER_KEYS}
            (staging / COEFFICIENTS_FILE).write_text(json.dumps(coefficients, indent=2, sort_keys=True) + "\n")
        (staging / BASE_CHECKPOINT_FILE).write_text(record.to_json())
        (staging / "README.md").write_text(card, encoding="utf-8")

    return replace_atomically(folder, write)


def push_statistics(
    pipe,
    repo_id: str,
    commit_message: str | None = None,
    private: bool | None = None,
    token: str | None = None,
    create_pr: bool = False,
    save_directory: str | os.PathLike | None = None,
) -> str:
    """`push_sampler_statistics` / `push_flowmap_statistics`'s body; returns the commit hash of the upload."""
    check_endpoint()  # before anything is written
    if save_directory is None:
        folder = Path(tempfile.mkdtemp(prefix="untied-sc-statistics-"))
        kept = False
    else:
        folder, kept = Path(save_directory).expanduser(), True
    save_statistics_folder(pipe, folder, repo_id=repo_id, overwrite=not kept)
    name = statistics_layout(pipe).statistics_class.statistics_name.capitalize()
    message = commit_message or f"{name} for {base_checkpoint(pipe).describe()}"
    commit = upload_folder_to_hub(
        folder, repo_id, token=token, private=private, commit_message=message, create_pr=create_pr
    )
    if not kept:  # kept on a failure, which says where it is
        shutil.rmtree(folder, ignore_errors=True)
    return commit


# --- reading ------------------------------------------------------------------------------------------------------


def _read_json(path: Path):
    from .artifact_checks import read_json

    return read_json(path)


def load_statistics_source(
    source: str | os.PathLike, revision: str | None = None, **hub_kwargs
) -> PublishedStatistics:
    """
    Reads a statistics folder or repo (or a pipeline folder or repo's statistics and scheduler config): a repo id is
    downloaded at `revision` (the statistics repo's own), with `hub_kwargs` (`token`, `cache_dir`, ...).
    """
    hub_kwargs = {key: value for key, value in hub_kwargs.items() if key in HUB_KWARGS and key != "revision"}
    try:
        folder = resolve_local(source, DOWNLOAD_PATTERNS, revision=revision, **hub_kwargs)
    except FileNotFoundError as error:
        raise FileNotFoundError(f"The sampler statistics {str(source)!r} could not be read: {error}") from None
    statistics_folder = folder / "sampler_statistics"
    if not (statistics_folder / "config.json").is_file():
        raise FileNotFoundError(
            f"{source!r} ({folder}) holds no sampler statistics: no sampler_statistics/config.json. Give a folder or "
            "repo that `pipe.save_sampler_statistics` / `pipe.push_sampler_statistics` (or `untied-sc calibrate "
            "--push-statistics-to`) wrote, or a calibrated pipeline."
        )
    from .artifact_checks import check_statistics_folder

    check_statistics_folder(statistics_folder)
    statistics = SamplerStatistics.from_pretrained(statistics_folder)
    base = None
    if (folder / BASE_CHECKPOINT_FILE).is_file():
        path = folder / BASE_CHECKPOINT_FILE
        base = BaseCheckpoint.from_json(path.read_text(encoding="utf-8"), str(path))
        entries = _read_json(folder / COEFFICIENTS_FILE) if (folder / COEFFICIENTS_FILE).is_file() else {}
    elif (folder / "scheduler" / "scheduler_config.json").is_file():  # a pipeline folder
        entries = _read_json(folder / "scheduler" / "scheduler_config.json")
    else:
        entries = {}
    where = folder / (COEFFICIENTS_FILE if base is not None else "scheduler/scheduler_config.json")
    try:
        coefficients = coefficients_table(entries.get("coefficients_by_steps"))
        tuning = tuning_table(entries.get("tuning_by_steps"))
    except ValueError as error:
        raise ValueError(f"{where}: {error}") from None
    snapshot = cache_snapshot(folder)
    hub = HubSource(snapshot[0], revision, snapshot[1]) if snapshot is not None else None
    return PublishedStatistics(str(source), folder, statistics, coefficients, tuning, base, hub)


def mismatch_message(pipe, published: PublishedStatistics, reason: str) -> str:
    """One message naming the statistics, what they record, and the base loaded."""
    loaded = pipeline_origin(pipe)
    recorded = published.base.describe() if published.base is not None else "weights it does not record"
    fingerprint = published.statistics.config.model_fingerprint
    remedy = "Load the base they were computed for"
    if published.base is not None and published.base.pipeline is not None:
        base = published.base.pipeline
        pin = f", revision={base.pin!r}" if base.pin else ""
        remedy += f" (`{type(pipe).__name__}.from_pretrained({base.repo_id!r}{pin}, sampler_statistics=...)`)"
    elif published.base is not None and published.base.official is not None:
        official = published.base.official
        pin = f" --revision {official.pin}" if official.pin else ""
        remedy += f" (`untied-sc convert {pipe.family} {official.repo_id} BASE_DIR{pin}`)"
    return (
        f"The sampler statistics of {published.describe()} were computed for {recorded} (fingerprint {fingerprint!r}), "
        f"but the base loaded is {loaded.describe()}: {reason}. {remedy}, or calibrate statistics for this base "
        "(`untied-sc calibrate BASE_DIR --nfe N`)."
    )


def install_statistics(pipe, published: PublishedStatistics) -> None:
    """
    Installs `published` in `pipe`: the `sampler_statistics` component and the scheduler config's
    `coefficients_by_steps` / `tuning_by_steps` (they replace the base's: tuned for these statistics). Statistics of
    another model (family, width or fingerprint) are refused with [`mismatch_message`].
    """
    statistics = published.statistics
    if statistics.config.solver != pipe.family:
        reason = f"they are for a {statistics.config.solver!r} model and {type(pipe).__name__} samples {pipe.family!r}"
        raise ValueError(mismatch_message(pipe, published, reason))
    if published.base is not None and published.base.model_fingerprint != statistics.config.model_fingerprint:
        raise ValueError(
            f"{published.folder / BASE_CHECKPOINT_FILE} records fingerprint {published.base.model_fingerprint!r}, its "
            f"sampler_statistics/ {statistics.config.model_fingerprint!r}: the folder mixes two calibrations. Save the "
            "statistics again with `pipe.save_sampler_statistics(DIR)`."
        )
    try:
        statistics.check_model(pipe.transformer)
    except ValueError as error:
        fingerprint = None
        try:
            fingerprint = model_fingerprint(pipe.transformer)
        except ValueError:
            pass
        rounded = {str(w.dtype) for w in input_projection_weights(pipe.transformer)} - {"torch.float32"}
        if rounded or fingerprint is None:
            reason = str(error)
        else:
            reason = f"its input projections hash to {fingerprint!r}: other weights"
        raise ValueError(mismatch_message(pipe, published, reason)) from None
    pipe.register_modules(sampler_statistics=statistics)
    pipe.scheduler.register_to_config(**tables_config(published.coefficients_by_steps, published.tuning_by_steps))


def attach_statistics(
    pipe, source: str | os.PathLike, revision: str | None = None, **hub_kwargs
) -> PublishedStatistics:
    """Reads the statistics source `source` ([`load_statistics_source`]) and installs it in `pipe`."""
    published = load_statistics_source(source, revision=revision, **hub_kwargs)
    install_statistics(pipe, published)
    return published
