"""Calibration over several processes: each bank's batches split by index, float64 sums added across processes.

Launched with `torchrun --nproc_per_node N` (or `accelerate launch`), each process runs the batches b with
b ≡ rank (mod N) of every bank. A batch's randomness is a function of (seed, b) alone (`bank_seeds`), so the set of
trajectories is the same whatever N is. Every calibrated statistic is a ratio of float64 running sums (counts, Σx,
Σx², Σ cosine distances, Σ per-batch response Grams), so each process keeps its own sums and they are added across
processes (accelerate's `reduce`, an all-reduce) before the ratios are taken.

Which sums depend on the order of summation: the counts are integers held exactly in float64 (order-free); the sums
of real values (Σ token means, Σ cosine distances, Σ‖C Ũ‖², the Gram sums) are float64 additions, whose rounding
depends on the order the batches are added in (one process: b = 0, 1, 2, …; N processes: each process's batches in
order, then the all-reduce's order across processes). The difference is a few float64 ulps of Σ|x| per term, far
below the 1e-6 relative agreement the statistics (stored in float32) are held to; the per-batch values themselves do
not depend on N (the same batch runs the same network calls). With 2 processes the all-reduce gives every process
the same bits (a + b = b + a); with more, the grouping across processes is the backend's.
"""

import os
from typing import TypeVar

import torch
from accelerate.utils import reduce

from ..distributed import process_state


T = TypeVar("T")


def launched_processes() -> int:
    """The number of processes a launcher (torchrun, `accelerate launch`) started: `WORLD_SIZE`, else 1."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def calibration_process_state(device: str | None = None):
    """
    The accelerate `PartialState` of a multi-process launch (one process per GPU, each on its `state.device`), or
    `None` when a single process runs (no process group is needed).

    Args:
        device (`str`, *optional*): `"cpu"` runs every process on the CPU (gloo backend); `"cuda"` one process per
            GPU (`cuda:LOCAL_RANK`, nccl); `None` the GPUs where CUDA is available, else the CPU. A device with an
            index (`cuda:1`) names one GPU, which several processes cannot share.
    """
    if launched_processes() <= 1:
        return None

    if device is not None and torch.device(device).index is not None:
        raise ValueError(
            f"--device {device} names one device, but {launched_processes()} processes were launched: each process "
            "takes its own (accelerate's `PartialState().device`); pass --device cuda (or cpu)."
        )
    state = process_state(device)  # the CPU (gloo) without a GPU; the process group closed at exit
    if device is not None and state.device.type != torch.device(device).type:
        raise ValueError(f"--device {device} was asked for, but this process got {state.device} (is CUDA there?).")
    if state.num_processes != launched_processes():
        raise RuntimeError(
            f"{launched_processes()} processes were launched but accelerate joined {state.num_processes}: "
            "launch with torchrun or accelerate launch, which set RANK, WORLD_SIZE and MASTER_ADDR."
        )
    return state


def process_share(batches: list[T], state) -> list[T]:
    """The batches this process runs: those whose index b ≡ rank (mod number of processes); all of them alone."""
    if state is None:
        return list(batches)
    return list(batches[state.process_index :: state.num_processes])


def sum_across_processes(sums: dict[str, torch.Tensor], state) -> dict[str, torch.Tensor]:
    """
    Each float64 sum added over the processes (every process gets the totals), on the sums' own device; the sums
    themselves when one process runs.
    """
    if state is None or state.num_processes == 1:
        return sums

    for name, value in sums.items():
        if value.dtype != torch.float64:
            raise TypeError(f"Calibration sums are float64; {name!r} is {value.dtype}.")
    totals = reduce({name: value.to(state.device) for name, value in sums.items()}, reduction="sum")
    return {name: totals[name].to(sums[name].device) for name in sums}


def is_main_process(state) -> bool:
    """Whether this process writes files and shows progress bars (the only one, or rank 0)."""
    return state is None or state.is_main_process


def wait_for_everyone(state) -> None:
    """A barrier: every process returns once the main one has written its files."""
    if state is not None:
        state.wait_for_everyone()
