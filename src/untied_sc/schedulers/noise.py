"""The sampler's Gaussian draws from one `torch.Generator`, in the official order, drawn ahead off the GPU's path.

What reproduces what (docs/algorithm.md §2.1, "Random draws"):

- A **CPU generator** gives the CPU stream of the official PyTorch port, bit for bit, whatever device the sampler
  runs on: every tensor is drawn on the CPU and then moved. On an accelerator, [`NoiseStream`] draws the next
  tensor ahead on a background thread into pinned memory while the network runs, and copies it without blocking
  the host; the numbers are those of inline drawing, and the generator ends in the same state.
- A **CUDA generator** gives a device stream: every tensor is drawn on the generator's device (the official code on
  CUDA draws grid, z_0 and noise from the CUDA RNG, one stream). It reproduces itself for a seed, not the CPU stream.

While a draw ahead is in flight its generator belongs to the background thread. The run owns it ([`RunRandom`]:
the pipeline call's, in its `RunContext`, or the scheduler's own for a direct call): `settle` waits for the draw and
gives its numbers back to the generator (restores the state from before it), so that the next draw is the one inline
drawing would make. A run settles before its grid and when it ends (also by an error or a shorter loop), so the
decode's draws that follow see the inline state.
"""

import threading
from collections.abc import Sequence

import torch


SUPPORTED_GENERATOR_DEVICES = ("cpu", "cuda")


def check_generator(generator: torch.Generator) -> None:
    """Refuses a generator list and generators on devices other than the CPU and CUDA, saying what to pass."""
    if isinstance(generator, list | tuple):
        raise ValueError("ELF draws one time grid per batch: pass a single torch.Generator, not a list.")
    if not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator or None, got {type(generator).__name__}.")
    if generator.device.type not in SUPPORTED_GENERATOR_DEVICES:
        raise ValueError(
            f"The generator is on {generator.device}; pass a CPU torch.Generator (the official CPU stream, on any "
            "device) or a CUDA one (a stream drawn on that GPU)."
        )


def global_generator(device: str | torch.device | None = None) -> torch.Generator:
    """
    torch's own generator for `device` (the one `torch.manual_seed` seeds): what diffusers draws from when a call gets
    no generator, so that `torch.manual_seed(0)` makes it reproducible. CUDA devices have their own; every other
    device (CPU, or one whose draws are made on the CPU) gets the CPU one.
    """
    device = torch.device("cpu" if device is None else device)
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return torch.cuda.default_generators[index]
    return torch.default_generator


def draw_normal(
    shape: Sequence[int], generator: torch.Generator, device: str | torch.device, dtype: torch.dtype = torch.float32
) -> torch.Tensor:
    """
    ε ~ N(0, I) of `shape` from `generator`, drawn on the generator's device (its own stream: a CPU generator gives
    the CPU numbers on any device) and moved to `device` (from pinned memory without blocking, for a GPU).
    """
    device = torch.device(device)
    if generator.device.type == "cpu":
        return _to_device(_draw_on_cpu(tuple(shape), generator, dtype, pin=device.type == "cuda"), device)
    return torch.randn(tuple(shape), generator=generator, device=generator.device, dtype=dtype).to(device)


class RunRandom:
    """
    The random draws of one sampling run from its `generator`: the owner of the one draw ahead that may be in flight
    on it. The steps' noise comes from its [`NoiseStream`] (`noise`); before any other draw of the run, and when the
    run ends (`with run_random:`), `settle` gives a draw ahead not taken back to the generator.

    Args:
        generator (`torch.Generator`): the run's generator.
    """

    def __init__(self, generator: torch.Generator):
        self.generator = generator
        self._drawing: NoiseStream | None = None  # the stream whose draw ahead is in flight

    def noise(self, num_draws: int, draw_ahead: bool | None = None) -> "NoiseStream":
        """The run's noise stream of `num_draws` tensors (see [`NoiseStream`]), after settling the generator."""
        self.settle()
        return NoiseStream(self.generator, num_draws, draw_ahead, owner=self)

    def normal(
        self, shape: Sequence[int], device: str | torch.device, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """[`draw_normal`] from the run's generator, after settling it."""
        self.settle()
        return draw_normal(shape, self.generator, device, dtype)

    def settle(self) -> None:
        """Waits for a draw ahead in flight, if any, and gives its numbers back (the generator returns to the state
        before that draw; the stream that made it draws inline from then on)."""
        if self._drawing is not None:
            self._drawing.close()

    def __enter__(self) -> "RunRandom":
        return self

    def __exit__(self, *exc_info) -> None:
        self.settle()


class _DrawAhead:
    """One tensor drawn on a background thread; `result()` joins it and returns it (or raises its error)."""

    def __init__(self, generator: torch.Generator, shape: tuple[int, ...], dtype: torch.dtype, pin: bool):
        self.shape, self.dtype = shape, dtype
        self.state_before = generator.get_state()  # to give the numbers back if nobody takes them
        self._tensor: torch.Tensor | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._draw, args=(generator, pin), daemon=True)
        self._thread.start()

    def _draw(self, generator: torch.Generator, pin: bool) -> None:
        try:
            self._tensor = _draw_on_cpu(self.shape, generator, self.dtype, pin)
        except BaseException as error:  # handed to the consumer's thread by `result()`
            self._error = error

    def result(self) -> torch.Tensor:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._tensor


