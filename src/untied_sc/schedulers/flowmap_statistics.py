"""FlowMapStatistics: what the untied flow-map sampler needs of its model, saved as a pipeline component."""

import torch
from diffusers.configuration_utils import register_to_config
from diffusers.models.modeling_utils import ModelMixin  # noqa: F401  (diffusers finds the loading method here)

from .sampler_statistics import (
    CalibratedStatistics,
    MatchedWeights,
    input_projection_weights,
    model_family,
    model_fingerprint,
)


# The layout of this component: the overlap basis, ρ² and the per-step cosine distances of each calibrated number of
# steps, as buffers. A folder of any other version is refused.
FORMAT_VERSION = 1
FAMILY = "flowmap"
# The precisions a flow-map network is loaded at besides float32 (a bf16 or fp16 pipeline): the statistics record what
# the same network's input projections hash to once rounded to each, so that they are matched to it at any of them.
ROUNDED_DTYPES = (torch.bfloat16, torch.float16)


def dtype_name(dtype: torch.dtype) -> str:
    """`"bfloat16"` for `torch.bfloat16`: the key of `rounded_fingerprints`."""
    return str(dtype).removeprefix("torch.")


def rounded_fingerprints(model: torch.nn.Module) -> dict[str, str]:
    """What `model`'s input projections hash to rounded to each of [`ROUNDED_DTYPES`], by dtype name."""
    return {dtype_name(dtype): model_fingerprint(model, rounded_to=dtype) for dtype in ROUNDED_DTYPES}


def check_flowmap_format_version(config: dict, where: str) -> None:
    """Refuses flow-map statistics whose config (`where`, its `config.json`) has another layout than
    [`FORMAT_VERSION`], naming the field and the fix."""
    version = config.get("format_version", FORMAT_VERSION)
    if version != FORMAT_VERSION:
        raise ValueError(
            f"{where} has `format_version: {version}`; this untied-sc reads flow-map statistics of format version "
            f"{FORMAT_VERSION} only. Compute them afresh with {FlowMapStatistics.recalibrate_hint}."
        )


