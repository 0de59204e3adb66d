"""Calibration over several processes: the same statistics from 1 or 2 processes; cost, device, dtype."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import load_file

import untied_sc
from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler
from untied_sc.calibration import calibrate_pipeline
from untied_sc.calibration.calibrate import bank_seeds
from untied_sc.calibration.reduction import process_share, sum_across_processes
from untied_sc.calibration.reference import MomentAccumulator
from untied_sc.cli import main as cli_main

from .conftest import elf_from_golden, langflow_from_golden
from .tiny import tiny_tokenizer


TOLERANCE = 1e-6  # relative, on every statistics tensor


def _child_env() -> dict[str, str]:
    """The test's own `untied_sc` first on the path; one thread per process (what torchrun sets for N > 1)."""
    source = str(Path(untied_sc.__file__).resolve().parents[1])
    path = os.pathsep.join(filter(None, [source, os.environ.get("PYTHONPATH")]))
    return {**os.environ, "PYTHONPATH": path, "OMP_NUM_THREADS": "1"}


def _torchrun(*args: str, processes: int = 2) -> subprocess.CompletedProcess:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={processes}"]
    return subprocess.run(
        [*command, *args], env=_child_env(), capture_output=True, text=True, timeout=300, check=False
    )


def _statistics_tensors(folder: Path) -> dict[str, torch.Tensor]:
    (weights,) = (folder / "sampler_statistics").glob("*.safetensors")
    return load_file(weights)


def _relative_error(value: torch.Tensor, reference: torch.Tensor) -> float:
    value, reference = value.double(), reference.double()
    scale = reference.norm().item()
    return (value - reference).norm().item() / scale if scale > 0 else (value - reference).norm().item()


@pytest.fixture
def one_thread():
    """In-process runs on one thread, as each torchrun process (and tiny matmuls gain nothing from more)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_pipelines(tmp_path, elf_golden, langflow_golden):
    """The golden fixtures' tiny models (trained-like weights: their flow head responds) saved as pipelines."""
    folders = {"elf": tmp_path / "elf", "langflow": tmp_path / "langflow"}
    ELFPipeline(elf_from_golden(elf_golden), ELFScheduler(), tiny_tokenizer()).save_pretrained(folders["elf"])
    langflow = langflow_from_golden(langflow_golden)
    LangFlowPipeline(langflow, LangFlowScheduler(), tiny_tokenizer()).save_pretrained(folders["langflow"])
    return folders


# ---- the reduction on hand-made sums ------------------------------------------------------------------------------


def test_process_share_splits_each_bank_by_batch_index():
    bank = bank_seeds(2000, 0, 11, 2)  # 6 batches, the last of 1
    shares = [process_share(bank, SimpleNamespace(process_index=rank, num_processes=3)) for rank in range(3)]
    assert shares == [[bank[0], bank[3]], [bank[1], bank[4]], [bank[2], bank[5]]]
    assert sorted(batch for share in shares for batch in share) == sorted(bank)  # each batch once
    assert process_share(bank, None) == bank


