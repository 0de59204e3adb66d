"""Our pipelines next to the official ELF and LangFlow code: samples/s and peak memory, ours / theirs, one run.

    python benchmarks/side_by_side.py --elf-repo /path/to/ELF --langflow-repo /path/to/LangFlow \\
        --device cpu --batch-sizes 1 --repeats 3 --output benchmarks/results/side-by-side-cpu.json
    python benchmarks/side_by_side.py --elf-repo ... --langflow-repo ... --device cuda --batch-sizes 4 32 \\
        --output benchmarks/results/side-by-side-h100.json

The official code is imported at run time from the given checkouts (never copied here): `--elf-repo` is a checkout
of the ELF repository at its `pytorch_elf` branch (the PyTorch port; its `src/` is put on `sys.path`), `--langflow-repo`
a checkout of the LangFlow repository (`langflow/` package at its root). Their own requirements must be importable
(the ELF port needs `einops`; nothing else of theirs is used: the sampler functions are called directly, so neither
`generation.py`'s metrics imports nor a shim is needed). Nothing in their code is patched.

Per family, one network, the same random weights on both sides: the official model is built with its own random
init (`modules.model.ELF_B` / `langflow.model.LangFlow`, seeded), the parameters that init leaves at zero (ELF's flow
head; LangFlow's adaLN, output layer and self-conditioning projection) are filled with N(0, 0.02²) so that the
predictions, and hence the self-conditioning path, are not trivial; its state dict is then written in the official
checkpoint format and read back with our converter (`load_official_elf` / `load_official_langflow`). Shapes:
ELF-B (105M parameters, L = 1024, latent 512, T5 vocabulary 32100; the OWT training config), LangFlow OWT (12 blocks,
768 wide, L = 1024, GPT-2 vocabulary 50257). `--elf-layers` / `--langflow-layers` / `--length` give smaller shapes;
the results say so.

Variants, timed end to end, from the seed to the token ids (no text decoding on either side):

- `theirs`: ELF: the body of the official `generation.test_generation_uncond` for one batch: `get_sampling_steps`,
  z_0, `_generate_samples_single_batch` (N−1 SDE steps + 1 ODE step), `_dlm_decode_batch`, `mask_after_eos`, seeded
  as `eval.py` does (a CPU `torch.Generator` and the global RNG). Its once-per-config model copy
  (`_build_eval_model`), logging and file output are left out. LangFlow: `LangFlow.generate_samples` after
  `torch.manual_seed` (as `gen_ppl.py`).
- `ours_official`: `ELFPipeline` / `LangFlowPipeline` with the official scheduler (`ELFScheduler` /
  `LangFlowScheduler`), `output_type="seq"`.
- `ours_untied`: the same pipeline with `UntiedSelfConditioningScheduler` (the paper's coefficients, `elf-b` /
  `langflow-owt`, every part of the untied step active) and random calibration statistics on the model's real
  overlap basis.

Same NFE, batch, seed per repeat, device and dtype on all sides. On the GPU (`--device cuda`) the official code
autocasts to bfloat16 itself (ELF: `use_bf16`, the port's default; LangFlow: hard-coded around its blocks and output
layer); our pipelines run with `pipe.enable_autocast(torch.bfloat16)` (`--autocast bf16`, the default on cuda), which
autocasts the same regions of the network as the official code (ELF: the blocks; LangFlow: the blocks and output
layer, with float32 layer norms) and leaves the schedulers outside. `--autocast none` runs ELF in float32 on both
sides; LangFlow's official blocks stay bf16 there (hard-coded), so compare LangFlow on the GPU with bf16 only. On the CPU both run float32 (the official
autocast is CUDA-only). SDPA attention on both sides; a CUDA generator (`--generator-device cuda`) draws our noise on
the GPU, as the official code does there.

After `--warmup` untimed runs of every variant, `--repeats` rounds, each running every variant once in rotating
order (round r starts at variant r mod 3), so drifts in machine load hit every variant alike. Per round: seconds,
samples/s, and peak memory of the run above what was in use before it (CPU: peak RSS, with the kernel's high-water
mark reset before each run via /proc/self/clear_refs and freed heap returned first with malloc_trim; GPU:
`torch.cuda.max_memory_allocated` minus the allocated bytes before the run). Ratios ours / theirs are paired within a
round, then min / median / max over rounds. Targets: `ours_official` ≥ 1.00× their throughput at ≤ 1.00× their peak
memory; `ours_untied` ≥ 0.99× their throughput. Token agreement (same seed, `ours_official` vs `theirs`) is
reported as a check that both sides ran the same sampler on the same network.

Writes a JSON and a Markdown file (same stem; refuses to overwrite without `--overwrite`), after every family.
"""

