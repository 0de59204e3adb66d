"""The networks against the official network code.

The fixtures `tests/fixtures/{elf,langflow}_forward.safetensors` were produced by
`tests/fixtures/make_model_fixtures.py`: it builds the official modules (ELF PyTorch port `modules/model.py::ELF`,
LangFlow `langflow/model.py::LangFlow`) at tiny sizes, overwrites every parameter with seeded random values (so no
zero-initialised head hides a bug), runs them on CPU in float32 on seeded inputs and stores weights (official key
names), inputs and outputs. Regenerate with
`python tests/fixtures/make_model_fixtures.py --elf-src <ELF repo>/src --langflow-src <LangFlow repo>`.
"""

import torch

from .conftest import elf_from_golden, langflow_from_golden


TOLERANCE = 1e-5


def _max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape, (a.shape, b.shape)
    return (a.float() - b.float()).abs().max().item()


def test_official_elf_state_dict_loads_with_no_missing_or_unexpected_keys(elf_golden):
    model = elf_from_golden(elf_golden)
    result = model.load_state_dict(elf_golden.weights, strict=False)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert set(model.state_dict()) == set(elf_golden.weights)


def test_official_langflow_state_dict_loads_with_no_missing_or_unexpected_keys(langflow_golden):
    model = langflow_from_golden(langflow_golden)
    result = model.load_state_dict(langflow_golden.weights, strict=False)
    assert result.missing_keys == [] and result.unexpected_keys == []
    assert set(model.state_dict()) == set(langflow_golden.weights)


@torch.no_grad()
def test_elf_matches_official_forward_in_every_decoder_state(elf_golden):
    model, inputs, outputs = elf_from_golden(elf_golden), elf_golden.inputs, elf_golden.outputs
    for state, flag in (("none", None), ("false", False), ("true", True)):
        out = model(
            inputs["latent"], inputs["t"], inputs["self_cond"], inputs["sc_cfg_scale"], decoder_step_active=flag
        )
        assert _max_diff(out.sample, outputs[f"x_pred.{state}"]) <= TOLERANCE
        if flag is None:
            assert out.logits is None
        else:
            assert _max_diff(out.logits, outputs[f"logits.{state}"]) <= TOLERANCE


@torch.no_grad()
def test_elf_matches_official_decode_pass_and_padding_mask(elf_golden):
    model, inputs, outputs = elf_from_golden(elf_golden), elf_golden.inputs, elf_golden.outputs
    decode = model(inputs["latent"], inputs["decode_t"], None, inputs["sc_cfg_scale"], decoder_step_active=True)
    assert _max_diff(decode.logits, outputs["decode_logits"]) <= TOLERANCE
    assert _max_diff(decode.sample, outputs["decode_x_pred"]) <= TOLERANCE
    masked = model(
        inputs["latent"],
        inputs["t"],
        inputs["self_cond"],
        inputs["sc_cfg_scale"],
        attention_mask=inputs["attention_mask"],
    )
    assert _max_diff(masked.sample, outputs["x_pred.masked"]) <= TOLERANCE


@torch.no_grad()
def test_langflow_matches_official_logits_with_and_without_self_conditioning(langflow_golden):
    model, inputs, outputs = langflow_from_golden(langflow_golden), langflow_golden.inputs, langflow_golden.outputs
    logits = model(inputs["latent"], inputs["gamma"], inputs["self_cond"]).logits
    assert _max_diff(logits, outputs["logits"]) <= TOLERANCE
    assert _max_diff(model(inputs["latent"], inputs["gamma"]).logits, outputs["logits_no_self_cond"]) <= TOLERANCE
    assert _max_diff(model.clean_prediction(logits), outputs["x_pred"]) <= TOLERANCE
    assert _max_diff(model.embedding_matrix(), outputs["embedding_normalized"]) <= TOLERANCE


def test_langflow_proposal_is_read_from_the_weights(langflow_golden):
    model = langflow_from_golden(langflow_golden)
    loc, scale, cutoff = model.gumbel_parameters()
    weights = langflow_golden.weights
    assert (loc, scale) == (weights["proposal.loc"].item(), weights["proposal.scale"].item())
    assert loc != langflow_golden.config["gumbel_loc"] and cutoff == langflow_golden.config["gumbel_cutoff"]