def test_moment_sums_of_split_batches_add_up_to_the_one_process_statistics():
    generator = torch.Generator().manual_seed(0)
    batches = []
    for size in (3, 3, 3, 2, 1):  # hand-made corrections (B, L, D), distances (B, L), masks with an empty row
        mask = torch.rand(size, 5, generator=generator) > 0.3
        mask[0] = False
        correction = torch.randn(size, 5, 4, generator=generator) * mask[..., None]
        batches.append((correction, torch.rand(size, 5, generator=generator), mask))
    one = MomentAccumulator(2, 4)
    for b, (correction, distance, mask) in enumerate(batches):
        one.add(b % 2, correction, distance, mask)
    per_process = []
    for rank in range(2):
        accumulator = MomentAccumulator(2, 4)
        for b in range(rank, len(batches), 2):  # batch b runs on process b mod 2
            accumulator.add(b % 2, *batches[b])
        per_process.append(accumulator.sums())
    totals = {name: per_process[0][name] + per_process[1][name] for name in MomentAccumulator.SUMS}
    both = MomentAccumulator(2, 4)
    both.load_sums(totals)
    for statistic in ("mean", "rms", "cosine_distance"):
        torch.testing.assert_close(getattr(both, statistic)(), getattr(one, statistic)(), rtol=1e-12, atol=0)
    assert torch.equal(both.trajectories, one.trajectories)  # counts are exact in float64 in any order
    with pytest.raises(ValueError, match="expected"):
        both.load_sums({**totals, "mean_sum": torch.zeros(3, 4, dtype=torch.float64)})
    with pytest.raises(TypeError, match="float64"):
        sum_across_processes({"count": torch.ones(2)}, SimpleNamespace(num_processes=2))


REDUCE_SCRIPT = """
import json, sys, torch
from untied_sc.calibration.reduction import calibration_process_state, sum_across_processes
state = calibration_process_state("cpu")
rank = state.process_index
sums = {"x": torch.tensor([1.0, 2.0], dtype=torch.float64) * (rank + 1), "n": torch.tensor(3.0 + rank).double()}
totals = sum_across_processes(sums, state)
result = {"rank": rank, "x": totals["x"].tolist(), "n": totals["n"].item(), "device": str(state.device)}
with open(sys.argv[1] + f"/rank{rank}.json", "w") as handle:  # a file each: two processes' prints can interleave
    json.dump(result, handle)
"""


def test_sums_are_added_across_two_real_processes(tmp_path):
    script = tmp_path / "reduce.py"
    script.write_text(REDUCE_SCRIPT)
    run = _torchrun(str(script), str(tmp_path))
    assert run.returncode == 0, run.stderr[-3000:]
    results = [json.loads(path.read_text()) for path in sorted(tmp_path.glob("rank*.json"))]
    assert [r["rank"] for r in sorted(results, key=lambda r: r["rank"])] == [0, 1]
    for result in results:  # every process gets the totals: (1 + 2)·[1, 2] and 3 + 4
        assert result["x"] == [3.0, 6.0] and result["n"] == 7.0 and result["device"].startswith("cpu")


# ---- the command: 2 processes give the 1-process statistics -------------------------------------------------------


@pytest.mark.parametrize(("family", "bank_size"), [("elf", 8), ("langflow", 7)])
def test_two_process_calibration_equals_one_process(one_thread, tiny_pipelines, tmp_path, capsys, family, bank_size):
    """
    `torchrun --nproc_per_node 2 -m untied_sc.cli calibrate` on the CPU (gloo) writes the statistics of one process,
    within 1e-6 relative on every tensor (ELF: base scales included, over an uneven 2 + 1 split of their batches;
    LangFlow: a bank of 7 whose last batch has 1 trajectory). Only the main process writes and prints.
    """
    source = tiny_pipelines[family]
    common = ["--nfe", "4", "--bank-size", str(bank_size), "--batch-size", "2", "--device", "cpu", "--no-progress"]
    common += ["--base-scale-bank-size", "6", "--base-scale-steps", "4"]
    assert cli_main(["calibrate", str(source), *common, "--output", str(tmp_path / "one")]) == 0
    assert "Cost on cpu, float32, 1 process" in capsys.readouterr().out

    run = _torchrun("-m", "untied_sc.cli", "calibrate", str(source), *common, "--output", str(tmp_path / "two"))
    assert run.returncode == 0, run.stderr[-3000:]
    assert run.stdout.count("Wrote sampler statistics") == 1, run.stdout  # the main process alone writes
    assert "Cost on cpu, float32, 2 processes" in run.stdout

    one, two = _statistics_tensors(tmp_path / "one"), _statistics_tensors(tmp_path / "two")
    assert set(one) == set(two) and {"mean_nfe4", "rms_nfe4", "cosine_distance_nfe4", "base_scales"} <= set(one)
    errors = {name: _relative_error(two[name], one[name]) for name in one}
    assert all(error <= TOLERANCE for error in errors.values()), errors
    assert one["rms_nfe4"].gt(0).any()  # something was measured
    if family == "elf":
        assert not torch.equal(one["base_scales"], torch.ones(2))  # measured, not LangFlow's (1, 1)
    configs = [
        json.loads((tmp_path / name / "sampler_statistics" / "config.json").read_text()) for name in ("one", "two")
    ]
    assert configs[0] == configs[1]  # banks, seeds, α, fingerprint


