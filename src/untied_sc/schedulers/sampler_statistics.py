"""SamplerStatistics: the precomputed tensors the untied scheduler needs, saved as a pipeline component; and
[`CalibratedStatistics`], the loading and the model check every statistics component shares."""

import hashlib
import json
import os
import weakref
from dataclasses import dataclass

import torch
from diffusers.configuration_utils import ConfigMixin, register_to_config
from diffusers.models.modeling_utils import ModelMixin

from ..defaults import CALIBRATION_SEED, COEFFICIENT_NAMES  # noqa: F401  (re-exported)
from ..families import get_family, untied_families


# The layout of this component: only what the model determines (the coefficients that run live in the scheduler
# config, `coefficients_by_steps` and `tuning_by_steps`). A folder of any other version is refused.
FORMAT_VERSION = 2
SOLVERS = untied_families()  # the families Algorithm 1 samples (the flow maps keep `FlowMapStatistics`)


def check_format_version(config: dict, where: str) -> None:
    """Refuses sampler statistics whose config (`where`, its `config.json`) has another layout than
    [`FORMAT_VERSION`], naming the field and the fix."""
    version = config.get("format_version", FORMAT_VERSION)
    if version == FORMAT_VERSION:
        return
    steps = " ".join(map(str, sorted(config.get("calibrated_steps") or [8])))
    raise ValueError(
        f"{where} has `format_version: {version}`; this untied-sc reads sampler statistics of format version "
        f"{FORMAT_VERSION} only (the coefficients that run live in the scheduler config). Recalibrate the pipeline "
        f"with `untied-sc calibrate PIPELINE_DIR --nfe {steps} --overwrite` (its statistics are computed afresh), "
        "or re-export it (`untied-sc convert` of the checkpoint, `untied-sc train ... export`) and calibrate that."
    )


def num_update_steps(solver: str, num_inference_steps: int) -> int:
    """K_u: every ELF evaluation updates (the last is the ODE step); LangFlow's final evaluation does not."""
    return get_family(solver).num_update_steps(num_inference_steps)


def model_family(model: torch.nn.Module) -> str | None:
    """The model's `family` ("elf" / "langflow"); `None` for a model that is neither."""
    return getattr(model, "family", None)


def latent_width(model: torch.nn.Module) -> int:
    """D, the width of the latent the sampler moves: ELF's `latent_dim`, LangFlow's `hidden_size`."""
    return model.config[get_family(model_family(model)).latent_width_key]


def input_projection_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    """The weights that define the overlap geometry: ELF's `self_cond_proj` and bottleneck, LangFlow's SC projection."""
    family = model_family(model)
    if family in ("elf", "flowmap"):  # a flow map's self-conditioning enters as ELF's
        return [model.self_cond_proj.weight, model.text_proj.proj1.weight]
    if family == "langflow" and getattr(model.backbone, "self_cond_proj", None) is not None:
        return [model.backbone.self_cond_proj.weight]
    raise ValueError(
        f"{type(model).__name__} has no self-conditioning input projection, so untied self-conditioning does not apply."
    )


def model_fingerprint(model: torch.nn.Module, rounded_to: torch.dtype | None = None) -> str:
    """
    A short hash of the input-projection weights (float32 bytes), identifying the model statistics belong to.
    `rounded_to`: the hash of the weights rounded to that dtype first, what the same network loaded at that precision
    hashes to.
    """
    digest = hashlib.sha256()
    for weight in input_projection_weights(model):
        tensor = weight.detach().to("cpu")
        tensor = (tensor if rounded_to is None else tensor.to(rounded_to)).to(torch.float32).contiguous()
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.numpy().tobytes())
    return digest.hexdigest()[:16]


class MatchedWeights:
    """
    The input-projection weights a fingerprint last matched, held without reading them: the fingerprint, weak
    references to the tensors and each one's storage, version counter (every in-place write bumps it, `load_state_dict`
    included), dtype and device. Hashing the weights copies them to the host, a device sync per pipeline call on a
    GPU; while they are the same tensors in the same state, the match stands. A copy or a pickle forgets it, and the
    next check hashes again.
    """

    def __init__(self):
        self._references: tuple = ()
        self._state: tuple | None = None
        self._fingerprint: str | None = None

    @staticmethod
    def _state_of(weights: list[torch.Tensor]) -> tuple:
        return tuple((w.data_ptr(), w._version, w.dtype, w.device) for w in weights)

    def holds(self, model: torch.nn.Module, fingerprint: str) -> bool:
        weights = input_projection_weights(model)
        return (
            self._state is not None
            and self._fingerprint == fingerprint
            and len(weights) == len(self._references)
            and all(reference() is weight for reference, weight in zip(self._references, weights, strict=True))
            and self._state == self._state_of(weights)
        )

    def remember(self, model: torch.nn.Module, fingerprint: str) -> None:
        weights = input_projection_weights(model)
        self._references, self._state = tuple(weakref.ref(w) for w in weights), self._state_of(weights)
        self._fingerprint = fingerprint

    def __getstate__(self) -> dict:
        return {"_references": (), "_state": None, "_fingerprint": None}


