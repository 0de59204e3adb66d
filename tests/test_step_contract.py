"""The diffusers step contract: `scale_model_input` is pure and `step` uses the `sample` it is given.

For every scheduler (ELF, LangFlow, and the untied one on both families, with the correction on) a custom loop or a
callback that calls `scale_model_input` again, or edits the latent, must be followed exactly.
"""

import pytest
import torch

from untied_sc import (
    ELFPipeline,
    ELFScheduler,
    LangFlowPipeline,
    LangFlowScheduler,
    UntiedSelfConditioningMixin,
    UntiedSelfConditioningScheduler,
)

from .tiny import random_statistics, tiny_tokenizer


SCHEDULERS = ["elf", "langflow", "untied-elf", "untied-langflow"]
STEPS = 8
UNTIED = {"eta_r": 1.5, "eta_t": 1.0, "eta_o": 1.0, "alpha": 0.8}


@pytest.fixture
def make_pipe(tiny_elf, tiny_langflow):
    def make(name: str):
        family = name.removeprefix("untied-")
        if family == "elf":
            pipe = ELFPipeline(tiny_elf, ELFScheduler(), tiny_tokenizer())
        else:
            pipe = LangFlowPipeline(tiny_langflow, LangFlowScheduler(), tiny_tokenizer())
        if name.startswith("untied-"):
            pipe.register_modules(sampler_statistics=random_statistics(pipe.transformer, family, steps=(STEPS,)))
            pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config, **UNTIED)
        pipe.set_progress_bar_config(disable=True)
        return pipe

    return make


def _set_timesteps(pipe, generator: torch.Generator) -> None:
    """What the pipeline passes to `set_timesteps`, written out for each scheduler."""
    scheduler = pipe.scheduler
    kwargs = {}
    if isinstance(pipe, ELFPipeline):
        kwargs["generator"] = generator
    else:
        kwargs["proposal"] = pipe.transformer.gumbel_parameters()
    if isinstance(scheduler, UntiedSelfConditioningMixin):
        kwargs["statistics"] = pipe.sampler_statistics
    scheduler.set_timesteps(STEPS, **kwargs)


def _network(pipe, model_input: torch.Tensor, t: torch.Tensor, self_conditioning: torch.Tensor | None):
    """The pipeline's model by hand: (clean prediction for the scheduler, logits or None)."""
    if isinstance(pipe, ELFPipeline):
        return pipe.transformer(model_input, t, self_conditioning, pipe.sc_cfg_scale).sample.float(), None
    logits = pipe.transformer(model_input, t, self_conditioning).logits
    return pipe.transformer.clean_prediction(logits), logits


def _pipeline_sample(pipe, seed: int, **kwargs):
    return pipe(batch_size=2, num_inference_steps=STEPS, generator=torch.Generator().manual_seed(seed), **kwargs)


@torch.no_grad()
def _hand_loop(pipe, seed: int, extra_scale_calls: int = 0):
    """scale_model_input → network → step, as a custom diffusers loop; `extra_scale_calls` repeats the first call."""
    generator = torch.Generator().manual_seed(seed)
    scheduler = pipe.scheduler
    _set_timesteps(pipe, generator)
    latents = torch.randn((2, *pipe.latent_shape), generator=generator) * scheduler.init_noise_sigma
    logits = None
    for t in scheduler.timesteps:
        for _ in range(extra_scale_calls):
            scheduler.scale_model_input(latents, t)
        model_input = scheduler.scale_model_input(latents, t)
        prediction, logits = _network(pipe, model_input, t, scheduler.self_conditioning)
        latents = scheduler.step(prediction, t, latents).prev_sample
    return latents, pipe._tokens(latents, logits, generator)


@pytest.mark.parametrize("name", SCHEDULERS)
@torch.no_grad()
def test_scale_model_input_is_idempotent_and_draws_once(make_pipe, name):
    pipe = make_pipe(name)
    scheduler = pipe.scheduler
    generator = torch.Generator().manual_seed(0)
    _set_timesteps(pipe, generator)
    latents = torch.randn((2, *pipe.latent_shape), generator=generator)
    for t in scheduler.timesteps:
        first = scheduler.scale_model_input(latents, t)
        state = generator.get_state()
        second = scheduler.scale_model_input(latents, t)
        assert torch.equal(first, second)
        assert torch.equal(generator.get_state(), state)  # the second call drew nothing
        prediction, _ = _network(pipe, first, t, scheduler.self_conditioning)
        latents = scheduler.step(prediction, t, latents).prev_sample