import argparse
import ctypes
import datetime
import gc
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch


REPO = Path(__file__).resolve().parents[1]
VARIANTS = ("theirs", "ours_official", "ours_untied")
SC_CFG_SCALE = 3.0  # the released ELF models' SC-CFG scale
SEED = 0
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile", "bf16")

# ELF-B on OpenWebText (train_owt_ELF-B.yml): T5-small latents, 4 time / SC-CFG / mode tokens, bottleneck 128.
ELF_B = {"text_encoder_dim": 512, "bottleneck_dim": 128, "vocab_size": 32100, "tokens": 4}
ELF_RUN = {"denoiser_p_mean": -1.5, "denoiser_p_std": 0.8, "denoiser_noise_scale": 2.0, "t_eps": 0.05}
# LangFlow OWT (the released config.json): GPT-2 vocabulary.
LANGFLOW_OWT = {
    "vocab_size": 50257,
    "hidden_size": 768,
    "cond_dim": 128,
    "n_blocks": 12,
    "n_heads": 12,
    "dropout": 0.1,
    "use_normalized_embedding": True,
    "embedding_norm_method": "layernorm",
    "self_conditioning": True,
    "use_bias": True,
    "gumbel_loc": 4.723,
    "gumbel_scale": 0.852,
    "gumbel_cutoff": 1e-5,
    "gumbel_entropy": 7.02,
}


# ----------------------------------------------------------------------------------------------------------------------
# Measurement helpers (pure; tested in tests/test_side_by_side.py)
# ----------------------------------------------------------------------------------------------------------------------


def round_order(names: tuple[str, ...] | list[str], round_index: int) -> list[str]:
    """Round r runs the variants starting at r mod n, so that each variant holds each position equally often."""
    shift = round_index % len(names)
    return list(names[shift:]) + list(names[:shift])


def spread(values: list[float]) -> dict[str, float]:
    """min / median / max of a list of measurements."""
    return {"min": min(values), "median": statistics.median(values), "max": max(values)}


def paired_ratios(ours: list[float], theirs: list[float]) -> list[float]:
    """ours[r] / theirs[r] for every round r (paired: both ran in the same round, under the same load)."""
    if len(ours) != len(theirs):
        raise ValueError(f"unpaired measurements: {len(ours)} of ours, {len(theirs)} of theirs")
    return [a / b if b else float("nan") for a, b in zip(ours, theirs, strict=True)]


# ----------------------------------------------------------------------------------------------------------------------
# Machine and code description
# ----------------------------------------------------------------------------------------------------------------------


def cpu_description() -> dict:
    model, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "model name" and model in ("", platform.processor()):
                model = value.strip()
            if key.strip() in ("flags", "Features"):
                flags.update(value.split())
    except OSError:
        pass
    return {
        "cpu": model,
        "cpu_isa_flags": [f for f in ISA_FLAGS if f in flags],
        "cpu_cores_visible": os.cpu_count(),
        "cpu_affinity": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None,
    }


def machine_description(device: torch.device) -> dict:
    info = {
        "device_type": device.type,
        "torch": torch.__version__,
        "python": platform.python_version(),
        "torch_threads": torch.get_num_threads(),
        "machine": platform.machine(),
        **cpu_description(),
    }
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = torch.version.cuda
        info["gpu_memory_gib"] = round(torch.cuda.get_device_properties(device).total_memory / 2**30, 1)
    return info


def git_state(path: Path) -> dict:
    """Commit of a checkout, and whether its tracked files differ from it (the official code must be unpatched)."""

    def git(*args: str) -> str:
        out = subprocess.run(["git", "-C", str(path), *args], capture_output=True, text=True, timeout=30)
        return out.stdout.strip() if out.returncode == 0 else ""

    commit = git("rev-parse", "HEAD")
    if commit:
        return {
            "path": str(path),
            "commit": commit,
            "branch": git("rev-parse", "--abbrev-ref", "HEAD") or None,
            "tracked_files_modified": bool(git("status", "--porcelain", "--untracked-files=no")),
        }
    # A copy that travelled without its git folder (a device call): the commit stamped into it when it was packed,
    # and None where git cannot tell whether its files were changed.
    stamp = path / "COMMIT"
    return {
        "path": str(path),
        "commit": stamp.read_text().strip() if stamp.is_file() else None,
        "branch": None,
        "tracked_files_modified": None,
    }