@dataclass
class StepStatistics:
    """The calibration of one NFE: per update step k, μ_k (K_u, D), σ_k (K_u,) and δ̄_k (K_u,)."""

    mean: torch.Tensor
    rms: torch.Tensor
    cosine_distance: torch.Tensor


class CalibratedStatistics(ModelMixin, ConfigMixin):
    """
    The base of a model's precomputed sampler statistics as a pipeline component ([`SamplerStatistics`],
    [`FlowMapStatistics`]): persistent buffers that diffusers saves in the component's folder (`config.json` and
    one safetensors file), a config that records the width (`latent_dim`) and the [`model_fingerprint`]
    (`model_fingerprint`) of the model they were computed for, and a loading that checks what diffusers lets
    through. A subclass names itself (`statistics_name`), says how its statistics are computed afresh
    (`recalibrate_hint`, `_recalibrate_command`) and checks its config's layout (`check_config`).
    """

    statistics_name = "statistics"
    # How to compute them afresh, for an error raised before the config is read (a file that does not fit it).
    recalibrate_hint = ""

    @classmethod
    def check_config(cls, config: dict, where: str) -> None:
        """Refuses a config (`where`, its `config.json`) of another layout than this class reads; none here."""

    def _recalibrate_command(self) -> str:
        """How these statistics are computed afresh for the pipeline's own model."""
        return self.recalibrate_hint

    def _recalibrate_again(self) -> str:
        """[`_recalibrate_command`] over statistics a folder already holds."""
        return self._recalibrate_command()

    def _promised(self) -> str:
        """What the config promises, for the message of a file that lacks tensors."""
        return f"calibrated_steps {sorted(self.config.calibrated_steps or [])}"

    @classmethod
    def from_pretrained(cls, pretrained_model_name_or_path: str | os.PathLike, **kwargs):
        """
        diffusers' loading, then checks: the config's layout ([`check_config`]), every tensor the config promises
        was in the file (diffusers would leave a missing one at zeros) and every value is finite. Errors name the
        folder and the fix.
        """
        return_info = kwargs.pop("output_loading_info", False)
        where = os.path.join(str(pretrained_model_name_or_path), kwargs.get("subfolder") or "")
        config_path = os.path.join(where, "config.json")
        if os.path.isfile(config_path):  # a local folder: refused before diffusers reads the tensors
            with open(config_path, encoding="utf-8") as file:
                cls.check_config(json.load(file), config_path)
        try:
            statistics, info = super().from_pretrained(
                pretrained_model_name_or_path, output_loading_info=True, **kwargs
            )
        except ValueError as error:  # diffusers: "Cannot load  because <name> expected shape ..."
            if "expected shape" not in str(error):
                raise
            detail = str(error).split(" because ", 1)[-1].split(". ", 1)[0]
            raise ValueError(
                f"The {cls.statistics_name} in {where} do not fit their config.json: {detail}. The tensor file and "
                f"the config come from different calibrations (or the file was edited); recalibrate with "
                f"{cls.recalibrate_hint} into a fresh copy of the pipeline."
            ) from None
        missing = sorted(info.get("missing_keys") or [])
        if missing:
            raise ValueError(
                f"The {cls.statistics_name} in {where} lack tensors {missing} that its config.json promises "
                f"({statistics._promised()}). Recalibrate with {statistics._recalibrate_again()}."
            )
        statistics.check_finite(where)
        return (statistics, info) if return_info else statistics

    def check_finite(self, where: str | None = None) -> None:
        """Raises if a tensor holds NaN or Inf (a corrupt file, or a calibration that diverged)."""
        where = f"these {self.statistics_name}" if where is None else where
        for name, tensor in self.named_buffers():
            if not torch.isfinite(tensor).all():
                count = int((~torch.isfinite(tensor)).sum())
                raise ValueError(
                    f"The {self.statistics_name} in {where}: tensor {name!r} holds {count} NaN/Inf value(s). The "
                    f"file is corrupt or the calibration diverged; recalibrate with {self._recalibrate_again()}."
                )

    def forward(self) -> None:
        raise RuntimeError(f"{type(self).__name__} holds tensors; pass it to the scheduler's `set_timesteps`.")

    def check_model(self, model: torch.nn.Module, where: str | None = None) -> None:
        """
        Raises if these statistics were computed for another model than `model`: another latent width, or
        input-projection weights that hash to another fingerprint. `where`: the file they were read from, named in
        the message.
        """
        config = self.config
        name = self.statistics_name if where is None else f"{self.statistics_name} of {where}"
        field = "" if where is None else " (`latent_dim`)"
        recalibrate = self._recalibrate_command()
        width = latent_width(model)
        if width != config.latent_dim:
            raise ValueError(
                f"The {name} are for latent width {config.latent_dim}{field}, the model has {width}: they "
                f"belong to another model. Recalibrate with {recalibrate}."
            )
        expected = self._expected_fingerprint(model)
        if self._matched_weights.holds(model, expected):
            return
        fingerprint = model_fingerprint(model)
        if fingerprint != expected:
            dtypes = {weight.dtype for weight in input_projection_weights(model)} - {torch.float32}
            if dtypes and expected == config.model_fingerprint:  # a float32 hash cannot match rounded weights
                raise ValueError(
                    f"The {name}' fingerprint {config.model_fingerprint!r} hashes the model's "
                    f"input-projection weights at the precision they were calibrated with, and this model holds them "
                    f"in {', '.join(sorted(map(str, dtypes)))}: rounding changes the hash, so the statistics cannot "
                    "be matched to it. Load the transformer in float32 (e.g. `from_pretrained(..., "
                    "dtype=torch.float32)` and run it under `torch.autocast`), or calibrate statistics at this "
                    f"precision with {recalibrate}."
                )
            raise ValueError(
                f"The {name} were computed for a model with fingerprint {expected!r}, "
                f"but this model's input projections hash to {fingerprint!r}: they belong to another model (or the "
                f"weights changed). Recalibrate with {recalibrate}."
            )
        self._matched_weights.remember(model, fingerprint)

    def _expected_fingerprint(self, model: torch.nn.Module) -> str:
        """The fingerprint `model`'s input projections must hash to: the one recorded at calibration."""
        return self.config.model_fingerprint


