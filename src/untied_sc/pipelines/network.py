"""How a pipeline runs its network: mixed precision as the official code samples, `torch.compile`, and the outputs of a
compiled network copied out of its buffers."""

from typing import Self

import torch
from diffusers.utils import BaseOutput
from diffusers.utils.torch_utils import is_compiled_module, unwrap_module

from ..hardware import warn_if_emulated_bfloat16


def is_compiled_network(module: torch.nn.Module) -> bool:
    """Whether `module` runs compiled: in place (`module.compile()`) or wrapped (`torch.compile(module)`)."""
    return is_compiled_module(module) or getattr(module, "_compiled_call_impl", None) is not None


def owned_outputs(output: BaseOutput) -> BaseOutput:
    """`output` with each CUDA tensor copied: a CUDA-graph replay writes its outputs into the same static buffers every
    time, and the pipelines keep a step's outputs past the next call (self-conditioning, the scheduler's history)."""
    if not any(isinstance(value, torch.Tensor) and value.is_cuda for value in output.values()):
        return output
    return type(output)(**{name: value.clone() for name, value in output.items()})


class NetworkMixin:
    """The network methods of [`LanguageFlowPipeline`]: autocast, compile, and the one call of the transformer."""

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

    def compile_network(self, mode: str | None = None, **compile_kwargs) -> Self:
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