# ----------------------------------------------------------------------------------------------------------------------
# Memory and time of one run
# ----------------------------------------------------------------------------------------------------------------------


def _status_kib(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"/proc/self/status has no {field}")


_LIBC = ctypes.CDLL(None) if sys.platform.startswith("linux") else None


class CpuPeak:
    """Peak RSS of a run above the RSS before it (Linux): VmHWM after resetting it to the current RSS."""

    unit = "peak RSS delta"

    def __enter__(self):
        gc.collect()
        if _LIBC is not None and hasattr(_LIBC, "malloc_trim"):
            _LIBC.malloc_trim(0)  # return freed heap pages, so a run cannot reuse what an earlier run left mapped
        Path("/proc/self/clear_refs").write_text("5")  # VmHWM := VmRSS
        self.before = _status_kib("VmRSS") * 1024
        return self

    def __exit__(self, *exc):
        self.bytes = _status_kib("VmHWM") * 1024 - self.before


class CudaPeak:
    """torch.cuda.max_memory_allocated during a run, above what was allocated before it."""

    unit = "max_memory_allocated delta"

    def __init__(self, device: torch.device):
        self.device = device

    def __enter__(self):
        gc.collect()
        torch.cuda.synchronize(self.device)
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(self.device)
        self.before = torch.cuda.memory_allocated(self.device)
        return self

    def __exit__(self, *exc):
        torch.cuda.synchronize(self.device)
        self.bytes = torch.cuda.max_memory_allocated(self.device) - self.before


def measure_run(
    run: Callable[[int], torch.Tensor], seed: int, device: torch.device
) -> tuple[float, float, int, torch.Tensor]:
    """
    (wall seconds, process CPU seconds, peak bytes, token ids) of one sampling run; GPU clocks are read after the
    queued kernels finish. CPU seconds count the work of all this process's threads, whatever else the machine runs.
    """
    peak = CudaPeak(device) if device.type == "cuda" else CpuPeak()
    with peak:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start, cpu_start = time.perf_counter(), time.process_time()
        ids = run(seed)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds, cpu_seconds = time.perf_counter() - start, time.process_time() - cpu_start
    return seconds, cpu_seconds, peak.bytes, ids.cpu()


# ----------------------------------------------------------------------------------------------------------------------
# The official code, from the user's checkouts
# ----------------------------------------------------------------------------------------------------------------------


def import_from(path: Path, label: str, marker: str):
    """Puts `path` first on sys.path, with a clear error where it is not the expected checkout."""
    if not (path / marker).is_file():
        sys.exit(f"{label}: {path} has no {marker}; pass the repository checkout (see --help).")
    sys.path.insert(0, str(path))


def official_elf_code(repo: Path):
    src = repo / "src" if (repo / "src").is_dir() else repo
    import_from(src, "--elf-repo", "utils/generation_utils.py")
    import modules.model as elf_model
    import utils.generation_utils as generation_utils
    import utils.sampling_utils as sampling_utils
    from configs.config import Config, SamplingConfig

    return elf_model, generation_utils, sampling_utils, Config, SamplingConfig


def official_langflow_code(repo: Path):
    import_from(repo, "--langflow-repo", "langflow/model.py")
    import langflow.model as langflow_model
    from langflow.config import LangFlowConfig

    return langflow_model, LangFlowConfig


def fill_zero_initialised(module: torch.nn.Module, seed: int) -> list[str]:
    """N(0, 0.02²) into the parameters the official init leaves at zero (else x̂ is constant); returns their names."""
    generator = torch.Generator().manual_seed(seed)
    filled = []
    with torch.no_grad():
        for name, parameter in module.named_parameters():
            if parameter.ndim >= 2 and not parameter.any():
                parameter.copy_(0.02 * torch.randn(parameter.shape, generator=generator))
                filled.append(name)
    return filled


# ----------------------------------------------------------------------------------------------------------------------
# Workloads
# ----------------------------------------------------------------------------------------------------------------------