class SamplerStatistics(CalibratedStatistics):
    r"""
    Precomputed statistics of untied self-conditioning for one model (docs/algorithm.md §5), as persistent buffers.
    Everything here is determined by the model (and the calibration banks); the coefficients η_R, η_T, η_O, α that
    run live in the scheduler config (docs/algorithm.md §4.5).

    - `basis` Q (D, r) and `rho_sq` ρ² (r,): the overlap basis of the self-conditioning and latent input maps;
    - `base_scales` (λ_R^(0), g_T^(0));
    - per calibrated NFE N: `mean_nfe{N}` μ (K_u, D), `rms_nfe{N}` σ (K_u,), `cosine_distance_nfe{N}` δ̄ (K_u,).

    K_u = N for ELF and N − 1 for LangFlow. The config records what produced them, so that a mismatch is caught.

    Args:
        solver (`str`): `"elf"` or `"langflow"`.
        latent_dim (`int`): width D of the latent.
        rank (`int`): number r of overlap directions.
        calibrated_steps (`list[int]`): the calibrated NFEs.
        model_fingerprint (`str`): [`model_fingerprint`] of the model the statistics were computed for.
        format_version (`int`): layout version of this component ([`FORMAT_VERSION`], the only one read).
        solver_config (`dict`): the base solver's configuration during calibration (grid parameters, churn).
        bank_sizes (`dict`), seeds (`dict`): calibration bank sizes and seeds per NFE (as strings).
        calibration_alpha (`dict`, *optional*): per NFE (as strings), the EMA weight α of the reference recurrence
            the moments were measured with.
        tuning (`None`): always `None`; kept so that saved configs keep their key (the tuning record is the scheduler
            config's `tuning_by_steps`).
        prompt_banks (`dict`, *optional*): a conditional model's: per NFE (as strings), the prompts the trajectories
            were generated from (`{"file": name, "fingerprint": sha256 of the texts, "count": n}`).
    """

    statistics_name = "sampler statistics"
    recalibrate_hint = "`untied-sc calibrate PIPELINE_DIR --nfe N`"

    @register_to_config
    def __init__(
        self,
        solver: str = "elf",
        latent_dim: int = 512,
        rank: int = 128,
        calibrated_steps: list[int] | None = None,
        model_fingerprint: str = "",
        format_version: int = FORMAT_VERSION,
        solver_config: dict | None = None,
        bank_sizes: dict | None = None,
        seeds: dict | None = None,
        calibration_alpha: dict | None = None,
        tuning: dict | None = None,
        prompt_banks: dict | None = None,
    ):
        super().__init__()
        if solver not in SOLVERS:
            raise ValueError(f"solver must be one of {SOLVERS}, got {solver!r}.")
        check_format_version(
            {"format_version": format_version, "calibrated_steps": calibrated_steps}, "The sampler statistics' config"
        )
        if tuning is not None:
            raise ValueError(
                "SamplerStatistics holds no tuning record (`tuning` must be None): it is the scheduler config's "
                "`tuning_by_steps`."
            )
        self._matched_weights = MatchedWeights()
        self.register_buffer("basis", torch.zeros(latent_dim, rank))
        self.register_buffer("rho_sq", torch.zeros(rank))
        self.register_buffer("base_scales", torch.ones(2))
        for steps in calibrated_steps or []:
            updates = num_update_steps(solver, steps)
            self.register_buffer(f"mean_nfe{steps}", torch.zeros(updates, latent_dim))
            self.register_buffer(f"rms_nfe{steps}", torch.zeros(updates))
            self.register_buffer(f"cosine_distance_nfe{steps}", torch.zeros(updates))

    @classmethod
    def build(
        cls,
        model: torch.nn.Module,
        solver: str,
        basis: torch.Tensor,
        rho_sq: torch.Tensor,
        base_scales: tuple[float, float],
        steps: dict[int, StepStatistics],
        solver_config: dict | None = None,
        bank_sizes: dict | None = None,
        seeds: dict | None = None,
        calibration_alpha: dict | None = None,
        prompt_banks: dict | None = None,
    ) -> "SamplerStatistics":
        """Assembles statistics for `model` from computed tensors (what calibration produces)."""
        statistics = cls(
            prompt_banks=prompt_banks or None,
            solver=solver,
            latent_dim=basis.shape[0],
            rank=basis.shape[1],
            calibrated_steps=sorted(steps),
            model_fingerprint=model_fingerprint(model),
            solver_config=solver_config,
            bank_sizes=bank_sizes,
            seeds=seeds,
            calibration_alpha=calibration_alpha,
        )
        with torch.no_grad():
            statistics.basis.copy_(basis)
            statistics.rho_sq.copy_(rho_sq)
            statistics.base_scales.copy_(torch.tensor(base_scales))
            for n, step in steps.items():
                getattr(statistics, f"mean_nfe{n}").copy_(step.mean)
                getattr(statistics, f"rms_nfe{n}").copy_(step.rms)
                getattr(statistics, f"cosine_distance_nfe{n}").copy_(step.cosine_distance)
        statistics.check_model(model)
        return statistics

    @staticmethod
    def tensor_names(config: dict) -> list[str]:
        """The tensors a statistics file with this config must hold."""
        return list(SamplerStatistics.tensor_shapes(config))

    @staticmethod
    def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
        """The shape of every tensor a statistics file with this config holds, as `__init__` registers them (the
        config's defaults where it omits a value)."""
        solver, dim, rank = config.get("solver", "elf"), config.get("latent_dim", 512), config.get("rank", 128)
        shapes = {"basis": (dim, rank), "rho_sq": (rank,), "base_scales": (2,)}
        for steps in sorted(config.get("calibrated_steps") or []):
            updates = num_update_steps(solver, steps)
            shapes.update({f"mean_nfe{steps}": (updates, dim), f"rms_nfe{steps}": (updates,)})
            shapes[f"cosine_distance_nfe{steps}"] = (updates,)
        return shapes

    @property
    def base_transform_exponent(self) -> float:
        """λ_R^(0)."""
        return self.base_scales[0].item()

    @property
    def base_correction_scale(self) -> float:
        """g_T^(0)."""
        return self.base_scales[1].item()

    def for_steps(self, num_inference_steps: int) -> StepStatistics:
        """The calibration for `num_inference_steps`, or a clear error naming the calibrated NFEs."""
        calibrated = sorted(self.config.calibrated_steps or [])
        if num_inference_steps not in calibrated:
            raise ValueError(
                f"No sampler statistics for {num_inference_steps} steps (calibrated: {calibrated or 'none'}). "
                f"Calibrate them with `untied-sc calibrate PIPELINE_DIR --nfe {num_inference_steps}` or "
                f"`pipe.calibrate(nfe=[{num_inference_steps}])`, or sample with a calibrated number of steps."
            )
        return StepStatistics(
            mean=getattr(self, f"mean_nfe{num_inference_steps}"),
            rms=getattr(self, f"rms_nfe{num_inference_steps}"),
            cosine_distance=getattr(self, f"cosine_distance_nfe{num_inference_steps}"),
        )

    @classmethod
    def check_config(cls, config: dict, where: str) -> None:
        check_format_version(config, where)

    def _recalibrate_command(self) -> str:
        """The command that recalibrates these statistics' NFEs for the pipeline's own model."""
        steps = " ".join(map(str, sorted(self.config.calibrated_steps or [8])))
        return f"`untied-sc calibrate PIPELINE_DIR --nfe {steps}`"

    def _recalibrate_again(self) -> str:
        return f"{self._recalibrate_command()} (add `--overwrite`)"
