"""ELFText2TextPipeline against the official conditional generation, token for token and latent for latent.

`tests/fixtures/elf_cond_sample.safetensors` was written by `tests/fixtures/make_cond_sampler_fixtures.py`: the
official `generation.test_generation_cond` (PyTorch port) on CPU in float32 with tiny random ELF and T5 weights, three
prompts of 3, 6 and 8 (truncated to 6) tokens, seeded as `eval.py`; it records every network call, latent and token.
As in test_pipelines_official.py: the sampler alone is compared bit for bit given the official network outputs, the
source latents and the draws (each checked first against ours), and the whole pipeline with our networks gives the
official tokens with its latents within the free-running bound.
"""

import json
import logging

import pytest
import torch
from safetensors import safe_open
from transformers import T5Config, T5EncoderModel

from untied_sc import ELFPipeline, ELFScheduler, ELFText2TextPipeline, ELFTransformerModel, UntiedELFScheduler
from untied_sc.models.convert import elf_config_from_state_dict
from untied_sc.models.elf_transformer import ELFTransformerOutput
from untied_sc.schedulers import noise, scheduling_elf
from untied_sc.schedulers.comparison_names import COMPARISON_METHODS, comparison_scheduler_class

from .conftest import DRAW_TOLERANCE, FIXTURES, NETWORK_TOLERANCE, TRAJECTORY_BOUNDS, assert_official_grid
from .test_baselines import ZERO_STRENGTH
from .tiny import tiny_tokenizer


CASES = ("ode8_cfg2_sc1", "sde8_cfg1_sc3", "sde8_cfg2_sc3")


class CondGolden:
    def __init__(self):
        with safe_open(FIXTURES / "elf_cond_sample.safetensors", "pt") as handle:
            metadata = handle.metadata()
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        self.run = json.loads(metadata["run"])
        self.encoder_config = json.loads(metadata["encoder_config"])
        self.weights = {k.removeprefix("weight."): v for k, v in tensors.items() if k.startswith("weight.")}
        self.encoder = {k.removeprefix("encoder."): v for k, v in tensors.items() if k.startswith("encoder.")}
        self.cases = {
            name: {k.removeprefix(f"{name}."): v for k, v in tensors.items() if k.startswith(f"{name}.")}
            for name in CASES
        }


GOLDEN = CondGolden()


def components():
    config = elf_config_from_state_dict(GOLDEN.weights, max_length=GOLDEN.run["max_length"])
    transformer = ELFTransformerModel(**config).eval()
    transformer.load_state_dict(GOLDEN.weights)
    encoder = T5EncoderModel(T5Config(**GOLDEN.encoder_config)).eval()
    encoder.load_state_dict(GOLDEN.encoder)
    return transformer, encoder


def pipeline(case: str, scheduler_class=ELFScheduler, **scheduler_kwargs) -> ELFText2TextPipeline:
    transformer, encoder = components()
    gamma = GOLDEN.run["cases"][case]["sde_gamma"]
    scheduler = scheduler_class(sde_gamma=gamma, **scheduler_kwargs)
    pipe = ELFText2TextPipeline(
        transformer, scheduler, tiny_tokenizer(), encoder, max_source_length=GOLDEN.run["max_input_length"]
    )
    pipe.set_progress_bar_config(disable=True)
    return pipe


def call(case: str) -> dict:
    settings = GOLDEN.run["cases"][case]
    return {
        "prompt": GOLDEN.run["prompts"],
        "num_inference_steps": settings["steps"],
        "guidance_scale": settings["cfg"],
        "sc_cfg_scale": settings["sc_cfg"],
        "generator": torch.Generator().manual_seed(GOLDEN.run["seed"]),
    }


def replay_draws(case: str, monkeypatch) -> None:
    """The official run's unit normals (z_0, then each SDE step's noise), each checked against ours first."""
    recorded, used = GOLDEN.cases[case]["draws"], []
    ode = GOLDEN.run["cases"][case]["method"] == "ode"

    def replayed(drawn):
        if drawn.shape != recorded.shape[1:]:
            return drawn  # the time grid's normals: replaced whole below
        i = len(used)
        if ode and i >= len(recorded):
            return drawn  # ELFScheduler with γ = 0 still draws each step's noise, at weight 1 − a = 0
        assert i < len(recorded) and drawn.shape == recorded[i].shape, f"draw {i}"
        assert (drawn - recorded[i]).abs().max().item() <= DRAW_TOLERANCE, f"draw {i} differs"
        used.append(i)
        return recorded[i].clone()

    randn, draw_on_cpu = torch.randn, noise._draw_on_cpu

    def replayed_randn(*args, generator=None, **kwargs):
        drawn = randn(*args, generator=generator, **kwargs)
        return replayed(drawn) if generator is not None and generator.device.type == "cpu" else drawn

    monkeypatch.setattr(torch, "randn", replayed_randn)
    monkeypatch.setattr(noise, "_draw_on_cpu", lambda *a, **k: replayed(draw_on_cpu(*a, **k)))
    grid, draw_grid = GOLDEN.cases[case]["grid"], scheduling_elf.elf_time_grid

    def official_grid(*args, **kwargs):
        assert_official_grid(draw_grid(*args, **kwargs), grid, "the time grid")
        return grid.clone()

    monkeypatch.setattr(scheduling_elf, "elf_time_grid", official_grid)


