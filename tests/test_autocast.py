"""The networks' autocast switch (`enable_autocast`): off, the float32 forward bit for bit; on, the official regions.

The models are the golden fixtures' (official weights, every parameter random), so no zero-initialised head hides a
region. bfloat16 is emulated on most CPUs: these models are tiny.
"""

import json
import warnings

import pytest
import torch

from untied_sc import ELFPipeline, ELFScheduler, LangFlowPipeline, LangFlowScheduler, hardware

from .conftest import elf_from_golden, langflow_from_golden
from .tiny import tiny_tokenizer


# Measured on this project's CPU (emulated bf16): |bf16 − float32| reached 0.27–0.51 % of each output's largest
# magnitude (ELF prediction 0.0134 of 3.18, logits 0.0189 of 7.09; LangFlow logits 0.0133 of 4.33, clean prediction
# 0.0059 of 1.17). The bound leaves room for other CPUs' bf16 kernels. It cannot tell the regions apart (autocasting
# the whole forward moves these outputs by < 1 % too): the dtype tests check the regions.
RELATIVE_TOLERANCE = 0.02

ELF_FLOAT32 = ("self_cond_proj", "text_proj", "t_embedder", "self_cond_cfg_embedder", "final_layer")
ELF_BF16 = ("attn.qkv", "attn.proj", "mlp.w12", "mlp.w3", "attn.q_norm", "attn.k_norm")
LANGFLOW_FLOAT32 = ("self_cond_proj", "sigma_map", "norm1", "norm2", "norm_final")
LANGFLOW_BF16 = ("attn_qkv", "attn_out", "mlp.0", "mlp.2", "adaLN_modulation", "output_layer.linear")
LANGFLOW_BLOCKS = ("backbone.blocks.", "backbone.output_layer.")  # not the time embedding's own `mlp.0`


@pytest.fixture
def elf(elf_golden):
    return elf_from_golden(elf_golden)


@pytest.fixture
def langflow(langflow_golden):
    return langflow_from_golden(langflow_golden)


def _elf_outputs(model, golden, **kwargs) -> dict[str, torch.Tensor]:
    inputs = golden.inputs
    with torch.no_grad():
        out = model(inputs["latent"], inputs["t"], inputs["self_cond"], inputs["sc_cfg_scale"], **kwargs)
    return {"sample": out.sample, "logits": out.logits}


def _langflow_outputs(model, golden) -> dict[str, torch.Tensor]:
    inputs = golden.inputs
    with torch.no_grad():
        logits = model(inputs["latent"], inputs["gamma"], inputs["self_cond"]).logits
        return {"logits": logits, "prediction": model.clean_prediction(logits)}


def _outputs(family, model, golden):
    if family == "elf":
        return _elf_outputs(model, golden, decoder_step_active=True)
    return _langflow_outputs(model, golden)


def _output_dtypes(model, run) -> dict[str, torch.dtype]:
    """The output dtype of every named submodule during `run()` (a module called several times: its last call)."""
    dtypes, handles = {}, []

    def record(name):
        def hook(module, args, out):
            dtypes[name] = (out[0] if isinstance(out, tuple) else out).dtype  # tuple: LangFlow's rotary (cos, sin)

        return hook

    for name, module in model.named_modules():
        if name:
            handles.append(module.register_forward_hook(record(name)))
    try:
        run()
    finally:
        for handle in handles:
            handle.remove()
    return dtypes


def _matching(
    dtypes: dict[str, torch.dtype], suffixes: tuple[str, ...], under: str | tuple[str, ...] = ""
) -> dict[str, torch.dtype]:
    """The recorded dtypes of the modules named `...suffix` (inside `under`), each suffix found at least once."""
    found = {name: dtype for name, dtype in dtypes.items() if name.endswith(suffixes) and name.startswith(under)}
    assert {suffix for suffix in suffixes if any(name.endswith(suffix) for name in found)} == set(suffixes)
    return found


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_switched_off_is_bit_for_bit_the_never_switched_network(request, family):
    golden = request.getfixturevalue(f"{family}_golden")
    build = elf_from_golden if family == "elf" else langflow_from_golden
    never, model = build(golden), build(golden)
    assert model.autocast_dtype is None
    model.enable_autocast(torch.bfloat16)
    switched_on = _outputs(family, model, golden)
    model.disable_autocast()
    assert model.autocast_dtype is None
    reference, off = _outputs(family, never, golden), _outputs(family, model, golden)
    for key, value in reference.items():
        assert torch.equal(off[key], value), key
        assert not torch.equal(switched_on[key], value), f"{key}: enable_autocast changed nothing"