class Tokenizer:
    """The members our pipelines use, for a vocabulary of `size` ids (pad 0 and eos 1, as T5; no text is decoded)."""

    def __init__(self, size: int, eos_token_id: int | None = 1, pad_token_id: int | None = 0):
        self.vocab_size, self.eos_token_id, self.pad_token_id = size, eos_token_id, pad_token_id

    def __len__(self) -> int:
        return self.vocab_size


def random_statistics(model, solver: str, nfe: int, seed: int = 0):
    """Random per-step calibration statistics on the model's real overlap basis; every step active."""
    from untied_sc.calibration import overlap_basis_from_model
    from untied_sc.schedulers.sampler_statistics import SamplerStatistics, StepStatistics, num_update_steps

    q, rho_sq = overlap_basis_from_model(model).storage_tensors()
    generator = torch.Generator().manual_seed(seed)
    k = num_update_steps(solver, nfe)
    step = StepStatistics(
        mean=0.01 * torch.randn(k, q.shape[0], generator=generator),
        rms=0.1 + torch.rand(k, generator=generator),
        cosine_distance=torch.rand(k, generator=generator),
    )
    return SamplerStatistics.build(model, solver, q, rho_sq, (0.8, 0.9), {nfe: step})


def build_pipelines(family: str, model, nfe: int, device: torch.device, autocast: str):
    """
    Our pipeline with the official scheduler and with the untied one (paper coefficients, random statistics). With
    `autocast="bf16"` on a GPU, `enable_autocast(torch.bfloat16)` autocasts the network's official regions; the
    schedulers (and LangFlow's softmax·E_norm) stay float32/float64, outside autocast.
    """
    from untied_sc import (
        ELFPipeline,
        ELFScheduler,
        LangFlowPipeline,
        LangFlowScheduler,
        UntiedSelfConditioningScheduler,
    )

    model = model.to(device)
    if family == "elf":
        official = ELFScheduler()
        tokenizer, pipeline_cls, coefficients = Tokenizer(model.config.vocab_size), ELFPipeline, "elf-b"
        extra = {"sc_cfg_scale": SC_CFG_SCALE}
    else:
        official = LangFlowScheduler()
        tokenizer = Tokenizer(model.config.vocab_size, eos_token_id=None, pad_token_id=None)
        pipeline_cls, coefficients, extra = LangFlowPipeline, "langflow-owt", {}
    stats = random_statistics(model, family, nfe).to(device)
    untied = UntiedSelfConditioningScheduler.from_config(official.config, coefficients=coefficients)
    pipes = {
        "ours_official": pipeline_cls(model, official, tokenizer, **extra),
        "ours_untied": pipeline_cls(model, untied, tokenizer, sampler_statistics=stats, **extra),
    }
    for pipe in pipes.values():
        pipe.set_progress_bar_config(disable=True)
        if device.type == "cuda" and autocast == "bf16":
            pipe.enable_autocast(torch.bfloat16)  # both share the network: the switch is on the transformer
    return pipes, untied.resolve_coefficients(nfe)


