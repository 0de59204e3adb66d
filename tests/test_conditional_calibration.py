"""Calibration and the untied sampler on a conditional ELF model (the official conditional recording's tiny weights):
trajectories generated from a prompt bank, the held source positions out of every statistic and of the correction."""

import dataclasses
import json

import pytest
import torch

from untied_sc import ELFPipeline, UntiedELFScheduler
from untied_sc.calibration import reference
from untied_sc.calibration.calibrate import calibrate_pipeline
from untied_sc.calibration.prompts import PromptBank, read_prompt_bank
from untied_sc.cli import main

from .test_conditional_convert import converted  # noqa: F401  (the converted folder fixture)
from .test_pipelines_conditional import GOLDEN, pipeline, replay_draws, replay_network, run
from .tiny import tiny_tokenizer


PROMPTS = PromptBank(tuple(GOLDEN.run["prompts"]), "sources.txt")
SMALL = {"bank_size": 4, "batch_size": 2, "base_scale_bank_size": 2, "base_scale_steps": 4, "progress": False}


def calibrated(**kwargs):
    pipe = pipeline("ode8_cfg2_sc1")
    return pipe, calibrate_pipeline(pipe, [8], prompts=PROMPTS, **SMALL, **kwargs).statistics


def source_lengths(prompts: list[str]) -> list[int]:
    """The source tokens of each prompt, counted here (whitespace words of the tiny vocabulary, cut at 6)."""
    return [min(len(text.split()), GOLDEN.run["max_input_length"]) for text in prompts]


@pytest.fixture(scope="module")
def statistics():
    return calibrated()[1]


def test_the_statistics_record_the_prompt_bank(statistics):
    record = statistics.config.prompt_banks["8"]
    assert record == {"file": "sources.txt", "fingerprint": PROMPTS.fingerprint, "count": 3}
    assert statistics.config.calibrated_steps == [8] and torch.isfinite(statistics.mean_nfe8).all()
    assert (statistics.rms_nfe8 > 0).any()


def test_what_the_sampler_sees_at_the_held_positions_does_not_reach_the_statistics(statistics, monkeypatch):
    # Noise of size 100 added to the prediction at the held positions before every reference step: the pipeline
    # restores the source after the step and in the network inputs, so with the held positions masked out the
    # statistics are the same to the bit.
    step = reference.ReferenceRecurrenceELFScheduler.step
    generator = torch.Generator().manual_seed(3)

    def noisy_step(self, model_output, timestep, sample, return_dict=True, guidance=None):  # the step's signature
        noise = 100 * torch.randn(model_output.shape, generator=generator)
        noisy = torch.where(self.mask[..., None], model_output, noise)
        return step(self, noisy, timestep, sample, return_dict=return_dict, guidance=guidance)

    monkeypatch.setattr(reference.ReferenceRecurrenceELFScheduler, "step", noisy_step)
    noisy = calibrated()[1]
    for name in ("mean_nfe8", "rms_nfe8", "cosine_distance_nfe8", "base_scales"):
        assert torch.equal(getattr(noisy, name), getattr(statistics, name)), name

    # Without the mask the same noise enters the moments: the check above can fail.
    set_timesteps = reference.ReferenceRecurrenceELFScheduler.set_timesteps
    unmasked_steps = []

    def unmasked(self, *args, context, **kwargs):  # the pipeline hands the generated positions in its run context
        set_timesteps(self, *args, context=dataclasses.replace(context, mask=None), **kwargs)
        self.mask = torch.ones_like(context.mask)  # every position active: the held ones too
        unmasked_steps.append(True)

    monkeypatch.setattr(reference.ReferenceRecurrenceELFScheduler, "set_timesteps", unmasked)
    leaked = calibrated()[1]
    assert unmasked_steps and not torch.equal(leaked.mean_nfe8, statistics.mean_nfe8)


def test_the_mean_is_the_mean_over_generated_positions_computed_independently(statistics, monkeypatch):
    # Every reference correction and the prompts of its batch, recorded; μ_k recomputed here as the mean over
    # trajectories of each trajectory's mean over its generated positions (those after its source tokens).
    recorded, add = [], reference.MomentAccumulator.add
    encode = type(pipeline("ode8_cfg2_sc1")).encode_prompt
    batch_prompts = []

    def recording_encode(self, prompt, device=None):
        batch_prompts.append(list(prompt))
        return encode(self, prompt, device)

    def recording_add(self, step, correction, distance, mask):
        recorded.append((self, step, correction.clone(), batch_prompts[-1]))
        return add(self, step, correction, distance, mask)

    monkeypatch.setattr(reference.MomentAccumulator, "add", recording_add)
    pipe = pipeline("ode8_cfg2_sc1")
    monkeypatch.setattr(type(pipe), "encode_prompt", recording_encode)
    mean = calibrate_pipeline(pipe, [8], prompts=PROMPTS, **SMALL).statistics.mean_nfe8
    bank_mu = recorded[0][0]  # the first accumulator is bank B_μ's
    steps = {}
    for accumulator, step, correction, prompts in recorded:
        if accumulator is not bank_mu:
            continue
        for row, length in enumerate(source_lengths(prompts)):
            steps.setdefault(step, []).append(correction[row, length:].double().mean(dim=0))
    assert steps, "no active reference step"
    for step, means in steps.items():
        expected = torch.stack(means).mean(dim=0).float()
        assert torch.allclose(mean[step], expected, rtol=1e-5, atol=1e-7), step
    inactive = sorted(set(range(8)) - set(steps))
    assert all(torch.equal(mean[k], torch.zeros_like(mean[k])) for k in inactive)


