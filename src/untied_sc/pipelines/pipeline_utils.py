"""What ELFPipeline and LangFlowPipeline share: Hub loading, input checks, the denoising loop and the output."""

import contextlib
import importlib
import inspect
import json
import math
import operator
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers import DiffusionPipeline
from diffusers.callbacks import MultiPipelineCallbacks, PipelineCallback
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import is_compiled_module, randn_tensor, unwrap_module
from tqdm.auto import tqdm

from .. import schedulers
from ..calibration import apply_calibration, calibrate_pipeline
from ..hardware import check_device, warn_if_emulated_bfloat16
from ..hub import HUB_KWARGS, resolve_local
from ..schedulers.coefficients import entropy_matched_setting
from ..schedulers.noise import draw_normal, global_generator, settle
from ..schedulers.sampler_statistics import CALIBRATION_SEED
from ..schedulers.scheduling_untied import UntiedSelfConditioningScheduler

# Every component class a folder of ours names, under one library (`components.py`). Importing it also imports each
# module model_index.json names: diffusers resolves a component's library only among modules already imported.
from . import components
from .artifact_checks import check_pipeline_folder
from .remote_code import (
    MODULE_NAME,
    is_package_component,
    is_package_module,
    package_components,
    saved_class_name,
    write_remote_code,
)


OUTPUT_TYPES = ("text", "seq", "latent")


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


@contextlib.contextmanager
def _settled(generator):
    """On leaving (also by an error or a shorter `max_steps`), a draw ahead not taken goes back to `generator`."""
    try:
        yield
    finally:
        settle(generator)


def _accepted_kwargs(function, candidates: dict[str, Any]) -> dict[str, Any]:
    """The subset of `candidates` that `function` takes, so that stock diffusers schedulers can be swapped in."""
    parameters = inspect.signature(function).parameters
    return {name: value for name, value in candidates.items() if name in parameters}


def as_int(value):
    """A numpy (or other `__index__`) integer as a Python int; anything else unchanged, for `check_inputs` to judge."""
    if isinstance(value, bool) or isinstance(value, int):
        return value
    try:
        return operator.index(value)
    except TypeError:
        return value


def saved_pipeline_class(folder: Path) -> str | None:
    """The pipeline class `folder/model_index.json` names; `None` without one; `"an unreadable model_index.json"`
    for one that cannot be read (a folder of unknown content counts as another pipeline)."""
    index_path = folder / "model_index.json"
    if not index_path.is_file():
        return None
    try:
        return str(saved_class_name(json.loads(index_path.read_text())))
    except (OSError, ValueError, AttributeError):
        return "an unreadable model_index.json"


def clear_folder(folder: Path) -> None:
    """Removes everything inside `folder`, keeping the folder itself."""
    for entry in folder.iterdir():
        if entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry)
        else:
            entry.unlink()


def is_compiled_network(module: torch.nn.Module) -> bool:
    """Whether `module` runs compiled: in place (`module.compile()`) or wrapped (`torch.compile(module)`)."""
    return is_compiled_module(module) or getattr(module, "_compiled_call_impl", None) is not None


def owned_outputs(output: BaseOutput) -> BaseOutput:
    """`output` with each CUDA tensor copied: a CUDA-graph replay writes its outputs into the same static buffers every
    time, and the pipelines keep a step's outputs past the next call (self-conditioning, the scheduler's history)."""
    if not any(isinstance(value, torch.Tensor) and value.is_cuda for value in output.values()):
        return output
    return type(output)(**{name: value.clone() for name, value in output.items()})


def check_finite_number(name: str, value, hint: str) -> float:
    """`value` as a float, refused when NaN or ±inf: a non-finite knob runs every step and returns NaN latents and
    empty (all-pad) texts without an error."""
    value = float(value)
    if not math.isfinite(value):
        raise ValueError(
            f"{name} must be a finite number, got {value!r} ({hint}): a NaN or infinite value runs without an error "
            "and gives NaN latents or meaningless texts."
        )
    return value


def check_finite_latents(latents: torch.Tensor) -> None:
    """Initial latents hold no NaN or ±inf: every step would carry them into the output (all-pad texts)."""
    finite = torch.isfinite(latents)
    if not bool(finite.all()):
        count = int((~finite).sum())
        raise ValueError(
            f"latents hold {count} non-finite value(s) (NaN or ±inf) of {latents.numel()}: sampling from them gives NaN "
            "latents and all-pad texts. Pass finite initial latents (e.g. `init_noise_sigma * torch.randn(...)`), or "
            "leave `latents` out to draw them from the generator."
        )