def elf_workload(args, device: torch.device, tmp: Path) -> dict:
    from untied_sc.models import load_official_elf

    elf_model, generation_utils, sampling_utils, Config, SamplingConfig = official_elf_code(args.elf_repo)
    torch.manual_seed(args.weight_seed)
    theirs = elf_model.ELF_B(
        text_encoder_dim=ELF_B["text_encoder_dim"],
        max_length=args.length,
        num_time_tokens=ELF_B["tokens"],
        num_self_cond_cfg_tokens=ELF_B["tokens"],
        num_model_mode_tokens=ELF_B["tokens"],
        vocab_size=ELF_B["vocab_size"],
        bottleneck_dim=ELF_B["bottleneck_dim"],
    )
    if args.elf_layers is not None:
        theirs.blocks = theirs.blocks[: args.elf_layers]
    filled = fill_zero_initialised(theirs, args.weight_seed + 1)
    theirs.eval()
    checkpoint = tmp / "checkpoint_0"  # the official PyTorch checkpoint layout, EMA weights as evaluation uses
    torch.save({"ema_params1": theirs.state_dict()}, checkpoint)
    ours = load_official_elf(checkpoint, max_length=args.length)
    checkpoint.unlink()
    theirs = theirs.to(device)
    pipes, coefficients = build_pipelines("elf", ours, args.nfe, device, args.autocast)

    config = Config()
    for key, value in {**ELF_RUN, "max_length": args.length, "use_bf16": args.autocast == "bf16"}.items():
        setattr(config, key, value)
    # the official SDE churn at this NFE is taken from our scheduler's default (2.0 at 8 NFE), so both run alike
    sde_gamma = pipes["ours_official"].scheduler.sde_gamma_for(args.nfe)
    sampling_config = SamplingConfig(
        sampling_method="sde",
        num_sampling_steps=[args.nfe],
        cfgs=[1],
        sde_gamma=sde_gamma,
        self_cond_cfg_scales=[SC_CFG_SCALE],
        time_schedule="logit_normal",
    )
    param_dtype = next(theirs.parameters()).dtype

    @torch.no_grad()
    def run_theirs(seed: int, batch: int) -> torch.Tensor:
        generator = torch.Generator(device="cpu").manual_seed(seed)  # as eval.py: a CPU generator and the global RNG
        torch.manual_seed(seed)
        t_steps = sampling_utils.get_sampling_steps(
            n_steps=args.nfe,
            time_schedule="logit_normal",
            P_mean=config.denoiser_p_mean,
            P_std=config.denoiser_p_std,
            device=device,
            dtype=param_dtype,
        )
        shape = (batch, config.max_length, ELF_B["text_encoder_dim"])
        if device.type == "cuda":  # test_generation_uncond's two branches
            z = torch.randn(shape, dtype=param_dtype, device=device) * config.denoiser_noise_scale
        else:
            z = (torch.randn(shape, generator=generator, dtype=param_dtype) * config.denoiser_noise_scale).to(device)
        latent = generation_utils._generate_samples_single_batch(
            model=theirs,
            generator=generator,
            z=z,
            t_steps=t_steps,
            cond_seq=None,
            cond_seq_mask=None,
            config=config,
            sampling_config=sampling_config,
            cfg_scale=1,
            self_cond_cfg_scale=SC_CFG_SCALE,
        )
        ids = generation_utils._dlm_decode_batch(
            z=latent, model=theirs, t_final_val=t_steps[-1].item(), config=config, self_cond_cfg_scale=SC_CFG_SCALE
        )
        return generation_utils.mask_after_eos(ids, eos_token_id=1, pad_token_id=0)

    return {
        "family": "elf",
        "name": "ELF-B" if args.elf_layers is None else f"ELF-B, {args.elf_layers} of 12 layers",
        "theirs": run_theirs,
        "pipes": pipes,
        "parameters_millions": round(sum(p.numel() for p in ours.parameters()) / 1e6, 1),
        "shape": {"length": args.length, "latent_dim": ELF_B["text_encoder_dim"], "vocab": ELF_B["vocab_size"]},
        "official_entry_points": "utils.sampling_utils.get_sampling_steps, utils.generation_utils."
        "{_generate_samples_single_batch, _dlm_decode_batch, mask_after_eos}",
        "sampler": {"method": "sde", "sde_gamma": sde_gamma, "sc_cfg_scale": SC_CFG_SCALE},
        "untied_coefficients": coefficients,
        "zero_init_filled": filled,
        "pipeline_kwargs": {"sc_cfg_scale": SC_CFG_SCALE},
    }