def untied(pipe, statistics, **coefficients):
    scheduler = UntiedELFScheduler.from_config(pipe.scheduler.config, **coefficients)
    pipe.scheduler = scheduler
    pipe.register_modules(sampler_statistics=statistics)
    return pipe


@pytest.mark.parametrize("case", ["ode8_cfg2_sc1", "sde8_cfg2_sc3"])
def test_untied_at_zero_strength_with_statistics_is_the_official_sampler(statistics, case, monkeypatch):
    pipe = pipeline(case)
    untied(pipe, statistics, eta_r=0.0, eta_t=0.0, eta_o=0.0, alpha=1.0)
    replay_draws(case, monkeypatch)
    replay_network(pipe, case, monkeypatch)
    output, trajectory = run(pipe, case)
    assert torch.equal(trajectory, GOLDEN.cases[case]["trajectory"])
    assert torch.equal(output.sequences, GOLDEN.cases[case]["tokens"])


def test_untied_at_the_calibrated_preset_runs_differs_and_keeps_the_source(statistics):
    call = {"prompt": GOLDEN.run["prompts"], "num_inference_steps": 8, "output_type": "latent"}
    official = pipeline("ode8_cfg2_sc1")(**call, generator=torch.Generator().manual_seed(0)).latents
    pipe = untied(pipeline("ode8_cfg2_sc1"), statistics, coefficients="elf-b")
    assert pipe.scheduler.resolve_coefficients(8)["eta_t"] > 0
    latents = pipe(**call, generator=torch.Generator().manual_seed(0)).latents
    source = pipe.encode_prompt(GOLDEN.run["prompts"])
    held = source.mask[..., None]
    assert torch.isfinite(latents).all()
    assert torch.equal(torch.where(held, latents, 0), source.latents)  # the source held, as official
    generated = (latents - official).abs().masked_select(~held)
    assert generated.max() > 1e-3  # the untied sampler moved the generated positions


# --- the command line -----------------------------------------------------------------------------------------------


def test_calibrate_a_converted_folder_on_prompts(converted, tmp_path, capsys):  # noqa: F811
    bank = tmp_path / "sources.jsonl"
    bank.write_text("\n".join(json.dumps({"input": text}) for text in GOLDEN.run["prompts"]) + "\n")
    out = tmp_path / "calibrated"
    args = ["calibrate", str(converted), "--nfe", "8", "--bank-size", "4", "--batch-size", "2"]
    small = ["--base-scale-bank-size", "2", "--base-scale-steps", "4", "--no-progress", "--output", str(out)]
    assert main([*args, *small, "--prompts", str(bank)]) == 0
    config = json.loads((out / "sampler_statistics" / "config.json").read_text())
    assert config["prompt_banks"]["8"] == {"file": "sources.jsonl", "fingerprint": PROMPTS.fingerprint, "count": 3}


def test_calibrate_of_a_conditional_folder_without_prompts_names_the_flag(converted, capsys):  # noqa: F811
    assert main(["calibrate", str(converted), "--nfe", "8", "--output", "unused"]) == 2
    error = capsys.readouterr().err
    assert "--prompts FILE" in error and "ELFText2TextPipeline" in error
    with pytest.raises(ValueError, match="--prompts FILE"):
        calibrate_pipeline(pipeline("ode8_cfg2_sc1"), [8], **SMALL)


def test_prompts_to_an_unconditional_pipeline_are_refused(tmp_path):
    pipe = pipeline("ode8_cfg2_sc1")
    unconditional = ELFPipeline(pipe.transformer, pipe.scheduler, tiny_tokenizer())
    with pytest.raises(ValueError, match="unconditional.*Leave out --prompts"):
        calibrate_pipeline(unconditional, [8], prompts=PROMPTS, **SMALL)


def test_a_bad_prompt_file_names_the_file_and_line(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("w5 w9\n\nw7\n")
    with pytest.raises(ValueError, match=r"blank.txt, line 2 is an empty prompt"):
        read_prompt_bank(blank)
    wrong_key = tmp_path / "wrong.jsonl"
    wrong_key.write_text('{"text": "w5"}\n')
    with pytest.raises(ValueError, match=r"wrong.jsonl, line 1: expected an object with one string field"):
        read_prompt_bank(wrong_key)
    with pytest.raises(ValueError, match="cannot read the prompt file"):
        read_prompt_bank(tmp_path / "missing.txt")
    ok = tmp_path / "ok.txt"
    ok.write_text("w5\nw6\n")
    assert read_prompt_bank(ok).texts == ("w5", "w6") and read_prompt_bank(ok).source == "ok.txt"


def test_commands_that_sample_without_prompts_refuse_a_conditional_folder(converted, capsys):  # noqa: F811
    from untied_sc.pipelines import load_pipeline

    with pytest.raises(ValueError, match=r"conditional model.*prompt=\.\.\..*--prompts FILE"):
        load_pipeline(converted)
    assert type(load_pipeline(converted, conditional=True)).__name__ == "ELFText2TextPipeline"
    assert main(["tune", str(converted), "--nfe", "8", "--output", "unused"]) == 2
    assert "generates from a source text" in capsys.readouterr().err


def test_cli_prompts_to_an_unconditional_folder_are_refused_before_loading(tmp_path, capsys):
    pipe = pipeline("ode8_cfg2_sc1")
    ELFPipeline(pipe.transformer, pipe.scheduler, tiny_tokenizer()).save_pretrained(tmp_path / "elf")
    (tmp_path / "sources.txt").write_text("w5\n")
    args = ["calibrate", str(tmp_path / "elf"), "--nfe", "8", "--prompts", str(tmp_path / "sources.txt")]
    assert main(args) == 2
    assert "unconditional ELFPipeline, which takes no prompts" in capsys.readouterr().err