@pytest.mark.parametrize("caller_autocast", [False, True])
def test_elf_autocasts_only_its_blocks(elf, elf_golden, caller_autocast):
    elf.enable_autocast(torch.bfloat16)
    outputs = {}

    def run():
        # a caller's own autocast (e.g. around the whole forward) must not widen the regions
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=caller_autocast):
            outputs.update(_elf_outputs(elf, elf_golden, decoder_step_active=True))

    dtypes = _output_dtypes(elf, run)
    assert set(_matching(dtypes, ELF_FLOAT32).values()) == {torch.float32}  # input side, flow head
    assert set(_matching(dtypes, ELF_BF16).values()) == {torch.bfloat16}  # the blocks' linears and QK norms
    assert {dtypes[f"blocks.{i}"] for i in range(len(elf.blocks))} == {torch.float32}  # the residual stream
    assert outputs["sample"].dtype == outputs["logits"].dtype == torch.float32  # the decoder head runs in float32
    assert torch.equal(outputs["sample"], _elf_outputs(elf, elf_golden, decoder_step_active=True)["sample"])


@pytest.mark.parametrize("caller_autocast", [False, True])
def test_langflow_autocasts_its_blocks_and_output_layer_but_not_its_norms(langflow, langflow_golden, caller_autocast):
    langflow.enable_autocast(torch.bfloat16)
    outputs = {}

    def run():
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=caller_autocast):
            outputs.update(_langflow_outputs(langflow, langflow_golden))

    dtypes = _output_dtypes(langflow, run)
    # SC projection and time embedding outside autocast; the layer norms normalise in float32 (as the official)
    assert set(_matching(dtypes, LANGFLOW_FLOAT32).values()) == {torch.float32}
    assert set(_matching(dtypes, LANGFLOW_BF16, under=LANGFLOW_BLOCKS).values()) == {torch.bfloat16}
    assert dtypes["backbone.output_layer"] == torch.bfloat16  # the official backbone returns bf16 logits
    # ... to which the float32 skip term is added: float32 logits and clean prediction
    assert outputs["logits"].dtype == outputs["prediction"].dtype == torch.float32
    assert torch.equal(outputs["logits"], _langflow_outputs(langflow, langflow_golden)["logits"])


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_bf16_outputs_are_close_to_float32(request, family):
    golden, model = request.getfixturevalue(f"{family}_golden"), request.getfixturevalue(family)
    reference = _outputs(family, model, golden)
    model.enable_autocast(torch.bfloat16)
    for key, value in _outputs(family, model, golden).items():
        scale = reference[key].abs().max()
        assert (value - reference[key]).abs().max() <= RELATIVE_TOLERANCE * scale, key


def _pipe(family, request):
    golden = request.getfixturevalue(f"{family}_golden")
    if family == "elf":
        pipe = ELFPipeline(elf_from_golden(golden), ELFScheduler(), tiny_tokenizer())
    else:
        pipe = LangFlowPipeline(langflow_from_golden(golden), LangFlowScheduler(), tiny_tokenizer())
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_pipeline_with_autocast_is_reproducible_and_keeps_the_scheduler_outside(request, monkeypatch, family):
    pipe = _pipe(family, request)
    monkeypatch.setattr(hardware, "native_cpu_bfloat16", lambda cpuinfo=None: True)  # no emulation warning here
    pipe.enable_autocast(torch.bfloat16)
    assert pipe.transformer.autocast_dtype == torch.bfloat16
    scheduler_autocast, block_dtypes = [], []
    step = pipe.scheduler.step

    def spy_step(*args, **kwargs):
        scheduler_autocast.append(torch.is_autocast_enabled("cpu"))
        return step(*args, **kwargs)

    monkeypatch.setattr(pipe.scheduler, "step", spy_step)
    block = (pipe.transformer.blocks if family == "elf" else pipe.transformer.backbone.blocks)[0]
    block_linear = next(m for m in block.modules() if isinstance(m, torch.nn.Linear))
    block_linear.register_forward_hook(lambda module, args, out: block_dtypes.append(out.dtype))
    first, second = (
        pipe(batch_size=2, num_inference_steps=4, generator=torch.Generator().manual_seed(7)) for _ in "ab"
    )
    assert torch.equal(first.sequences, second.sequences) and torch.equal(first.latents, second.latents)
    assert scheduler_autocast and not any(scheduler_autocast)  # the scheduler's math never runs under autocast
    assert block_dtypes and set(block_dtypes) == {torch.bfloat16}
    pipe.disable_autocast()
    assert pipe.transformer.autocast_dtype is None