def langflow_workload(args, device: torch.device, tmp: Path) -> dict:
    from safetensors.torch import save_file

    from untied_sc.models import load_official_langflow

    langflow_model, LangFlowConfig = official_langflow_code(args.langflow_repo)
    kwargs = {**LANGFLOW_OWT, "model_length": args.length}
    if args.langflow_layers is not None:
        kwargs["n_blocks"] = args.langflow_layers
    torch.manual_seed(args.weight_seed)
    theirs = langflow_model.LangFlow(LangFlowConfig(**kwargs))
    filled = fill_zero_initialised(theirs, args.weight_seed + 1)
    theirs.eval()
    folder = tmp / "langflow"  # the official folder layout: config.json + model.safetensors
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(kwargs))
    save_file({k: v.contiguous() for k, v in theirs.state_dict().items()}, str(folder / "model.safetensors"))
    ours = load_official_langflow(folder)
    theirs = theirs.to(device)
    pipes, coefficients = build_pipelines("langflow", ours, args.nfe, device, args.autocast)

    def run_theirs(seed: int, batch: int) -> torch.Tensor:
        torch.manual_seed(seed)  # as gen_ppl.py
        return theirs.generate_samples(num_samples=batch, seq_length=args.length, num_steps=args.nfe, device=device)

    return {
        "family": "langflow",
        "name": "LangFlow OWT"
        if args.langflow_layers is None
        else f"LangFlow OWT, {args.langflow_layers} of 12 blocks",
        "theirs": run_theirs,
        "pipes": pipes,
        "parameters_millions": round(sum(p.numel() for p in ours.parameters()) / 1e6, 1),
        "shape": {"length": args.length, "hidden_size": kwargs["hidden_size"], "vocab": kwargs["vocab_size"]},
        "official_entry_points": "langflow.model.LangFlow.generate_samples",
        "sampler": {"method": "DDIM (Euler-EDM in log-SNR)", "proposal": "Gumbel, from the weights"},
        "untied_coefficients": coefficients,
        "zero_init_filled": filled,
        "pipeline_kwargs": {},
    }


def variant_runs(w: dict, batch: int, args, device: torch.device) -> dict[str, Callable[[int], torch.Tensor]]:
    def ours(pipe):
        def run(seed: int) -> torch.Tensor:
            generator = torch.Generator(args.generator_device).manual_seed(seed)
            kwargs = w["pipeline_kwargs"]
            out = pipe(
                batch_size=batch, num_inference_steps=args.nfe, generator=generator, output_type="seq", **kwargs
            )
            return out.sequences

        return run

    return {
        "theirs": lambda seed: w["theirs"](seed, batch),
        "ours_official": ours(w["pipes"]["ours_official"]),
        "ours_untied": ours(w["pipes"]["ours_untied"]),
    }


def measure(w: dict, batch: int, args, device: torch.device) -> dict:
    runs = variant_runs(w, batch, args, device)
    warmup = {
        name: [measure_run(run, SEED + 1000 + i, device)[0] for i in range(args.warmup)] for name, run in runs.items()
    }
    seconds = {name: [] for name in VARIANTS}
    cpu_seconds = {name: [] for name in VARIANTS}
    peak = {name: [] for name in VARIANTS}
    tokens = {name: [] for name in VARIANTS}
    orders = []
    for r in range(args.repeats):
        order = round_order(VARIANTS, r)
        orders.append(order)
        for name in order:
            s, cpu, b, ids = measure_run(runs[name], SEED + r, device)
            seconds[name].append(s)
            cpu_seconds[name].append(cpu)
            peak[name].append(b)
            tokens[name].append(ids)
            print(
                f"  {w['name']} batch {batch} round {r} {name}: {s:.2f} s (CPU {cpu:.2f} s), peak +{b / 2**20:.0f} MiB",
                flush=True,
            )
    throughput = {name: [batch / s for s in seconds[name]] for name in VARIANTS}
    per_cpu_second = {name: [batch / s for s in cpu_seconds[name]] for name in VARIANTS}
    result = {
        "model": w["name"],
        "family": w["family"],
        "batch_size": batch,
        "nfe": args.nfe,
        "parameters_millions": w["parameters_millions"],
        "shape": w["shape"],
        "round_orders": orders,
        "warmup_seconds": warmup,
        "seconds": seconds,
        "process_cpu_seconds": cpu_seconds,
        "load_average_end": os.getloadavg(),
        "samples_per_second": {name: spread(v) for name, v in throughput.items()},
        "peak_bytes": peak,
        "token_agreement_ours_official_vs_theirs": sum(
            float((a == b).float().mean()) for a, b in zip(tokens["ours_official"], tokens["theirs"], strict=True)
        )
        / args.repeats,
        "ratios": {},
    }
    for name in ("ours_official", "ours_untied"):
        result["ratios"][name] = {
            "throughput": spread(paired_ratios(throughput[name], throughput["theirs"])),
            "samples_per_cpu_second": spread(paired_ratios(per_cpu_second[name], per_cpu_second["theirs"])),
            "peak_memory": spread(paired_ratios(peak[name], peak["theirs"])),
        }
    r = result["ratios"]
    result["targets"] = {
        "ours_official_throughput_ge_1.00": r["ours_official"]["throughput"]["median"] >= 1.00,
        "ours_official_peak_memory_le_1.00": r["ours_official"]["peak_memory"]["median"] <= 1.00,
        "ours_untied_throughput_ge_0.99": r["ours_untied"]["throughput"]["median"] >= 0.99,
        "ours_official_samples_per_cpu_second_ge_1.00": r["ours_official"]["samples_per_cpu_second"]["median"] >= 1.00,
        "ours_untied_samples_per_cpu_second_ge_0.99": r["ours_untied"]["samples_per_cpu_second"]["median"] >= 0.99,
    }
    return result