def _draw_on_cpu(shape: tuple[int, ...], generator: torch.Generator, dtype: torch.dtype, pin: bool) -> torch.Tensor:
    """`torch.randn(shape, generator=generator, dtype=dtype)` (same numbers: randn is `empty` + `normal_`), pinned."""
    return torch.empty(shape, dtype=dtype, pin_memory=pin).normal_(generator=generator)


def _to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """`tensor` on `device`; a pinned one is copied without blocking (torch keeps its memory until the copy is done)."""
    return tensor.to(device, non_blocking=tensor.is_pinned())


class NoiseStream:
    r"""
    The noise tensors ε_0, …, ε_{n−1} of one sampling run, drawn from `generator` in that order, each once.

    `next(shape, device, dtype)` returns the next one on `device`; it is exactly
    `torch.randn(shape, generator=generator, device=generator.device, dtype=dtype).to(device)`, made in the order of
    the calls. With draw-ahead (a CPU generator and a non-CPU `device`, by default), each call then starts drawing
    the following tensor (same shape and dtype) on a background thread into pinned memory, and the next call copies
    it to the device without blocking; the last of the `num_draws` tensors starts no draw, so the stream never draws
    more than the run consumes. A call whose shape or dtype differs from the drawn-ahead tensor's gives those numbers
    back to the generator and draws inline, as would a run without draw-ahead.

    Args:
        generator (`torch.Generator`): the run's generator (CPU or CUDA).
        num_draws (`int`): n, how many tensors the run takes (ELF: N − 1, one per SDE step).
        draw_ahead (`bool`, *optional*): `None` (default): draw ahead when the generator is on the CPU and the
            tensors go to another device. `True`: also for CPU tensors (on a thread, without pinning; the tests use
            it). `False`: never. A CUDA generator never draws ahead (its draws are already asynchronous).
        owner ([`RunRandom`], *optional*): the run that owns the generator's draws ([`RunRandom.noise`]); default:
            a run of this stream alone.
    """

    def __init__(
        self,
        generator: torch.Generator,
        num_draws: int,
        draw_ahead: bool | None = None,
        owner: RunRandom | None = None,
    ):
        check_generator(generator)
        if not isinstance(num_draws, int) or num_draws < 0:
            raise ValueError(f"num_draws must be an integer ≥ 0, got {num_draws!r}.")
        if owner is not None and owner.generator is not generator:
            raise ValueError("A noise stream draws from the generator of the run that owns it.")
        self.generator, self.num_draws, self.draw_ahead = generator, num_draws, draw_ahead
        self.owner = RunRandom(generator) if owner is None else owner
        self.num_taken = 0
        self._ahead: _DrawAhead | None = None
        self._closed = False

    def _draws_ahead_to(self, device: torch.device) -> bool:
        if self._closed or self.generator.device.type != "cpu":
            return False
        return device.type != "cpu" if self.draw_ahead is None else bool(self.draw_ahead)

    def next(
        self, shape: Sequence[int], device: str | torch.device, dtype: torch.dtype = torch.float32
    ) -> torch.Tensor:
        """ε_k, k = the number of tensors taken so far, of `shape` and `dtype` on `device`."""
        if self.num_taken >= self.num_draws:
            raise RuntimeError(
                f"All {self.num_draws} noise tensors of this run are drawn; call `set_timesteps` again."
            )
        shape, device = tuple(shape), torch.device(device)
        ahead, pin = self._draws_ahead_to(device), device.type == "cuda"
        noise = self._take_ahead(shape, dtype)
        if noise is None and self.generator.device.type == "cpu":
            noise = _draw_on_cpu(shape, self.generator, dtype, pin=ahead and pin)
        elif noise is None:
            noise = torch.randn(shape, generator=self.generator, device=self.generator.device, dtype=dtype)
        self.num_taken += 1
        if ahead and self.num_taken < self.num_draws:
            self._start_ahead(shape, dtype, pin=pin)
        return _to_device(noise, device)

    def _start_ahead(self, shape: tuple[int, ...], dtype: torch.dtype, pin: bool) -> None:
        if self.owner._drawing not in (None, self):
            raise RuntimeError("Two noise streams of one run draw ahead at once; settle the run between them.")
        self._ahead = _DrawAhead(self.generator, shape, dtype, pin)
        self.owner._drawing = self

    def _finish_ahead(self) -> _DrawAhead | None:
        """Joins the draw ahead, if any, and tells its owner; returns it. A failed draw is given back, then raised."""
        ahead, self._ahead = self._ahead, None
        if ahead is None:
            return None
        try:
            ahead.result()
        except BaseException:
            self.generator.set_state(ahead.state_before)
            raise
        finally:
            if self.owner._drawing is self:
                self.owner._drawing = None
        return ahead

    def _take_ahead(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """The drawn-ahead tensor if it is the one asked for; else its numbers go back and `None` is returned."""
        ahead = self._finish_ahead()
        if ahead is None:
            return None
        if (ahead.shape, ahead.dtype) == (shape, dtype):
            return ahead.result()
        self.generator.set_state(ahead.state_before)
        return None

    def close(self) -> None:
        """Joins a draw ahead and gives its numbers back to the generator; later tensors are drawn inline."""
        ahead = self._finish_ahead()
        if ahead is not None:
            self.generator.set_state(ahead.state_before)
        self._closed = True