def test_pipeline_warns_where_the_cpu_emulates_bfloat16(request, monkeypatch):
    pipe = _pipe("langflow", request)
    monkeypatch.setattr(hardware, "native_cpu_bfloat16", lambda cpuinfo=None: False)
    with pytest.warns(UserWarning, match="emulates it"):
        pipe.enable_autocast(torch.bfloat16)
    monkeypatch.setattr(hardware, "native_cpu_bfloat16", lambda cpuinfo=None: True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        pipe.enable_autocast(torch.bfloat16)


@pytest.mark.parametrize("family", ["elf", "langflow"])
def test_save_pretrained_after_enable_autocast_writes_the_same_files(tmp_path, request, monkeypatch, family):
    pipe = _pipe(family, request)
    pipe.save_pretrained(tmp_path / "before")
    monkeypatch.setattr(hardware, "native_cpu_bfloat16", lambda cpuinfo=None: True)
    pipe.enable_autocast(torch.bfloat16)
    pipe.save_pretrained(tmp_path / "after")
    before = {p.relative_to(tmp_path / "before"): p.read_bytes() for p in (tmp_path / "before").rglob("*.json")}
    after = {p.relative_to(tmp_path / "after"): p.read_bytes() for p in (tmp_path / "after").rglob("*.json")}
    assert before == after and any(path.parts[0] == "transformer" for path in after)
    config = json.loads((tmp_path / "after" / "transformer" / "config.json").read_text())
    assert not any("autocast" in key for key in config)
    assert type(pipe).from_pretrained(tmp_path / "after").transformer.autocast_dtype is None


@pytest.mark.parametrize("family", ["elf", "langflow"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, "bfloat16", None])
def test_other_dtypes_are_refused_with_the_fix(request, family, dtype):
    pipe = _pipe(family, request)
    with pytest.raises(ValueError, match=r"torch\.bfloat16 .*or torch\.float16.*disable_autocast"):
        pipe.enable_autocast(dtype)
    with pytest.raises(ValueError, match=r"torch\.bfloat16"):
        pipe.transformer.enable_autocast(dtype)
    assert pipe.transformer.autocast_dtype is None  # a refusal leaves the network as it was


def test_float16_is_accepted(langflow, langflow_golden):
    langflow.enable_autocast(torch.float16)
    dtypes = _output_dtypes(langflow, lambda: _langflow_outputs(langflow, langflow_golden))
    assert set(_matching(dtypes, LANGFLOW_BF16, under=LANGFLOW_BLOCKS).values()) == {torch.float16}


def test_calibration_runs_a_given_dtype_without_autocast(request, monkeypatch):
    """Calibration's float32 runs (ELF's finite-difference base scales) stay float32 on a pipeline switched to bf16."""
    from untied_sc.calibration.calibrate import pipeline_on

    pipe = _pipe("elf", request)
    monkeypatch.setattr(hardware, "native_cpu_bfloat16", lambda cpuinfo=None: True)
    pipe.enable_autocast(torch.bfloat16)
    float32 = pipeline_on(pipe, "cpu", torch.float32)
    assert float32 is not pipe and float32.transformer.autocast_dtype is None
    assert pipe.transformer.autocast_dtype == torch.bfloat16  # the caller's pipeline keeps its switch
    assert pipeline_on(pipe) is pipe  # no dtype given: the pipeline as it runs
