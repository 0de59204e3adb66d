"""The CPU's native bfloat16, read from /proc/cpuinfo, and the warnings where bf16 would be emulated."""

import warnings

import pytest

from untied_sc import hardware
from untied_sc_lab.training.trainer import training_device


INTEL = "processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512_bf16 amx_tile amx_bf16\n"
AMD_AVX2 = "processor\t: 0\nvendor_id\t: AuthenticAMD\nflags\t\t: fpu sse2 avx2 fma\n"
ARM = "processor\t: 0\nFeatures\t: fp asimd sve bf16 i8mm\n"


def test_native_bfloat16_is_read_from_the_cpu_flags():
    assert hardware.native_cpu_bfloat16(INTEL) is True
    assert hardware.native_cpu_bfloat16(AMD_AVX2) is False
    assert hardware.native_cpu_bfloat16(ARM) is True
    assert hardware.native_cpu_bfloat16("processor\t: 0\n") is None  # no flags line: unknown, so no warning


@pytest.mark.parametrize("native, warned", [(False, True), (True, False), (None, False)])
def test_bf16_training_on_a_cpu_warns_only_where_it_is_emulated(monkeypatch, native, warned):
    monkeypatch.setattr(hardware, "native_cpu_bfloat16", lambda cpuinfo=None: native)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert training_device("cpu", "bf16").type == "cpu"
        training_device("cpu", "none")  # float32 never warns
    messages = [str(w.message) for w in caught]
    assert bool(messages) == warned
    if warned:
        assert len(messages) == 1 and "--autocast none" in messages[0] and "emulates" in messages[0]


def test_the_evaluator_in_bf16_on_an_emulating_cpu_warns(monkeypatch):
    import torch

    from untied_sc_lab.evaluation import evaluator

    monkeypatch.setattr(hardware, "native_cpu_bfloat16", lambda cpuinfo=None: False)
    monkeypatch.setattr(evaluator, "_is_complete_cache", lambda folder: False)

    def stop(folder):  # the warning comes before any loading; stop there
        raise RuntimeError("stopped before loading")

    monkeypatch.setattr(evaluator, "cache_smollm2", stop)
    with pytest.warns(UserWarning, match="--dtype float32"), pytest.raises(RuntimeError, match="stopped"):
        evaluator.load_evaluator(dtype=torch.bfloat16)