def replay_network(pipe, case: str, monkeypatch) -> list:
    """The official network outputs in the official order (per step: with the source, then without it)."""
    outputs, settings = GOLDEN.cases[case], GOLDEN.run["cases"][case]
    guided = settings["cfg"] != 1
    order = [(k, branch) for k in range(settings["steps"]) for branch in (("cond", "uncond") if guided else ("cond",))]
    calls = []

    def forward(sample, timestep, self_conditioning=None, sc_cfg_scale=None, decoder_step_active=None, **_):
        assert sc_cfg_scale == settings["sc_cfg"]
        if decoder_step_active:
            return ELFTransformerOutput(sample=sample, logits=outputs["decode_logits"])
        k, branch = order[len(calls)]
        assert torch.equal(torch.as_tensor(timestep), outputs["eval_times"][k]), f"evaluation {len(calls)}: time"
        calls.append((k, branch))
        return ELFTransformerOutput(sample=outputs[f"net_{branch}"][k])

    monkeypatch.setattr(pipe.transformer, "forward", forward)
    encode = pipe.encode_prompt

    def official_source(prompt, device=None):  # our encoder's latents, checked, then the official ones
        ours = encode(prompt, device)
        assert torch.equal(ours.mask, outputs["cond_seq_mask"].bool())
        held = ours.mask[..., None]
        error = (ours.latents - torch.where(held, outputs["cond_seq"], 0)).abs().max().item()
        assert error <= NETWORK_TOLERANCE, f"source latents {error:.1e} from the official ones"
        ours.latents = torch.where(held, outputs["cond_seq"], 0)
        return ours

    monkeypatch.setattr(pipe, "encode_prompt", official_source)
    return calls


def run(pipe, case: str):
    trajectory = []

    def record(pipe, step, timestep, tensors):
        trajectory.append(tensors["latents"].clone())
        return {}

    output = pipe(**call(case), output_type="seq", callback_on_step_end=record)
    return output, torch.stack(trajectory)


@pytest.mark.parametrize("case", CASES)
def test_conditional_sampler_reproduces_official_generation_bit_for_bit(case, monkeypatch):
    pipe = pipeline(case)
    replay_draws(case, monkeypatch)
    calls = replay_network(pipe, case, monkeypatch)
    output, trajectory = run(pipe, case)
    expected = GOLDEN.cases[case]
    settings = GOLDEN.run["cases"][case]
    assert len(calls) == settings["steps"] * (2 if settings["cfg"] != 1 else 1)
    assert torch.equal(trajectory, expected["trajectory"])
    assert torch.equal(output.latents, expected["trajectory"][-1])
    assert torch.equal(output.sequences, expected["tokens"])


@pytest.mark.parametrize("case", CASES)
def test_untied_scheduler_at_zero_strength_is_the_official_conditional_sampler(case, monkeypatch):
    pipe = pipeline(case, UntiedELFScheduler, eta_r=0.0, eta_t=0.0, eta_o=0.0, alpha=1.0)
    replay_draws(case, monkeypatch)
    replay_network(pipe, case, monkeypatch)
    output, trajectory = run(pipe, case)
    assert torch.equal(trajectory, GOLDEN.cases[case]["trajectory"])
    assert torch.equal(output.sequences, GOLDEN.cases[case]["tokens"])


@pytest.mark.parametrize("case", CASES)
def test_conditional_pipeline_matches_official_generation(case, monkeypatch):
    pipe = pipeline(case)
    replay_draws(case, monkeypatch)
    output, trajectory = run(pipe, case)
    expected = GOLDEN.cases[case]
    error = (trajectory - expected["trajectory"]).abs().max().item()
    assert error <= TRAJECTORY_BOUNDS["elf", 8], f"{case}: free-running latents {error:.1e} from the official ones"
    assert torch.equal(output.sequences, expected["tokens"])


def test_encoder_latents_match_the_official_source_latents():
    pipe = pipeline("ode8_cfg2_sc1")
    source = pipe.encode_prompt(GOLDEN.run["prompts"])
    expected = GOLDEN.cases["ode8_cfg2_sc1"]
    assert source.lengths == [3, 6, 6]
    assert torch.equal(source.mask, expected["cond_seq_mask"].bool())
    held = source.mask[..., None]
    assert (source.latents - torch.where(held, expected["cond_seq"], 0)).abs().max() <= NETWORK_TOLERANCE