# ---- device, dtype and the base-scale bank ------------------------------------------------------------------------


def test_bf16_runs_leave_the_pipeline_and_the_base_scales_in_float32(one_thread, tiny_pipelines):
    from untied_sc.pipelines import load_pipeline

    pipe = load_pipeline(tiny_pipelines["elf"])
    options = {"bank_size": 4, "batch_size": 2, "base_scale_bank_size": 4, "base_scale_steps": 4, "progress": False}
    full = calibrate_pipeline(pipe, [4], **options)
    half = calibrate_pipeline(pipe, [4], **options, device="cpu", dtype=torch.bfloat16)
    assert (half.dtype, full.dtype) == ("bfloat16", "float32")
    assert pipe.transformer.dtype == torch.float32  # the runs used a cast copy
    assert half.statistics.config.model_fingerprint == full.statistics.config.model_fingerprint
    # the response Gram (a finite difference at ε = 1e-2) runs in float32 whatever the trajectories' dtype
    torch.testing.assert_close(half.statistics.base_scales, full.statistics.base_scales, rtol=0, atol=0)
    assert not torch.equal(half.statistics.for_steps(4).mean, full.statistics.for_steps(4).mean)  # bf16 runs
    torch.testing.assert_close(half.statistics.for_steps(4).rms, full.statistics.for_steps(4).rms, rtol=0.05, atol=0)


def test_base_scales_follow_their_own_bank_not_bank_size(one_thread, tiny_pipelines):
    from untied_sc.pipelines import load_pipeline

    pipe = load_pipeline(tiny_pipelines["elf"])

    def base_scales(**options):
        options = {"bank_size": 2, "batch_size": 2, "base_scale_steps": 4, "progress": False, **options}
        return calibrate_pipeline(pipe, [4], **options).statistics.base_scales

    reference = base_scales(base_scale_bank_size=4)
    assert torch.equal(base_scales(base_scale_bank_size=4, bank_size=6), reference)
    assert not torch.equal(base_scales(base_scale_bank_size=6), reference)
    with pytest.raises(ValueError, match="base_scale_steps ≥ 4"):
        base_scales(base_scale_bank_size=4, base_scale_steps=3)


def test_calibration_generator_device_is_checked_and_the_cpu_stream_is_the_default(tmp_path):
    from untied_sc import LangFlowTransformerModel

    from .tiny import tiny_tokenizer

    torch.manual_seed(0)
    model = LangFlowTransformerModel(
        vocab_size=40, hidden_size=32, cond_dim=16, num_layers=1, num_attention_heads=4, max_length=8
    ).eval()
    pipe = LangFlowPipeline(model, LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    kwargs = {"bank_size": 4, "batch_size": 2, "progress": False}
    default = calibrate_pipeline(pipe, [4], **kwargs)
    explicit = calibrate_pipeline(pipe, [4], generator_device="cpu", **kwargs)
    assert default.generator_device == explicit.generator_device == "cpu"
    assert torch.equal(default.statistics.mean_nfe4, explicit.statistics.mean_nfe4)
    with pytest.raises(ValueError, match="generator_device must be 'cpu' or 'cuda'"):
        calibrate_pipeline(pipe, [4], generator_device="meta", **kwargs)
