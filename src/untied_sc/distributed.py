"""Splitting sampling across processes started by `accelerate launch` (or `torchrun`): one process per device.

Work is split by batch index: batch b of a run goes to process `b mod num_processes` ([`shard_batches`]), and its
randomness is a function of (seed, b) alone (`sampling.batch_seed`), never of the process that draws it. Each process
samples its own batches on its own device, every process then receives all of them ordered by batch index
([`gather_in_order`]), and the main process alone writes files and shows progress bars. So a run gives the same
samples, in the same order, with 1, 2 or N processes (bit for bit on one device type).

A command started without a launcher is one process: everything here then reduces to the plain loop.
"""

import atexit
from collections.abc import Iterable, Mapping, Sequence
from typing import TypeVar

import torch
from accelerate import PartialState
from accelerate.utils import gather_object
from diffusers.utils import logging as diffusers_logging
from tqdm.auto import tqdm
from transformers.utils import logging as transformers_logging


T = TypeVar("T")


def _wants_cpu(device: str | torch.device | None) -> bool:
    """Whether the processes run on CPU: the requested device is a CPU, or none is requested and no GPU exists."""
    if device is not None:
        return torch.device(device).type == "cpu"
    return not torch.cuda.is_available()


def process_state(device: str | torch.device | None = None):
    """This process's [`accelerate.PartialState`]: its rank, the number of processes and its device.

    On CPU (`device` a CPU, or no GPU at all) the state is built with `cpu=True`, so that processes started on CPU
    (`torchrun --nproc_per_node 2`) join one gloo process group; without it accelerate treats every CPU process as
    the only one and each would sample everything. The state is accelerate's process-wide singleton: the first call
    in a process fixes it.
    """
    global _closing_registered
    state = PartialState(cpu=_wants_cpu(device))
    if state.num_processes > 1 and not _closing_registered:
        atexit.register(_close_process_group)
        _closing_registered = True
    return state


_closing_registered = False


def _close_process_group() -> None:
    """Destroys the process group before the interpreter exits: left to static destruction, gloo's worker threads
    can abort both processes at exit ("terminate called without an active exception") after all work is done."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


def process_device(state, device: str | torch.device | None = None) -> torch.device:
    """The device this process samples on: its own (`state.device`) unless `device` names another.

    `None` gives `state.device` (under `accelerate launch`: process i's GPU, i = its local rank). A device type with
    no index (`"cuda"`) also gives `state.device` when that is of the same type, so `--device cuda` still puts each
    process on its own GPU; an indexed device (`"cuda:1"`) is used as given. On CPU every process gets `cpu`.
    """
    own = torch.device(state.device)
    if device is None:
        wanted = own
    else:
        wanted = torch.device(device)
        if wanted.index is None and wanted.type == own.type:
            wanted = own
    return torch.device("cpu") if wanted.type == "cpu" else wanted


def process_rank(state) -> tuple[int, int]:
    """(process index, number of processes) of `state`; `(0, 1)` for `None` (a single process)."""
    if state is None:
        return 0, 1
    return int(state.process_index), int(state.num_processes)


def batch_shard(num_batches: int, process_index: int, num_processes: int) -> range:
    """The batch indices process `process_index` of `num_processes` samples: b with b mod num_processes = index.

    Strided rather than contiguous, so that a short last batch costs no process more than one batch. A function of
    the indices alone: the shards of all processes partition 0..num_batches-1.
    """
    if num_processes < 1 or not 0 <= process_index < num_processes:
        raise ValueError(f"Process {process_index} of {num_processes} does not exist.")
    if num_batches < 0:
        raise ValueError(f"num_batches must be non-negative, got {num_batches}.")
    return range(process_index, num_batches, num_processes)


def shard_batches(num_batches: int, state=None) -> range:
    """The batch indices this process samples ([`batch_shard`] of its rank; every batch for `state=None`)."""
    return batch_shard(num_batches, *process_rank(state))


def gather_in_order(per_batch_results: Mapping[int, T], state=None) -> list[T]:
    """Every process's results, ordered by batch index, on every process.

    Args:
        per_batch_results: this process's results by batch index (its shard, [`shard_batches`]).
        state: the [`process_state`] (`None`: a single process).

    Returns:
        The results of batches 0..B-1 in order, whatever the number of processes: accelerate's `gather_object`
        collects the (index, result) pairs of all processes, which are then sorted by index. Raises if a batch is
        missing or was sampled twice (shards that do not partition the batches).
    """
    pairs = sorted(per_batch_results.items(), key=lambda pair: pair[0])
    if process_rank(state)[1] > 1:
        pairs = sorted(gather_object(pairs), key=lambda pair: pair[0])
    indices = [index for index, _ in pairs]
    if indices != list(range(len(indices))):
        raise ValueError(f"The processes' batches {indices} are not 0..{len(indices) - 1} exactly once each.")
    return [result for _, result in pairs]


def slowest_process_seconds(seconds_by_batch: Sequence[float], num_processes: int) -> float:
    """The sampling time of a sharded run: the largest, over processes, of the summed seconds of its batches.

    The processes sample their shards at the same time, so the run takes as long as its slowest process; with one
    process this is the sum over batches.
    """
    return max(
        (sum(seconds_by_batch[b] for b in batch_shard(len(seconds_by_batch), rank, num_processes)))
        for rank in range(num_processes)
    )


def is_main_process(state=None) -> bool:
    """Whether this process writes files and shows progress (the only one, or the main one of several)."""
    return process_rank(state)[0] == 0


def main_process_progress(iterable: Iterable[T], state=None, enabled: bool = True, **tqdm_kwargs) -> Iterable[T]:
    """`iterable` under a tqdm bar shown by the main process alone (none when `enabled` is false)."""
    return tqdm(iterable, disable=not enabled or not is_main_process(state), **tqdm_kwargs)


def silence_other_processes(state=None) -> None:
    """On a process other than the main one, turns off diffusers' and transformers' progress bars (e.g. "Loading
    pipeline components"), so that the terminal shows one process's bars, not N interleaved copies."""
    if is_main_process(state):
        return
    diffusers_logging.disable_progress_bar()
    transformers_logging.disable_progress_bar()


def describe_processes(state=None) -> str:
    """E.g. `"1 process"` or `"2 processes"`: how many processes sampled (for reports)."""
    count = process_rank(state)[1]
    return f"{count} process{'es' if count != 1 else ''}"