def test_texts_are_the_target_positions_decoded():
    pipe = pipeline("ode8_cfg2_sc1")
    output = pipe(**call("ode8_cfg2_sc1"))
    assert output.sequences.shape == (3, pipe.max_target_length)
    assert output.texts == pipe.tokenizer.batch_decode(output.sequences, skip_special_tokens=True)
    single = pipe(**{**call("ode8_cfg2_sc1"), "prompt": GOLDEN.run["prompts"][0]})
    assert len(single.texts) == 1


def test_bad_prompts_are_refused_with_the_fix(caplog):
    pipe = pipeline("ode8_cfg2_sc1")
    with pytest.raises(ValueError, match=r"prompt\[0\].*has no tokens"):
        pipe(prompt="", num_inference_steps=2)
    with pytest.raises(ValueError, match="pass `prompt=`"):
        pipe(num_inference_steps=2)
    with pytest.raises(ValueError, match="non-empty list"):
        pipe(prompt=[], num_inference_steps=2)
    with caplog.at_level(logging.WARNING):
        long = pipe.tokenize_prompt("w3 w4 w5 w6 w7 w8 w9 w10")
    assert long == [[3, 4, 5, 6, 7, 8]]
    assert "truncates" in caplog.text and "max_source_length" in caplog.text


def test_a_prompt_to_the_unconditional_pipeline_names_the_conditional_one():
    transformer, _ = components()
    pipe = ELFPipeline(transformer, ELFScheduler(), tiny_tokenizer())
    with pytest.raises(TypeError, match="ELFText2TextPipeline"):
        pipe(prompt="w3 w4", num_inference_steps=2)


def test_mismatched_components_are_refused():
    transformer, encoder = components()
    wide = T5EncoderModel(T5Config(**{**GOLDEN.encoder_config, "d_model": 24}))
    with pytest.raises(ValueError, match="text_encoder gives 24-wide latents.*latent_dim=16"):
        ELFText2TextPipeline(transformer, ELFScheduler(), tiny_tokenizer(), wide, max_source_length=6)
    with pytest.raises(ValueError, match="max_source_length"):
        ELFText2TextPipeline(transformer, ELFScheduler(), tiny_tokenizer(), encoder)
    with pytest.raises(ValueError, match=r"must be in \[1, 11\]"):
        ELFText2TextPipeline(transformer, ELFScheduler(), tiny_tokenizer(), encoder, max_source_length=12)
    small = T5EncoderModel(T5Config(**{**GOLDEN.encoder_config, "vocab_size": 20}))
    with pytest.raises(ValueError, match="tokenizer has 40 tokens but the text_encoder embeds 20"):
        ELFText2TextPipeline(transformer, ELFScheduler(), tiny_tokenizer(), small, max_source_length=6)


def usage_examples() -> list[str]:
    """The python blocks of docs/usage.md's section on ELFText2TextPipeline."""
    text = (FIXTURES.parents[1] / "docs" / "usage.md").read_text()
    section = text.split("## ELF with a source text", 1)[1].split("\n## ", 1)[0]
    return [block.split("```", 1)[0] for block in section.split("```python\n")[1:]]


def test_the_usage_examples_run_as_written(tmp_path, monkeypatch):
    examples = usage_examples()[:2]  # the third samples a calibrated folder: test_conditional_convert runs it
    assert len(examples) == 2
    for name in ("elf-b-de-en", "elf-b-xsum"):  # tiny random folders of the released layout
        pipeline("ode8_cfg2_sc1").save_pretrained(tmp_path / name)
    monkeypatch.chdir(tmp_path)
    for example in examples:
        scope = {}
        exec(compile(example, "docs/usage.md", "exec"), scope)
        assert all(isinstance(text, str) for text in scope["out"].texts)
    assert len(scope["out"].texts) == 1


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("method", COMPARISON_METHODS)
def test_comparison_samplers_at_zero_strength_are_the_official_conditional_sampler(method, case):
    # The conditional run's grid comes from its own stream (the generator advanced by the official data loader's
    # draw): a comparison sampler takes it from the run as the official one does. With guidance it gets the combined
    # prediction (the same update in exact arithmetic, not the official float32 rounding of the velocities).
    official = pipeline(case)
    expected, expected_trajectory = run(official, case)
    pipe = pipeline(case)
    pipe.scheduler = comparison_scheduler_class(method, "elf").from_config(
        pipe.scheduler.config, **ZERO_STRENGTH[method]
    )
    got, trajectory = run(pipe, case)
    assert torch.equal(pipe.scheduler.timesteps, official.scheduler.timesteps)
    if GOLDEN.run["cases"][case]["cfg"] == 1:
        assert torch.equal(trajectory, expected_trajectory)
        assert torch.equal(got.sequences, expected.sequences)
    else:
        torch.testing.assert_close(trajectory, expected_trajectory, rtol=0, atol=1e-4)