class FlowMapStatistics(CalibratedStatistics):
    r"""
    What the untied transform of [`UntiedFlowMapLMScheduler`] needs of one flow-map model (docs/algorithm.md
    "Self-conditioned flow maps"), as persistent buffers: the optional pipeline component `flowmap_statistics` of
    [`FlowMapPipeline`], saved by `save_pretrained` in its own folder (`config.json` and one safetensors file) and
    checked, when loaded and when a run uses them, against the network they serve (width and
    [`model_fingerprint`]).

    - `basis` Q (D, r): orthonormal columns spanning row(W_m) (docs/algorithm.md §4.1);
    - `rho_sq` ρ² (r,): descending, in [0, 1];
    - per calibrated number of steps N: `cosine_distance_nfe{N}` δ̄_k for k = 0..N − 1 (N,).

    `untied_sc.calibration.flowmap.flowmap_statistics` computes them ([`build`]).

    Args:
        latent_dim (`int`): width D of the latent (the network's `latent_dim`, the self-conditioning input's width).
        rank (`int`): number r of overlap directions.
        calibrated_steps (`list[int]`): the calibrated numbers of steps.
        model_fingerprint (`str`): [`model_fingerprint`] of the model the statistics were computed for.
        rounded_fingerprints (`dict[str, str]`, *optional*): per dtype name (`"bfloat16"`, `"float16"`), the
            fingerprint of the same weights rounded to it: the network loaded at that precision is the same network.
            Statistics without it are matched to float32 weights only.
        format_version (`int`): layout version of this component ([`FORMAT_VERSION`], the only one read).
        solver_config (`dict`, *optional*): the official scheduler's configuration of the calibration runs.
        sc_cfg_scale (`float`, *optional*), num_trajectories (`int`, *optional*), seed (`int`, *optional*),
            alpha (`float`, *optional*): the calibration's SC-CFG scale, trajectories per N, first batch seed and
            EMA weight α.
    """

    statistics_name = "flow-map statistics"
    recalibrate_hint = (
        "`untied_sc.calibration.flowmap.flowmap_statistics(pipe.transformer, "
        'FlowMapLMScheduler(self_conditioning="chained"), [N], sc_cfg_scale=...)`, then '
        "`pipe.register_modules(flowmap_statistics=...)` and `pipe.save_pretrained(...)`"
    )

    @register_to_config
    def __init__(
        self,
        latent_dim: int = 1280,
        rank: int = 128,
        calibrated_steps: list[int] | None = None,
        model_fingerprint: str = "",
        rounded_fingerprints: dict | None = None,
        format_version: int = FORMAT_VERSION,
        solver_config: dict | None = None,
        sc_cfg_scale: float | None = None,
        num_trajectories: int | None = None,
        seed: int | None = None,
        alpha: float | None = None,
    ):
        super().__init__()
        check_flowmap_format_version({"format_version": format_version}, "The flow-map statistics' config")
        self._matched_weights = MatchedWeights()
        layout = {"latent_dim": latent_dim, "rank": rank, "calibrated_steps": calibrated_steps}
        for name, shape in self.tensor_shapes(layout).items():
            self.register_buffer(name, torch.zeros(shape))

    @classmethod
    def build(
        cls,
        model: torch.nn.Module,
        basis: torch.Tensor,
        rho_sq: torch.Tensor,
        cosine_distance: dict[int, torch.Tensor],
        **record,
    ) -> "FlowMapStatistics":
        """Assembles statistics for `model` from computed tensors (what calibration produces); `record`: the
        config's calibration record (`solver_config`, `sc_cfg_scale`, `num_trajectories`, `seed`, `alpha`)."""
        statistics = cls(
            latent_dim=basis.shape[0],
            rank=basis.shape[1],
            calibrated_steps=sorted(cosine_distance),
            model_fingerprint=model_fingerprint(model),
            rounded_fingerprints=rounded_fingerprints(model),
            **record,
        )
        with torch.no_grad():
            statistics.basis.copy_(basis)
            statistics.rho_sq.copy_(rho_sq)
            for steps, distances in cosine_distance.items():
                getattr(statistics, f"cosine_distance_nfe{steps}").copy_(distances)
        statistics.check_model(model)
        return statistics

    @staticmethod
    def tensor_shapes(config: dict) -> dict[str, tuple[int, ...]]:
        """The shape of every tensor a statistics file with this config holds, as `__init__` registers them (the
        config's defaults where it omits a value)."""
        dim, rank = config.get("latent_dim", 1280), config.get("rank", 128)
        shapes = {"basis": (dim, rank), "rho_sq": (rank,)}
        shapes.update({f"cosine_distance_nfe{n}": (n,) for n in sorted(config.get("calibrated_steps") or [])})
        return shapes

    @classmethod
    def check_config(cls, config: dict, where: str) -> None:
        check_flowmap_format_version(config, where)

    @property
    def cosine_distance(self) -> dict[int, torch.Tensor]:
        """δ̄ per calibrated number of steps N: `{N: (N,)}`."""
        return {n: getattr(self, f"cosine_distance_nfe{n}") for n in sorted(self.config.calibrated_steps or [])}

    def for_steps(self, num_inference_steps: int) -> torch.Tensor:
        """δ̄ of `num_inference_steps`, or a clear error naming the calibrated numbers of steps."""
        calibrated = sorted(self.config.calibrated_steps or [])
        if num_inference_steps not in calibrated:
            raise ValueError(
                f"The flow-map statistics have cosine distances for N in {calibrated}, not N = "
                f"{num_inference_steps}; calibrate at that N ({self._recalibrate_command(num_inference_steps)})."
            )
        return getattr(self, f"cosine_distance_nfe{num_inference_steps}")

    def _recalibrate_command(self, steps: int | None = None) -> str:
        """The call that computes these statistics afresh, at their calibrated numbers of steps (or `steps`)."""
        calibrated = [steps] if steps is not None else sorted(self.config.calibrated_steps or []) or ["N"]
        return self.recalibrate_hint.replace("[N]", f"[{', '.join(map(str, calibrated))}]")

    def _promised(self) -> str:
        return f"calibrated_steps {sorted(self.config.calibrated_steps or [])}"

    def _expected_fingerprint(self, model: torch.nn.Module) -> str:
        """The recorded fingerprint at the precision `model` holds its input projections in (bf16, fp16 or float32):
        the same network loaded in bf16 is the network the statistics were computed for."""
        names = {dtype_name(weight.dtype) for weight in input_projection_weights(model)}
        recorded = self.config.rounded_fingerprints or {}
        (name,) = names if len(names) == 1 else (None,)
        return recorded.get(name, self.config.model_fingerprint)

    def check_model(self, model: torch.nn.Module, where: str | None = None) -> None:
        """Raises if these statistics were computed for another model: not a flow map, another latent width
        (`latent_dim`) or input-projection weights of another fingerprint (at the precision the model holds them in,
        [`_expected_fingerprint`]). `where`: the file they were read from."""
        family = model_family(model)
        if family != FAMILY:
            raise ValueError(
                f"The flow-map statistics{'' if where is None else f' of {where}'} serve a flow-map model, not "
                f"{type(model).__name__} (family {family!r}): give them to a FlowMapPipeline's network."
            )
        super().check_model(model, where)
