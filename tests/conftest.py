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