def check_generator_input(generator, batch_size: int) -> None:
    """`None`, a `torch.Generator`, or a list of `batch_size` of them (diffusers' rule); an int is refused."""
    generators = generator if isinstance(generator, list) else [generator]
    for item in generators:
        if item is not None and not isinstance(item, torch.Generator):
            raise TypeError(
                f"generator must be a torch.Generator (or None), got {type(item).__name__} {item!r}. For a seed, pass "
                f"`generator=torch.Generator().manual_seed({item if isinstance(item, int) else 0})`."
            )
    if isinstance(generator, list) and len(generator) != batch_size:
        raise ValueError(
            f"You passed a list of {len(generator)} generators for a batch of {batch_size}; pass one generator per "
            "sample, or a single torch.Generator for the whole batch."
        )


class LanguageFlowPipeline(DiffusionPipeline):
    """
    Base class of the language flow pipelines. [`~LanguageFlowPipeline.denoise`] is the one denoising loop: the
    pipelines' `__call__`, calibration and the benchmark all run it. Subclasses define how the network is called
    (`_predict`, whose keyword arguments are the family's per-call network knobs) and how the final latents become
    token ids (`_tokens`); per-call knobs are passed down as arguments, never stored on the pipeline.

    The self-conditioning state lives in the scheduler (`scheduler.self_conditioning`, reset by `set_timesteps`).
    A scheduler without that attribute (a stock diffusers one) still runs, without self-conditioning.
    """

    family: str  # "elf" or "langflow", as the transformer's `family`
    _skip_special_tokens: bool  # whether `texts` drop the tokenizer's special tokens (the family's text protocol)

    model_cpu_offload_seq = "transformer"
    _optional_components = ["sampler_statistics", "ace_statistics"]
    _callback_tensor_inputs = ["latents", "prediction"]

    def __init__(self, transformer, scheduler, tokenizer, sampler_statistics=None, ace_statistics=None):
        super().__init__()
        self.register_modules(
            transformer=transformer,
            scheduler=scheduler,
            tokenizer=tokenizer,
            sampler_statistics=sampler_statistics,
            ace_statistics=ace_statistics,
        )
        if getattr(transformer, "family", None) != self.family:
            raise ValueError(
                f"{type(self).__name__} samples {self.family!r} models, but the transformer is a "
                f"{type(transformer).__name__} (family {getattr(transformer, 'family', None)!r}); use the pipeline "
                "of its family (or `untied_sc.pipelines.load_pipeline` on a folder)."
            )
        vocab_size = transformer.config.vocab_size
        if vocab_size not in (len(tokenizer), tokenizer.vocab_size):
            raise ValueError(
                f"The tokenizer has {len(tokenizer)} tokens but the transformer predicts {vocab_size}: they come "
                "from different models. Load the tokenizer that the model was trained with."
            )

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs):
        """
        Loads a pipeline from a local folder or a Hub repo id.

        A repo id is downloaded with `huggingface_hub.snapshot_download` (honouring `HF_HUB_OFFLINE`, `cache_dir`,
        `revision`, `token`) and then loaded locally: stock diffusers cannot load third-party components by repo
        id. Other keyword arguments (`torch_dtype`, `device_map`, component overrides) go to diffusers.

        `sampler_statistics` given as a folder or repo id (a str or path) loads the pipeline's weights with sampler
        statistics published on their own (`push_sampler_statistics`; a calibrated pipeline's folder or repo also
        serves, without its weights): their coefficients and tuning records replace the scheduler config's, and
        statistics computed for other weights are refused, naming both sources. `revision`, `token` and `cache_dir`
        apply to the pipeline; `sampler_statistics_revision` is the statistics repo's revision (`token` and
        `cache_dir` apply to it too). A `SamplerStatistics` object (or `None`) is used as it is, as diffusers does.

        The pipeline's `origin` ([`~untied_sc.pipelines.statistics_repo.PipelineOrigin`]) records its Hub repo and
        commit and the official checkpoint it was converted from, for `push_sampler_statistics`.
        """
        from .statistics_repo import folder_origin, install_statistics, load_statistics_source

        statistics_revision = kwargs.pop("sampler_statistics_revision", None)
        statistics_source = kwargs.get("sampler_statistics")
        if not isinstance(statistics_source, str | os.PathLike):
            if statistics_revision is not None:
                raise TypeError(
                    "sampler_statistics_revision is the revision of a statistics repo: give the repo too, "
                    "`from_pretrained(..., sampler_statistics='owner/name', sampler_statistics_revision=...)`."
                )
            statistics_source = None
        hub_kwargs = {key: kwargs.pop(key) for key in HUB_KWARGS if key in kwargs}
        published = None
        if statistics_source is not None:  # the small download first: a wrong or unreachable repo fails at once
            kwargs["sampler_statistics"] = None  # the base's own statistics are not loaded
            shared = {key: value for key, value in hub_kwargs.items() if key != "revision"}
            published = load_statistics_source(statistics_source, revision=statistics_revision, **shared)
        folder = resolve_local(pretrained_model_name_or_path, **hub_kwargs)
        check_pipeline_folder(folder, cls, passed=set(kwargs))
        pipe = super().from_pretrained(folder, **kwargs)
        pipe.origin = folder_origin(folder, str(pretrained_model_name_or_path), hub_kwargs.get("revision"))
        if published is not None:
            install_statistics(pipe, published)
        return pipe

    @classmethod
    def _attach_official_statistics(cls, pipe, source, revision: str | None, hub_kwargs: dict):
        """`from_official`'s `sampler_statistics=` source, installed as in `from_pretrained`."""
        if source is None:
            if revision is not None:
                raise TypeError("sampler_statistics_revision needs sampler_statistics (a statistics folder or repo).")
            return pipe
        from .statistics_repo import attach_statistics

        shared = {key: value for key, value in hub_kwargs.items() if key in HUB_KWARGS and key != "revision"}
        attach_statistics(pipe, source, revision=revision, **shared)
        return pipe

    @classmethod
    def load_config(cls, *args, **kwargs):
        """
        diffusers' `load_config`, reading our module file's `[module, class]` name as the plain class name, and each
        component whose folder holds our module file (see `remote_code.py`) as the package class: the package's own
        classes load the folder, never through diffusers' remote-code import (which several processes loading at once
        would race on). Any other module file is left to diffusers' rule.
        """
        loaded = super().load_config(*args, **kwargs)
        config = loaded[0] if isinstance(loaded, tuple) else loaded
        source = args[0] if args else kwargs.get("pretrained_model_name_or_path")
        folder = Path(source) if isinstance(source, str | os.PathLike) else None
        folder = folder.parent if folder is not None and folder.name == "model_index.json" else folder
        if folder is None or not folder.is_dir():
            return loaded
        name = config.get("_class_name")
        if isinstance(name, list | tuple) and name[0] == MODULE_NAME and is_package_module(folder):
            config["_class_name"] = name[-1]
        for component, (module, class_name) in package_components(config).items():
            if is_package_component(folder, component, module, class_name):
                try:
                    target = getattr(importlib.import_module(module), class_name, None)
                except ImportError:
                    continue
                if target is not None and getattr(components, class_name, None) is target:
                    config[component] = [components.__name__, class_name]  # no module file of that name
        return loaded

    def to(self, *args, **kwargs):
        """
        diffusers' `to`, with a CUDA device this machine lacks refused first in one sentence (torch's own error is
        an assertion raised from deep inside the move).
        """
        for value in (*args, kwargs.get("device")):
            if isinstance(value, str | torch.device) and str(value).startswith("cuda"):
                check_device(value, f"{type(self).__name__}.to({str(value)!r})")
        return super().to(*args, **kwargs)

    def save_pretrained(self, save_directory: str | os.PathLike, *args, overwrite: bool = False, **kwargs) -> None:
        """
        diffusers' `save_pretrained`, guarded against mixing two models in one folder: a non-empty folder that holds
        another pipeline (its `model_index.json` names another class) is refused unless `overwrite=True`, which
        first empties the folder, so no file of the other model (its model card, `training_info.json`,
        `latent_normalization.json`, ...) stays behind. Saving over a pipeline of the same class (say after
        `calibrate`) writes into the folder as diffusers does, keeping its other files.

        Args:
            save_directory (`str` or `os.PathLike`): the folder to write.
            overwrite (`bool`, defaults to `False`): replace the folder's contents, whatever it holds.
            args, kwargs: passed to `DiffusionPipeline.save_pretrained` (`safe_serialization`, `push_to_hub`, ...).

        A pipeline built by `from_official` also writes its model card, README.md (the source, its revision and
        every setting with where it was read), where the folder has none.
        """
        folder = Path(save_directory)
        if folder.is_dir() and any(folder.iterdir()):
            if overwrite:
                clear_folder(folder)
            else:
                held = saved_pipeline_class(folder)
                if held != type(self).__name__ and held is not None:
                    raise FileExistsError(
                        f"{folder} holds another pipeline ({held}, named by {folder / 'model_index.json'}), not a "
                        f"{type(self).__name__}: saving here would leave that model's files (model card, "
                        "training_info.json, ...) beside this one's. Pass `save_pretrained(..., overwrite=True)` to "
                        "replace the folder's contents, or save to a new folder."
                    )
        super().save_pretrained(save_directory, *args, **kwargs)
        conversion = getattr(self, "conversion", None)  # set by `from_official`: the folder gets its model card
        if conversion is not None and not (folder / "README.md").exists():
            from .official_card import official_model_card

            card = official_model_card(conversion, type(self).__name__, self.scheduler.config)
            (folder / "README.md").write_text(card, encoding="utf-8")
        # Where the weights came from (the conversion, the Hub pipeline repo): a copy keeps it (`write_provenance`).
        from .statistics_repo import write_provenance

        write_provenance(self, folder)

    def save_sampler_statistics(
        self, save_directory: str | os.PathLike, repo_id: str | None = None, overwrite: bool = False
    ) -> Path:
        """
        Saves this pipeline's sampler statistics on their own, as a statistics folder (a few MB, no weights):
        `sampler_statistics/`, `coefficients.json` (the scheduler config's `coefficients_by_steps` and
        `tuning_by_steps`), `base_checkpoint.json` (the weights: the pipeline repo and the official checkpoint with
        their revision and commit where known, and the weights' fingerprint) and a model card, README.md, saying how
        to load it: `from_pretrained(BASE, sampler_statistics=save_directory)`.

        Args:
            save_directory (`str` or `os.PathLike`): the folder to write (refused when not empty, unless
                `overwrite`).
            repo_id (`str`, *optional*): the repo the folder will be uploaded to, for the model card's instructions.
            overwrite (`bool`, defaults to `False`): replace a non-empty folder.

        Returns:
            The folder written.
        """
        from .statistics_repo import save_statistics_folder

        return save_statistics_folder(self, save_directory, repo_id=repo_id, overwrite=overwrite)

    def push_sampler_statistics(
        self,
        repo_id: str,
        commit_message: str | None = None,
        private: bool | None = None,
        token: str | None = None,
        create_pr: bool = False,
        save_directory: str | os.PathLike | None = None,
    ) -> str:
        """
        Uploads this pipeline's sampler statistics on their own (the folder [`save_sampler_statistics`] writes) to
        the Hub repo `repo_id`, created where missing, as diffusers' `push_to_hub` does for a whole pipeline. A
        failure to reach the Hub is one [`~untied_sc.hub.HubPushError`] naming the folder kept on disk and the
        `hf upload` command that pushes it later.

        Args:
            repo_id (`str`): the statistics repo.
            commit_message (`str`, *optional*): default: "Sampler statistics for <the base weights>".
            private (`bool`, *optional*), token (`str`, *optional*), create_pr (`bool`): as in `push_to_hub`.
            save_directory (`str` or `os.PathLike`, *optional*): write the folder there (refused when not empty)
                and keep it; default: a temporary folder, removed after a successful upload.

        Returns:
            The commit hash of the upload.
        """
        from .statistics_repo import push_statistics

        return push_statistics(self, repo_id, commit_message, private, token, create_pr, save_directory)

    def save_config(self, save_directory: str | os.PathLike, *args, **kwargs) -> None:
        """
        diffusers' `model_index.json`, plus the module file that lets `DiffusionPipeline.from_pretrained(folder,
        trust_remote_code=True)` load the folder (see `pipelines/remote_code.py`); `save_pretrained` calls this
        before any upload, so a pushed repo has both.
        """
        super().save_config(save_directory, *args, **kwargs)
        write_remote_code(Path(save_directory))

    @property
    def latent_shape(self) -> tuple[int, int]:
        """(length, dim) of one latent sequence."""
        raise NotImplementedError

    def enable_autocast(self, dtype: torch.dtype = torch.bfloat16) -> None:
        r"""
        Mixed precision as the official code samples on the GPU: from now on the transformer runs its blocks under
        `torch.autocast(dtype)` (on the device of its input), and keeps in float32 what the official code keeps in
        float32 (ELF: input projections, time embedders, decoder head and flow head; LangFlow: self-conditioning
        projection, time embedding, layer norms and skip term). The schedulers' updates, LangFlow's softmax·E_norm
        and ELF's decode sampling stay outside autocast. The weights are not cast, and nothing is saved:
        `save_pretrained` writes the same files. On a CPU without native bfloat16 this warns (emulated, ~50× slower).

        Args:
            dtype (`torch.dtype`, defaults to `torch.bfloat16`): `torch.bfloat16` (the official code's) or
                `torch.float16`; any other is refused.
        """
        enable = getattr(self.transformer, "enable_autocast", None)
        if enable is None:
            raise TypeError(
                f"{type(self.transformer).__name__} has no enable_autocast: use the package's "
                "ELFTransformerModel / LangFlowTransformerModel as the pipeline's transformer."
            )
        enable(dtype)  # refuses another dtype before any warning
        if dtype == torch.bfloat16 and self.transformer.device.type == "cpu":
            warn_if_emulated_bfloat16(
                "The network (pipe.enable_autocast(torch.bfloat16))",
                "Sample in float32 here: pipe.disable_autocast().",
            )

    def disable_autocast(self) -> None:
        """Back to the float32 network (the default), bit for bit as if autocast had never been enabled."""
        disable = getattr(self.transformer, "disable_autocast", None)
        if disable is not None:
            disable()

    def compile_network(self, mode: str | None = None, **compile_kwargs) -> "LanguageFlowPipeline":
        r"""
        Compiles the network with `torch.compile`, in place: `transformer.compile(...)` keeps the transformer's class,
        attributes and parameter names, so sampling, calibration and `save_pretrained` (the same files) work as
        before. Only the network is compiled: the scheduler, and with it every draw from the call's `generator` (the
        time grid, z_0, ELF's re-noising, the decode's uniforms), runs eagerly between the network calls, so the
        random stream and the solver's arithmetic are the uncompiled ones.

        The first call compiles, a one-off cost (inductor on a CPU: minutes, C++ kernels are built), one graph per
        kind of network call: the first step (no self-conditioning input), the later steps, and ELF's decode pass.
        A new batch size or sequence length recompiles (torch then treats that size as dynamic), as does each new ELF
        `sc_cfg_scale` (a network input torch specialises on; past torch's recompile limit, 8, calls run eager with
        a warning: compile once the scale is chosen). Inductor fuses and reorders floating-point operations, so
        samples equal the uncompiled ones to rounding, not bit for bit; `backend="eager"` only traces, and is
        bit-exact.

        A transformer wrapped by the user (`pipe.transformer = torch.compile(pipe.transformer)`, diffusers' other
        convention) also works; this method unwraps it and compiles the module itself.

        Args:
            mode (`str`, *optional*): `torch.compile`'s mode. `None` (default) for large models, whose steps are
                compute-bound. `"reduce-overhead"` records CUDA graphs: for small models on a GPU, which are
                launch-bound (a step replays one recorded graph instead of launching its kernels one by one); keep
                the batch size and length fixed, as each new shape records a graph of its own. On a GPU the
                network's outputs are copied out of the graph's buffers after each call (a replay overwrites them).
                On a CPU there are no CUDA graphs: every mode compiles with inductor's CPU code.
            compile_kwargs: further arguments of `torch.compile` (`backend`, `fullgraph`, `dynamic`, `options`).

        Returns:
            The pipeline itself, compiled: `pipe = ELFPipeline.from_pretrained(path).compile_network()`.

        Example:
            ```py
            >>> pipe = LangFlowPipeline.from_pretrained("hub_artifacts/langflow-small").to("cuda")
            >>> pipe.compile_network(mode="reduce-overhead")  # small model, fixed shape: CUDA graphs
            >>> pipe(batch_size=4, num_inference_steps=8, generator=torch.Generator().manual_seed(0)).texts
            ```
        """
        transformer = unwrap_module(self.transformer)
        if transformer is not self.transformer:  # a torch.compile wrapper: compiling inside it would compile twice
            self.transformer = transformer
        transformer.compile(mode=mode, **compile_kwargs)
        return self

    def _call_network(self, *args, **kwargs) -> BaseOutput:
        """The transformer's output on `args`, its CUDA tensors copied when it runs compiled (see `owned_outputs`)."""
        output = self.transformer(*args, **kwargs)
        return owned_outputs(output) if is_compiled_network(self.transformer) else output

    def _predict(self, model_input: torch.Tensor, timestep: torch.Tensor, self_conditioning: torch.Tensor | None):
        """
        One network evaluation → (clean prediction for the scheduler, logits or None). Subclasses add the family's
        per-call network knobs as keyword arguments with defaults ([`~LanguageFlowPipeline.denoise`] passes them).
        """
        raise NotImplementedError

    def _tokens(
        self, latents: torch.Tensor, last_logits: torch.Tensor | None, generator: torch.Generator
    ) -> torch.LongTensor:
        """Final token ids (`generator`: the call's, for a decoder that samples); subclasses add decode knobs."""
        raise NotImplementedError

    def _texts(self, sequences: torch.LongTensor) -> list[str]:
        """The decoded texts of the final token ids, with or without special tokens as the family's protocol has."""
        return self.tokenizer.batch_decode(sequences, skip_special_tokens=self._skip_special_tokens)

    def _set_timesteps_kwargs(self, generator: torch.Generator) -> dict[str, Any]:
        """Extra arguments for the scheduler's `set_timesteps` (passed only where it accepts them)."""
        return {"generator": generator}

    def _network_session(self) -> contextlib.AbstractContextManager:
        """The context the denoising loop's network calls run in (LangFlow: E_norm normalised once); none here."""
        return contextlib.nullcontext()

    def _network_knobs(self) -> list[str]:
        """The per-call network knobs: the keyword arguments of this family's `_predict`."""
        parameters = list(inspect.signature(type(self)._predict).parameters.values())[4:]  # past self, z, t, m
        return [parameter.name for parameter in parameters]

    def check_scheduler(self, scheduler) -> None:
        """Refuses a scheduler of the other family (it would run and give other text); stock schedulers pass."""
        family = getattr(scheduler, "family", None)
        if family is None or family == self.family:
            return
        names = sorted(
            name
            for name in dir(schedulers)
            if name.endswith("Scheduler") and getattr(getattr(schedulers, name), "family", None) == self.family
        )
        raise ValueError(
            f"{type(scheduler).__name__} belongs to the {family!r} family, but {type(self).__name__} samples "
            f"{self.family!r} models (it would run and give other text). Use one of this family's schedulers: "
            f"{', '.join(names)}, e.g. `pipe.scheduler = {names[0]}.from_config(pipe.scheduler.config)`."
        )

    def check_inputs(self, batch_size, num_inference_steps, latents, output_type="text", callback_tensor_inputs=()):
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive integer, got {batch_size!r}.")
        if not isinstance(num_inference_steps, int) or num_inference_steps < 2:
            raise ValueError(f"num_inference_steps must be an integer ≥ 2, got {num_inference_steps!r}.")
        if output_type not in OUTPUT_TYPES:
            raise ValueError(f"output_type must be one of {OUTPUT_TYPES}, got {output_type!r}.")
        expected = (batch_size, *self.latent_shape)
        if latents is not None and tuple(latents.shape) != expected:
            raise ValueError(f"latents have shape {tuple(latents.shape)}, expected {expected} (batch, length, dim).")
        if latents is not None:
            check_finite_latents(latents)
        unknown = [name for name in callback_tensor_inputs if name not in self._callback_tensor_inputs]
        if unknown:
            raise ValueError(f"Unknown callback tensor inputs {unknown}; choose from {self._callback_tensor_inputs}.")

    def _checked_call(
        self, batch_size, num_inference_steps, generator, latents, output_type="text", callback_tensor_inputs=()
    ) -> tuple[int, int, torch.Generator | list[torch.Generator]]:
        """
        A call's inputs checked (sizes given as numpy integers taken as ints), and its generator: the one given, or for
        `None` torch's global generator of the execution device (as diffusers: `torch.manual_seed` makes the call
        reproducible), so that the loop and the decode after it draw from the same stream.
        """
        batch_size, num_inference_steps = as_int(batch_size), as_int(num_inference_steps)
        self.check_inputs(batch_size, num_inference_steps, latents, output_type, callback_tensor_inputs)
        check_generator_input(generator, batch_size)
        if generator is None:
            generator = global_generator(self._execution_device)
        return batch_size, num_inference_steps, generator

    def prepare_latents(self, batch_size, generator, latents, device, scheduler=None) -> torch.Tensor:
        """
        z_0 = init_noise_sigma·ε drawn from `generator` on its device and moved to `device` (float32: the solvers run
        in float32/float64), with the `init_noise_sigma` of `scheduler` (default: the pipeline's).
        """
        if latents is not None:
            return latents.to(device=device, dtype=torch.float32)
        shape = (batch_size, *self.latent_shape)
        if isinstance(generator, torch.Generator):  # drawn on the generator's device (a CUDA one: on the GPU)
            noise = draw_normal(shape, generator, device, torch.float32)
        else:  # a list (one generator per sample) or None: diffusers' convention
            noise = randn_tensor(shape, generator=generator, device=device, dtype=torch.float32)
        return noise * getattr(self.scheduler if scheduler is None else scheduler, "init_noise_sigma", 1.0)

    def calibrate(
        self,
        nfe: list[int],
        bank_size: int = 64,
        seed: int = CALIBRATION_SEED,
        batch_size: int = 16,
        overwrite: bool = False,
        **kwargs,
    ) -> "CalibrationResult":  # noqa: F821
        """
        Computes (or extends) this pipeline's `sampler_statistics` for the NFEs in `nfe`; see
        [`~untied_sc.calibration.calibrate_pipeline`] for the arguments, and
        [`~untied_sc.calibration.apply_calibration`] for what is installed (the statistics, and the coefficients it
        ran at into the scheduler config where it has none; `overwrite=True` also replaces an NFE's entry that holds
        other coefficients than the ones given). It changes this object only: files are written by `save_pretrained`
        (or `untied-sc calibrate`, which refuses to replace a folder's NFEs without `--overwrite`). Returns the
        calibration result.
        """
        result = calibrate_pipeline(self, nfe, bank_size=bank_size, seed=seed, batch_size=batch_size, **kwargs)
        apply_calibration(self, result, overwrite=overwrite)
        return result

    @property
    def num_timesteps(self) -> int:
        """Number of steps of the loop in progress or last run (diffusers' convention, for callbacks)."""
        return self._num_timesteps

    def _start_run(
        self, batch_size, num_inference_steps, generator, latents, scheduler, statistics, ace_statistics, mask=None
    ):
        """
        A denoising run's start: the call checked, the scheduler (`self.scheduler` unless given) checked and its
        `set_timesteps` called with the run's generator and the statistics it takes (each checked against the
        transformer), and `mask` (the (B, L) positions the sampler generates) where it takes one. Returns the
        checked batch size, NFE and generator, the scheduler and the device.
        """
        batch_size, num_inference_steps, generator = self._checked_call(
            batch_size, num_inference_steps, generator, latents
        )
        scheduler = self.scheduler if scheduler is None else scheduler
        self.check_scheduler(scheduler)
        device = self._execution_device
        timestep_kwargs = _accepted_kwargs(
            scheduler.set_timesteps,
            {**self._set_timesteps_kwargs(generator), "statistics": statistics, "ace_statistics": ace_statistics},
        )
        if mask is not None and "mask" in _accepted_kwargs(scheduler.set_timesteps, {"mask": mask}):
            timestep_kwargs["mask"] = mask.to(device)
        for name in ("statistics", "ace_statistics"):
            if timestep_kwargs.get(name) is not None:
                timestep_kwargs[name].check_model(self.transformer)
        scheduler.set_timesteps(num_inference_steps, device=device, **timestep_kwargs)
        return batch_size, num_inference_steps, generator, scheduler, device

    def _run_timesteps(self, scheduler, max_steps: int | None):
        """The timesteps a run takes: the scheduler's, or its first `max_steps`; kept for `num_timesteps`."""
        timesteps = scheduler.timesteps
        if max_steps is not None:
            if not isinstance(max_steps, int) or not 1 <= max_steps <= len(timesteps):
                raise ValueError(f"max_steps must be an integer in [1, {len(timesteps)}], got {max_steps!r}.")
            timesteps = timesteps[:max_steps]
        self._num_timesteps = len(timesteps)
        return timesteps

    @torch.no_grad()
    def denoise(
        self,
        batch_size: int = 1,
        num_inference_steps: int = 32,
        generator: torch.Generator | None = None,
        latents: torch.Tensor | None = None,
        *,
        scheduler=None,
        statistics=None,
        ace_statistics=None,
        max_steps: int | None = None,
        step_callback: Callable[[DenoisingStep], dict[str, torch.Tensor] | None] | None = None,
        progress: bool = True,
        **network_kwargs,
    ) -> DenoisingOutput:
        r"""
        The denoising loop: from z_0 to the final latents, one network evaluation per step. For k = 0, 1, …:
        `model_input = scheduler.scale_model_input(z_k, t_k)`, the network on `(model_input, t_k,
        scheduler.self_conditioning)` gives the clean prediction p_k, and `z_{k+1} = scheduler.step(p_k, t_k, z_k)`.
        `__call__` runs it and then decodes; calibration runs it with its reference scheduler; nothing is decoded
        here.

        Args:
            batch_size (`int`, defaults to 1): number of trajectories.
            num_inference_steps (`int`, defaults to 32): NFE, the number of network evaluations (≥ 2).
            generator (`torch.Generator`, *optional*): every random draw comes from it (`None`: torch's global
                generator of the execution device, as diffusers). Draw order: the scheduler's `set_timesteps`, z_0,
                then the steps' draws. A CPU generator gives the official CPU stream bit for bit on any device (on a GPU, ELF's noise is drawn ahead while
                the network runs: same numbers); a CUDA generator draws everything on its GPU, a device stream that
                reproduces itself for a seed but not the CPU numbers (docs/algorithm.md §2.1).
            latents (`torch.Tensor` of shape `(batch_size, length, dim)`, *optional*): the initial latent z_0.
            scheduler (*optional*): the scheduler to run instead of `self.scheduler` (e.g. calibration's reference
                recurrence, or a clone for a concurrent call); it gets the same `set_timesteps` arguments.
            statistics ([`SamplerStatistics`], *optional*): handed to the scheduler's `set_timesteps` where it takes
                them, after a check that they belong to the transformer. `__call__` passes the pipeline's
                `sampler_statistics`; `None` (default) hands none.
            ace_statistics ([`ACEStatistics`], *optional*): ACE's repetition direction, handed to the schedulers
                that take it (ACE, HiGS + ACE) after the same check; `__call__` passes the pipeline's
                `ace_statistics`.
            max_steps (`int`, *optional*): run only the first `max_steps` timesteps (default: all of them;
                calibration skips LangFlow's final evaluation, which updates nothing).
            step_callback (`Callable`, *optional*): called after every step as `step_callback(step)` with a
                [`DenoisingStep`]; may return `{"latents": z}` to continue from z instead of `step.latents`.
            progress (`bool`, defaults to `True`): show the pipeline's progress bar.
            network_kwargs: the family's per-call network knobs, passed to every network call (ELF:
                `sc_cfg_scale`; LangFlow: `temperature`; see the pipeline's `__call__`). Omitted: their defaults.

        Returns:
            [`DenoisingOutput`]: the final latents and the last evaluation's logits.
        """
        unknown = sorted(set(network_kwargs) - set(self._network_knobs()))
        if unknown:
            raise TypeError(
                f"{type(self).__name__}.denoise got unknown network arguments {unknown}; this family takes "
                f"{self._network_knobs()}."
            )
        for name, value in network_kwargs.items():
            if isinstance(value, int | float) and not isinstance(value, bool):
                check_finite_number(name, value, "a network knob of every step")
        batch_size, num_inference_steps, generator, scheduler, device = self._start_run(
            batch_size, num_inference_steps, generator, latents, scheduler, statistics, ace_statistics
        )
        step_kwargs = _accepted_kwargs(scheduler.step, {"generator": generator})
        latents = self.prepare_latents(batch_size, generator, latents, device, scheduler)
        timesteps = self._run_timesteps(scheduler, max_steps)

        logits = None
        with (
            self._progress_bar(len(timesteps), progress) as progress_bar,
            _settled(generator),
            self._network_session(),
        ):
            for i, t in enumerate(timesteps):
                # Stock flow-matching schedulers have no `scale_model_input`; ELF's re-noises here.
                scale = getattr(scheduler, "scale_model_input", None)
                model_input = scale(latents, t) if scale is not None else latents
                self_conditioning = getattr(scheduler, "self_conditioning", None)
                prediction, logits = self._predict(model_input, t, self_conditioning, **network_kwargs)
                sample, latents = latents, scheduler.step(prediction, t, latents, **step_kwargs).prev_sample
                if step_callback is not None:
                    step = DenoisingStep(i, t, sample, model_input, self_conditioning, prediction, logits, latents)
                    latents = (step_callback(step) or {}).get("latents", latents)
                progress_bar.update()
        return DenoisingOutput(latents=latents, logits=logits)

    def _progress_bar(self, total: int, show: bool):
        """The pipeline's progress bar, or a silent one."""
        return self.progress_bar(total=total) if show else tqdm(total=total, disable=True)

    def _generate(
        self,
        batch_size: int,
        num_inference_steps: int,
        generator: torch.Generator | None,
        latents: torch.Tensor | None,
        output_type: str,
        return_dict: bool,
        callback_on_step_end,
        callback_on_step_end_tensor_inputs: list[str] | None,
        network_kwargs: dict[str, Any],
        decode_kwargs: dict[str, Any],
    ) -> LanguageFlowPipelineOutput | tuple:
        """
        The body of the pipelines' `__call__`: [`denoise`] with the pipeline's scheduler and statistics, diffusers'
        `callback_on_step_end`, then the decode (`_tokens` with `decode_kwargs`) and the output.
        """
        if isinstance(callback_on_step_end, PipelineCallback | MultiPipelineCallbacks):
            callback_on_step_end_tensor_inputs = callback_on_step_end.tensor_inputs
        tensor_inputs = callback_on_step_end_tensor_inputs or ["latents"]
        batch_size, num_inference_steps, generator = self._checked_call(
            batch_size, num_inference_steps, generator, latents, output_type, tensor_inputs
        )

        step_callback = None
        if callback_on_step_end is not None:

            def step_callback(step: DenoisingStep) -> dict[str, torch.Tensor] | None:
                tensors = {name: getattr(step, name) for name in tensor_inputs}
                return callback_on_step_end(self, step.index, step.timestep, tensors)

        denoised = self.denoise(
            batch_size,
            num_inference_steps,
            generator,
            latents,
            statistics=self.sampler_statistics,
            ace_statistics=getattr(self, "ace_statistics", None),
            step_callback=step_callback,
            **network_kwargs,
        )
        texts = sequences = None
        if output_type != "latent":
            sequences = self._tokens(denoised.latents, denoised.logits, generator, **decode_kwargs)
            texts = self._texts(sequences) if output_type == "text" else None
        self.maybe_free_model_hooks()
        output = LanguageFlowPipelineOutput(texts=texts, sequences=sequences, latents=denoised.latents)
        return output if return_dict else output.to_tuple()


def call_diversity(scheduler, key: str, num_inference_steps: int, default: float) -> float:
    """The diversity knob a pipeline call uses when it gives none: an untied `scheduler`'s stored entropy-matching
    value ([`entropy_matched_setting`]), else `default` (the official sampler's value). Other schedulers: `default`."""
    if not isinstance(scheduler, UntiedSelfConditioningScheduler):
        return default
    stored = entropy_matched_setting(scheduler.config, num_inference_steps, key)
    return default if stored is None else stored