@pytest.mark.parametrize("name", SCHEDULERS)
@pytest.mark.parametrize("extra_scale_calls", [0, 2])
def test_hand_written_loop_matches_the_pipeline(make_pipe, name, extra_scale_calls):
    pipe = make_pipe(name)
    expected = _pipeline_sample(pipe, seed=3, output_type="seq")
    latents, tokens = _hand_loop(pipe, seed=3, extra_scale_calls=extra_scale_calls)
    assert torch.equal(latents, expected.latents)
    assert torch.equal(tokens, expected.sequences)


@pytest.mark.parametrize("name", SCHEDULERS)
def test_an_extra_scale_model_input_call_from_a_callback_changes_nothing(make_pipe, name):
    pipe = make_pipe(name)

    def peek(pipe, i, t, tensors):
        # Looks at the next step's network input (in the diffusers loop, before that step's own call).
        if i + 1 < len(pipe.scheduler.timesteps):
            pipe.scheduler.scale_model_input(tensors["latents"], pipe.scheduler.timesteps[i + 1])
        return {}

    expected = _pipeline_sample(pipe, seed=4, output_type="seq")
    got = _pipeline_sample(pipe, seed=4, output_type="seq", callback_on_step_end=peek)
    assert torch.equal(got.latents, expected.latents) and torch.equal(got.sequences, expected.sequences)


@pytest.mark.parametrize("name", SCHEDULERS)
@torch.no_grad()
def test_step_uses_the_sample_it_is_given(make_pipe, name):
    """step(x̂, t, z') starts from z' (re-noised with the step's own ε), whatever scale_model_input was given."""
    pipe = make_pipe(name)
    scheduler = pipe.scheduler
    latents, prediction = torch.randn((2, 2, *pipe.latent_shape), generator=torch.Generator().manual_seed(1))
    edited = torch.zeros_like(latents)

    def first_step(scaled: torch.Tensor, stepped: torch.Tensor) -> torch.Tensor:
        _set_timesteps(pipe, torch.Generator().manual_seed(2))  # the same ε_0 every time
        t = scheduler.timesteps[0]
        scheduler.scale_model_input(scaled, t)
        return scheduler.step(prediction, t, stepped).prev_sample

    stepped_edited = first_step(latents, edited)
    assert not torch.equal(stepped_edited, first_step(latents, latents))
    assert torch.equal(stepped_edited, first_step(edited, edited))


@pytest.mark.parametrize("name", SCHEDULERS)
def test_public_api(make_pipe, name):
    """What diffusers' pipelines and scheduler tests expect of every scheduler."""
    scheduler = make_pipe(name).scheduler
    assert scheduler.order == 1 and scheduler.family == name.removeprefix("untied-")
    assert scheduler.timesteps is None and len(scheduler) == 0 and scheduler.step_index == 0
    assert scheduler.init_noise_sigma == (2.0 if "elf" in name else 1.0)
    pipe = make_pipe(name)
    _set_timesteps(pipe, torch.Generator().manual_seed(0))
    assert len(pipe.scheduler) == STEPS and pipe.scheduler.timesteps.shape == (STEPS,)


@pytest.mark.parametrize("name", SCHEDULERS)
@torch.no_grad()
def test_return_dict_false_gives_the_output_fields_in_order(make_pipe, name):
    pipe = make_pipe(name)
    latents = torch.randn((2, *pipe.latent_shape), generator=torch.Generator().manual_seed(1))
    outputs = []
    for return_dict in (True, False):
        _set_timesteps(pipe, torch.Generator().manual_seed(2))
        for t in pipe.scheduler.timesteps[:3]:  # past the first step, so the untied corrections act
            prediction, _ = _network(
                pipe, pipe.scheduler.scale_model_input(latents, t), t, pipe.scheduler.self_conditioning
            )
            out = pipe.scheduler.step(prediction, t, latents, return_dict=return_dict)
        outputs.append(out)
    with_dict, as_tuple = outputs
    assert isinstance(as_tuple, tuple) and len(as_tuple) == 3
    for field, value in zip(("prev_sample", "pred_original_sample", "self_conditioning"), as_tuple, strict=True):
        assert torch.equal(with_dict[field], value), field
        assert value.shape == latents.shape
