"""Shared helpers: golden fixtures of the official code, and tiny models."""

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from untied_sc.models.convert import elf_config_from_state_dict, langflow_config_from_official


FIXTURES = Path(__file__).parent / "fixtures"


class Golden:
    """A fixture file written by `tests/fixtures/make_*_fixtures.py`: official weights, inputs and outputs."""

    def __init__(self, name: str):
        with safe_open(FIXTURES / name, "pt") as handle:
            self.metadata = handle.metadata()
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        self.config = json.loads(self.metadata["config"])
        self.weights = {k.removeprefix("weight."): v for k, v in tensors.items() if k.startswith("weight.")}
        self.inputs = {k.removeprefix("input."): v for k, v in tensors.items() if k.startswith("input.")}
        self.outputs = {k.removeprefix("output."): v for k, v in tensors.items() if k.startswith("output.")}


def elf_from_golden(golden: Golden):
    from untied_sc import ELFTransformerModel

    config = elf_config_from_state_dict(golden.weights, max_length=golden.config["max_length"])
    model = ELFTransformerModel(**config).eval()
    model.load_state_dict(golden.weights)
    return model


def langflow_from_golden(golden: Golden):
    from untied_sc import LangFlowTransformerModel

    model = LangFlowTransformerModel(**langflow_config_from_official(golden.config)).eval()
    model.load_state_dict(golden.weights)
    return model


def golden_call(golden: Golden) -> dict:
    """
    The pipeline call of a sampler fixture: its batch, steps and seed. A fixture that recorded only some rows of its
    batch (`trajectory_rows`, to stay small) is replayed on those rows alone, from their recorded z_0: rows are
    independent in both samplers.
    """
    sampler, outputs = json.loads(golden.metadata["sampler"]), golden.outputs
    call = {
        "batch_size": sampler["batch_size"],
        "num_inference_steps": sampler["num_steps"],
        "generator": torch.Generator().manual_seed(sampler["seed"]),
    }
    rows = outputs["trajectory_rows"]
    if len(rows) < sampler["batch_size"]:
        call.update(batch_size=len(rows), latents=outputs["z0"][rows])
    return call


def replay_official_network(pipe, golden: Golden, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """
    Makes `pipe` take the official run's recorded network outputs instead of calling its network.

    Comparing two samplers bit for bit only makes sense given bitwise-equal network outputs, and float32 matmuls are
    not bitwise-equal across CPUs (AVX2 and AVX-512 kernels sum in different orders: ~1e-6 apart). Replaying the
    recorded outputs tests the sampler alone (random draws, updates, self-conditioning routing, decode) bit for bit on
    any machine. Each replayed call first checks what the sampler hands the network (its time and self-conditioning
    input) against the official run. Returns the list of replayed evaluation indices.

    ELF's time grid is sigmoid(normals), and torch's vectorised sigmoid too rounds differently across CPUs (1 ulp
    in one of 31 entries, AVX2 vs AVX-512). The grid is still drawn as the scheduler draws it and checked to 2 ulp;
    the sampler then runs on the fixture's rounding of it.
    """
    sampler = json.loads(golden.metadata["sampler"])
    outputs, calls = golden.outputs, []
    if "eval_times" in outputs:
        from untied_sc.schedulers import scheduling_elf

        draw = scheduling_elf.elf_time_grid

        def official_rounding(*args, **kwargs):
            grid = draw(*args, **kwargs)
            assert ((grid - outputs["grid"]).abs() <= grid * 2**-22).all(), "the time grid is not the official one"
            return outputs["grid"].clone()

        monkeypatch.setattr(scheduling_elf, "elf_time_grid", official_rounding)

    def check(timestep, times, self_conditioning):
        k = len(calls)
        assert k < len(times), f"evaluation {k + 1}: the official run made {len(times)}"
        assert torch.equal(torch.as_tensor(timestep), times[k]), f"evaluation {k}: time {timestep} ≠ {times[k]}"
        if k == 0:
            assert self_conditioning is None or not self_conditioning.any(), (
                "evaluation 0 got a self-conditioning input"
            )
        else:
            assert torch.equal(self_conditioning, outputs["predictions"][k - 1]), f"evaluation {k}: wrong SC input"
        calls.append(k)
        return k

    if "eval_times" in outputs:  # ELF: the network output is the prediction; the decode pass gives the logits
        from untied_sc.models.elf_transformer import ELFTransformerOutput

        def forward(sample, timestep, self_conditioning=None, sc_cfg_scale=None, decoder_step_active=None, **_):
            assert sc_cfg_scale == sampler["sc_cfg_scale"]
            if decoder_step_active:
                return ELFTransformerOutput(sample=sample, logits=outputs["decode_logits"])
            k = check(timestep, outputs["eval_times"], self_conditioning)
            return ELFTransformerOutput(sample=outputs["predictions"][k])

        pipe.transformer.forward = forward
    else:  # LangFlow: the recorded prediction is x̂ = softmax(logits)·E_norm, past the network and the softmax

        def predict(model_input, timestep, self_conditioning):
            k = check(timestep, outputs["grid"], self_conditioning)
            if k < len(outputs["predictions"]):
                return outputs["predictions"][k], None
            logits = outputs["final_logits"][
                outputs["trajectory_rows"]
            ]  # the final evaluation: its argmax, the tokens
            return pipe.transformer.clean_prediction(logits), logits

        pipe._predict = predict
    return calls


@pytest.fixture(scope="session")
def elf_golden() -> Golden:
    return Golden("elf_forward.safetensors")


@pytest.fixture(scope="session")
def langflow_golden() -> Golden:
    return Golden("langflow_forward.safetensors")


@pytest.fixture
def tiny_elf():
    from untied_sc import ELFTransformerModel

    torch.manual_seed(0)
    return ELFTransformerModel(
        latent_dim=16,
        max_length=12,
        hidden_size=32,
        num_layers=2,
        num_attention_heads=4,
        intermediate_size=42,
        bottleneck_dim=8,
        vocab_size=40,
    ).eval()


@pytest.fixture
def tiny_langflow():
    from untied_sc import LangFlowTransformerModel

    torch.manual_seed(0)
    return LangFlowTransformerModel(
        vocab_size=40, hidden_size=32, cond_dim=16, num_layers=2, num_attention_heads=4, max_length=12
    ).eval()