# ----------------------------------------------------------------------------------------------------------------------
# Report
# ----------------------------------------------------------------------------------------------------------------------


def _ratio(s: dict) -> str:
    return f"{s['median']:.3f} ({s['min']:.3f}–{s['max']:.3f})"


def _patch_state(official: dict) -> str:
    """What the report can say of the official checkouts' files: unpatched, modified, or not known (no git)."""
    modified = {official[name]["tracked_files_modified"] for name in ("elf", "langflow")}
    if modified == {False}:
        return "unpatched"
    if True in modified:
        return "WITH MODIFIED TRACKED FILES (the official code must be unpatched)"
    return "copies carried without git: commits from the stamp written when they were packed"


def markdown(report: dict) -> str:
    m = report["machine"]
    cpu = f"{m['cpu']} ({m['torch_threads']} torch thread(s); ISA flags: {', '.join(m['cpu_isa_flags'])})"
    lines = [
        "# Side by side: our pipelines vs the official ELF and LangFlow code",
        "",
        f"- Date: {report['date']}; our commit: {report['git_commit']}",
        f"- Hardware: GPU: {m['gpu'] if 'gpu' in m else 'none'}; CPU: {cpu}",
        f"- torch {m['torch']}, Python {m['python']}; dtype: {report['dtype']}",
        f"- Official code: ELF `{report['official']['elf']['commit']}` ({report['official']['elf']['branch']}), "
        f"LangFlow `{report['official']['langflow']['commit']}` ({report['official']['langflow']['branch']}); "
        f"imported from the checkouts at run time, {_patch_state(report['official'])}",
        f"- Command: `{report['command']}`",
        f"- Memory: {report['memory_measure']}",
        "",
        "Ratios are ours / theirs, paired per round: median (min–max) over the rounds. Throughput (samples per "
        "wall-clock second) and samples per process CPU second > 1, and memory < 1, favour ours. On a shared machine "
        "the CPU-second ratio is the steadier one: it counts this process's work, not the time other jobs took.",
        "",
        "| model | batch | NFE | rounds | theirs samples/s | ours official: throughput | per CPU s | peak memory "
        "| ours untied: throughput | per CPU s | peak memory | tokens equal (official) |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for r in report["results"]:
        ro, ru = r["ratios"]["ours_official"], r["ratios"]["ours_untied"]
        theirs_mib = statistics.median(r["peak_bytes"]["theirs"]) / 2**20
        lines.append(
            f"| {r['model']} | {r['batch_size']} | {r['nfe']} | {len(r['round_orders'])} | "
            f"{r['samples_per_second']['theirs']['median']:.4g} | {_ratio(ro['throughput'])} | "
            f"{_ratio(ro['samples_per_cpu_second'])} | {_ratio(ro['peak_memory'])} (theirs {theirs_mib:.0f} MiB) | "
            f"{_ratio(ru['throughput'])} | {_ratio(ru['samples_per_cpu_second'])} | {_ratio(ru['peak_memory'])} | "
            f"{100 * r['token_agreement_ours_official_vs_theirs']:.2f} % |"
        )
    lines += ["", "Targets (medians):", ""]
    for r in report["results"]:
        met = ", ".join(f"{k}: {'met' if v else 'NOT met'}" for k, v in r["targets"].items())
        lines.append(f"- {r['model']}, batch {r['batch_size']}: {met}")
    if report.get("notes"):
        lines += ["", f"Notes: {report['notes']}"]
    if report["device"] == "cpu":
        lines += ["", "GPU: not measured (no GPU in this run; see docs/usage.md for the command)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--elf-repo", type=Path, required=True, help="checkout of the ELF repo, pytorch_elf branch")
    parser.add_argument("--langflow-repo", type=Path, required=True, help="checkout of the LangFlow repo")
    parser.add_argument("--families", nargs="+", default=["elf", "langflow"], choices=["elf", "langflow"])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1])
    parser.add_argument("--nfe", type=int, default=8)
    parser.add_argument("--length", type=int, default=1024, help="sequence length (1024: both OWT models)")
    parser.add_argument("--elf-layers", type=int, default=None, help="fewer ELF-B blocks (a smaller shape)")
    parser.add_argument("--langflow-layers", type=int, default=None, help="fewer LangFlow blocks (a smaller shape)")
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds")
    parser.add_argument("--warmup", type=int, default=1, help="untimed runs of every variant first")
    parser.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--autocast",
        choices=["bf16", "none"],
        default=None,
        help="cuda: bf16 (default; what the official code does) or none (float32); the CPU always runs float32",
    )
    parser.add_argument(
        "--generator-device",
        choices=["cpu", "cuda"],
        default="cpu",
        help="our pipelines' generator (cuda: every draw on the GPU, as the official code draws there)",
    )
    parser.add_argument("--weight-seed", type=int, default=0)
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/side-by-side-cpu.json"))
    parser.add_argument("--notes", default="", help="a line for the report (e.g. why a smaller shape)")
    parser.add_argument("--overwrite", action="store_true")
    args = parser.parse_args()

    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        sys.exit("--device cuda, but torch sees no GPU.")
    if args.generator_device == "cuda" and device.type != "cuda":
        sys.exit("--generator-device cuda needs --device cuda.")
    if args.autocast is None:
        args.autocast = "bf16" if device.type == "cuda" else "none"
    if device.type == "cpu" and args.autocast != "none":
        sys.exit("--autocast bf16 is for cuda: the official code autocasts on CUDA only (the CPU runs float32).")
    if device.type == "cpu" and not Path("/proc/self/clear_refs").exists():
        sys.exit("CPU peak memory is read from /proc/self/clear_refs and VmHWM: Linux only.")
    markdown_path = args.output.with_suffix(".md")
    for path in (args.output, markdown_path):
        if path.exists() and not args.overwrite:
            sys.exit(f"{path} exists; pass --overwrite to replace it, or another --output.")
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    args.elf_repo, args.langflow_repo = args.elf_repo.resolve(), args.langflow_repo.resolve()

    started = time.perf_counter()
    report = {
        "benchmark": "our pipelines (official and untied schedulers) vs the official ELF / LangFlow code",
        "command": "python " + " ".join(shlex.quote(a) for a in sys.argv),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_state(REPO)["commit"],
        "device": device.type,
        "machine": machine_description(device),
        "dtype": "bfloat16 autocast (official: its own; ours: pipe.enable_autocast)"
        if args.autocast == "bf16"
        else "float32",
        "generator_device": args.generator_device,
        "memory_measure": (CudaPeak.unit if device.type == "cuda" else CpuPeak.unit)
        + " of each run above the memory in use before it",
        "official": {"elf": git_state(args.elf_repo), "langflow": git_state(args.langflow_repo)},
        "load_average_start": os.getloadavg(),
        "notes": args.notes,
        "results": [],
    }
    for name in ("elf", "langflow"):
        if report["official"][name]["tracked_files_modified"]:
            print(f"warning: the {name} checkout has modified tracked files; the official code must be unpatched")

    def write() -> None:
        report["total_seconds"] = time.perf_counter() - started
        report["load_average_end"] = os.getloadavg()
        args.output.parent.mkdir(parents=True, exist_ok=True)
        args.output.write_text(json.dumps(report, indent=2) + "\n")
        markdown_path.write_text(markdown(report))

    builders = {"elf": elf_workload, "langflow": langflow_workload}
    for family in args.families:
        with tempfile.TemporaryDirectory() as tmp:
            build_start = time.perf_counter()
            w = builders[family](args, device, Path(tmp))
        print(
            f"[{time.perf_counter() - started:.0f} s] built {w['name']} in {time.perf_counter() - build_start:.0f} s"
        )
        for batch in args.batch_sizes:
            result = measure(w, batch, args, device)
            for key in ("official_entry_points", "sampler", "untied_coefficients", "zero_init_filled"):
                result[key] = w[key]
            report["results"].append(result)
            write()
        del w
        gc.collect()
    write()
    print(markdown(report))
    print(f"Wrote {args.output} and {markdown_path} in {time.perf_counter() - started:.0f} s.")


if __name__ == "__main__":
    main()
