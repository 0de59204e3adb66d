"""What the CPU does natively, where it changes what a command should be run with.

bfloat16 matrix products are fast only on CPUs that multiply bfloat16 natively (AVX512-BF16 or AMX on x86, BF16 on
Arm). Elsewhere PyTorch emulates them: measured on a 2-core AMD EPYC with AVX2 only (2026-11-27), a 4096×256×1024
product ran at 1.1 GFLOP/s in bfloat16 against 55 in float32, and an ELF training step took 72 s instead of 3.3 s.
The bundled recipes chose bf16 on a CPU with AVX512-BF16, where it was 1.7× faster; on other CPUs they warn.
The evaluator's dtype `"auto"` ([`auto_dtype_name`]) is bfloat16 where it is native and float32 elsewhere.
"""

import warnings
from pathlib import Path


NATIVE_BF16_FLAGS = {"avx512_bf16", "amx_bf16", "bf16"}  # x86 AVX512-BF16 / AMX-BF16, Arm BF16


def native_cpu_bfloat16(cpuinfo: str | None = None) -> bool | None:
    """
    Whether this CPU multiplies bfloat16 natively, read from the `flags` (x86) or `Features` (Arm) lines of
    `/proc/cpuinfo` (or of `cpuinfo`, for tests); `None` where that cannot be told (no such file or lines).
    """
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return None
    flags = set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() in ("flags", "Features"):
            flags.update(value.split())
    return bool(flags & NATIVE_BF16_FLAGS) if flags else None


def warn_if_emulated_bfloat16(what: str, instead: str) -> bool:
    """Warns (and returns True) when `what` is about to run in bfloat16 on a CPU that emulates it."""
    if native_cpu_bfloat16() is not False:
        return False
    warnings.warn(
        f"{what} runs in bfloat16 on a CPU without native bfloat16 (no AVX512-BF16, AMX or Arm BF16), where PyTorch "
        f"emulates it: about 50x slower than float32 (measured on an AVX2 AMD EPYC). {instead}",
        stacklevel=3,
    )
    return True


def auto_dtype_name(device: str = "cpu", cpuinfo: str | None = None) -> str:
    """
    The dtype `"auto"` stands for on `device`: `"bfloat16"` where bfloat16 is native there (a CPU with AVX512-BF16,
    AMX or Arm BF16; a CUDA GPU that supports it), else `"float32"`, also where that cannot be told (no
    /proc/cpuinfo): an emulated bfloat16 costs ~50x, a float32 on a native CPU ~1.7x. `cpuinfo` is for tests.
    """
    kind = str(device).split(":")[0]
    if kind == "cpu":
        return "bfloat16" if native_cpu_bfloat16(cpuinfo) else "float32"
    if kind == "cuda":
        import torch  # keeps the CPU checks torch-free: the command line's refusals use them before torch loads

        return "bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "float32"
    return "float32"


def device_problem(device) -> str | None:
    """
    Why `device` (a name such as `"cuda:1"` or a `torch.device`) cannot be used on this machine, or `None` when it
    can (or is not a CUDA device: other kinds are left to torch). Checked before any work, so that a missing GPU is
    one clear sentence instead of torch's "Torch not compiled with CUDA enabled" assertion deep in a load.
    """
    import torch

    try:
        device = torch.device(device)
    except (RuntimeError, TypeError) as error:
        return f"{device!r} is not a device name ({error}); use cpu, cuda or cuda:N"
    if device.type != "cuda":
        return None
    if not torch.backends.cuda.is_built():
        return (
            f"{device} was asked for, but this torch ({torch.__version__}) is built without CUDA. Use the CPU "
            "(--device cpu, or leave the device out), or install a CUDA build of torch "
            '(make test TORCH_SPEC="torch==2.13.0 --index-url <CUDA wheel index>")'
        )
    count = torch.cuda.device_count()
    if count == 0:
        return (
            f"{device} was asked for, but no CUDA GPU is visible (CUDA_VISIBLE_DEVICES, the driver); use --device cpu"
        )
    if device.index is not None and device.index >= count:
        return f"{device} was asked for, but this machine has {count} CUDA GPU(s): cuda:0 to cuda:{count - 1}"
    return None


def check_device(device, what: str = "device") -> None:
    """Raises `ValueError` with [`device_problem`]'s sentence, naming `what` asked for it."""
    problem = device_problem(device)
    if problem is not None:
        raise ValueError(f"{what}: {problem}.")


def torch_dtype(name: str):
    """The torch dtype of a `--dtype` name (one of `untied_sc.defaults.DTYPE_NAMES`)."""
    import torch

    return getattr(torch, name)
