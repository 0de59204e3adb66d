"""The parts of diffusers' scheduler contract every scheduler of this package shares.

- `step(model_output, timestep, sample)` takes the steps in the order of `timesteps` and checks that `timestep` is
  the entry of the current step ([`check_timestep`]): a loop that skips or repeats a step fails loudly instead of
  sampling on a grid other than the one it passes to the network.
- `set_begin_index(i)` (after `set_timesteps`, before the run's first step) starts the run at step i, as diffusers'
  image-to-image pipelines do: the loop then runs over `timesteps[i:]` ([`check_begin_index`]).
- A scheduler built on an official one ([`OfficialBaseMixin`]: the untied and the comparison schedulers) builds it
  from its own config and hands it what is the official sampler's: the network input, the noising, the begin index.
"""

import inspect

import torch

from .run_context import TakesRunContext


def init_keys(cls: type) -> set[str]:
    """The config keys of a `ConfigMixin` class: the arguments of its `__init__`."""
    return set(inspect.signature(cls.__init__).parameters) - {"self", "args", "kwargs"}


def check_timestep(timestep: torch.Tensor | float, timesteps: torch.Tensor, index: int) -> None:
    """
    Refuses a `timestep` other than `timesteps[index]` (a 0-dim tensor, a number, or a tensor whose entries all equal
    it), naming both and the fix.

    The entry itself, as `for t in scheduler.timesteps` yields it, is recognised by its address, so that the check
    reads nothing back from the device; any other tensor or number is compared by value (in the schedule's dtype).
    """
    if isinstance(timestep, torch.Tensor) and timestep.ndim == 0 and timestep.device == timesteps.device:
        entry = timesteps.data_ptr() + index * timesteps.stride(0) * timesteps.element_size()
        if timestep.dtype == timesteps.dtype and timestep.data_ptr() == entry:
            return
    expected = timesteps[index].detach().cpu()
    if isinstance(timestep, torch.Tensor):
        got = timestep.detach().reshape(-1).to("cpu", expected.dtype)
    elif isinstance(timestep, int | float) and not isinstance(timestep, bool):
        got = torch.tensor([timestep], dtype=expected.dtype)
    else:
        raise TypeError(f"timestep must be a tensor or a number, got {type(timestep).__name__}.")
    if got.numel() == 0 or not bool((got == expected).all()):
        shown = got.tolist() if got.numel() != 1 else got.item()
        raise ValueError(
            f"step() got timestep {shown}, but the current step ({index}) is at timesteps[{index}] = "
            f"{expected.item():g}. Steps run in the order of `timesteps`: pass `scheduler.timesteps[scheduler.step_index]`"
            ", call `set_timesteps` to start again, or `set_begin_index` before the first step to start later."
        )


def check_begin_index(begin_index: int, num_timesteps: int | None, started: bool) -> None:
    """`set_begin_index` needs `set_timesteps` first, no step taken yet, and 0 ≤ `begin_index` < len(timesteps)."""
    if num_timesteps is None:
        raise RuntimeError("Call `set_timesteps` before `set_begin_index`.")
    if started:
        raise RuntimeError(
            "set_begin_index must come before the run's first `scale_model_input` or `step`; call `set_timesteps` "
            "again to restart."
        )
    if isinstance(begin_index, bool) or not isinstance(begin_index, int) or not 0 <= begin_index < num_timesteps:
        raise ValueError(f"begin_index must be an integer in [0, {num_timesteps - 1}], got {begin_index!r}.")


class OfficialBaseMixin(TakesRunContext):
    r"""
    A scheduler that runs the official scheduler of its family unchanged as `self.base` (the untied and the
    comparison schedulers). `_build_base()` builds it from this scheduler's config (its keys are a superset of the
    official ones); the network input, the noising, the grid and the begin index are the official scheduler's.
    """

    base_scheduler_class: type

    def _build_base(self) -> None:
        keys = init_keys(self.base_scheduler_class)
        self.base = self.base_scheduler_class(**{key: value for key, value in self.config.items() if key in keys})
        self.init_noise_sigma = self.base.init_noise_sigma
        self.timesteps: torch.Tensor | None = None
        self.num_inference_steps: int | None = None

    @property
    def step_index(self) -> int:
        return self._step_index

    @property
    def begin_index(self) -> int:
        """The step the run began at (0 unless `set_begin_index` said otherwise)."""
        return self.base.begin_index

    @property
    def solver(self):
        """The base solver of the current run (grid, κ_k, Δu_k, S_k)."""
        return self.base.solver

    def set_begin_index(self, begin_index: int = 0) -> None:
        """
        Starts the run at step `begin_index` (diffusers' image-to-image use): call it after `set_timesteps` and
        before the first step, then run the loop over `timesteps[begin_index:]` from a latent at that time. The
        trajectory state starts empty there, as at step 0.
        """
        check_begin_index(begin_index, self.num_inference_steps and len(self.timesteps), self._run_started())
        self.base.set_begin_index(begin_index)
        self._step_index = begin_index

    def _run_started(self) -> bool:
        return self._step_index != self.base.begin_index or self.base._run_started()

    def scale_model_input(self, sample: torch.Tensor, timestep: torch.Tensor | float | None = None) -> torch.Tensor:
        """The official network input (ELF re-noises here, drawing the official noise; LangFlow passes through)."""
        return self.base.scale_model_input(sample, timestep)

    def add_noise(
        self, original_samples: torch.Tensor, noise: torch.Tensor, timesteps: torch.Tensor | float
    ) -> torch.Tensor:
        """The family's noising, as the official scheduler's `add_noise` (the training objective's)."""
        return self.base.add_noise(original_samples, noise, timesteps)

    def _check_step(self, timestep: torch.Tensor | float) -> None:
        if self.num_inference_steps is None:
            raise RuntimeError("Call `set_timesteps` before sampling.")
        if self._step_index >= len(self.timesteps):
            raise RuntimeError(f"All {len(self.timesteps)} steps are done; call `set_timesteps` again.")
        check_timestep(timestep, self.timesteps, self._step_index)

    def __len__(self) -> int:
        return self.num_inference_steps or 0
