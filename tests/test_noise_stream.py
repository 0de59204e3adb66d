"""Device-side randomness: the noise stream's draw-ahead gives the inline numbers, and a CUDA generator
draws the official order on its device.

Draw-ahead runs on a background thread; forced on for CPU tensors (`draw_ahead=True`) it takes the same code path
as on a GPU except for pinning and the non-blocking copy, so these CPU tests check that it never changes a number,
never draws more than the run consumes, and leaves the generator where inline drawing leaves it.
"""

import pytest
import torch

from untied_sc import ELFPipeline, ELFScheduler, UntiedSelfConditioningScheduler
from untied_sc.schedulers.noise import NoiseStream, RunRandom, check_generator, draw_normal
from untied_sc.schedulers.scheduling_elf import copy_generator, elf_time_grid

from .conftest import Golden, elf_from_golden, golden_call, replay_official_network
from .tiny import random_statistics, tiny_tokenizer


SHAPE = (3, 5, 7)


def _inline(seed: int, shapes) -> tuple[list[torch.Tensor], torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randn(shape, generator=generator) for shape in shapes], generator.get_state()


@pytest.mark.parametrize("draw_ahead", [True, False, None])
def test_stream_gives_the_inline_draws_and_leaves_the_generator_in_the_inline_state(draw_ahead):
    expected, state = _inline(0, [SHAPE] * 4)
    generator = torch.Generator().manual_seed(0)
    stream = NoiseStream(generator, 4, draw_ahead=draw_ahead)
    drawn = [stream.next(SHAPE, "cpu") for _ in range(4)]
    assert all(torch.equal(a, b) for a, b in zip(drawn, expected, strict=True))
    # The last tensor starts no draw ahead: a later draw from the generator (ELF's decode) sees the inline state.
    assert torch.equal(generator.get_state(), state)
    with pytest.raises(RuntimeError, match="All 4 noise tensors"):
        stream.next(SHAPE, "cpu")


def test_draw_ahead_is_in_flight_between_draws_and_settle_gives_its_numbers_back():
    generator = torch.Generator().manual_seed(1)
    run = RunRandom(generator)
    stream = run.noise(3, draw_ahead=True)
    first = stream.next(SHAPE, "cpu")
    assert stream._ahead is not None  # the second tensor is being drawn on the background thread
    run.settle()  # someone else draws now: the drawn-ahead numbers go back to the generator
    _, state_after_one = _inline(1, [SHAPE])
    assert torch.equal(generator.get_state(), state_after_one)
    # The run may go on (inline from now on) and still gets the inline stream.
    expected, state = _inline(1, [SHAPE] * 3)
    rest = [stream.next(SHAPE, "cpu") for _ in range(2)]
    assert all(torch.equal(a, b) for a, b in zip([first, *rest], expected, strict=True))
    assert torch.equal(generator.get_state(), state) and stream._ahead is None


def test_a_changed_shape_or_dtype_gives_the_drawn_ahead_numbers_back_and_draws_inline():
    generator = torch.Generator().manual_seed(2)
    stream = NoiseStream(generator, 3, draw_ahead=True)
    drawn = [stream.next(SHAPE, "cpu"), stream.next((4, 4), "cpu"), stream.next((4, 4), "cpu", torch.float64)]
    reference = torch.Generator().manual_seed(2)
    expected = [
        torch.randn(SHAPE, generator=reference),
        torch.randn((4, 4), generator=reference),
        torch.randn((4, 4), generator=reference, dtype=torch.float64),
    ]
    assert all(torch.equal(a, b) and a.dtype == b.dtype for a, b in zip(drawn, expected, strict=True))
    assert torch.equal(generator.get_state(), reference.get_state())


def test_the_runs_other_draws_and_its_end_settle_the_generator_first():
    generator = torch.Generator().manual_seed(3)
    run = RunRandom(generator)
    run.noise(2, draw_ahead=True).next(SHAPE, "cpu")
    other = run.normal((2, 2), "cpu")  # e.g. a draw of the run besides its noise
    reference = torch.Generator().manual_seed(3)
    torch.randn(SHAPE, generator=reference)
    assert torch.equal(other, torch.randn((2, 2), generator=reference))
    assert torch.equal(generator.get_state(), reference.get_state())
    with run:  # a run that ends with a draw ahead in flight gives it back
        run.noise(3, draw_ahead=True).next(SHAPE, "cpu")
    torch.randn(SHAPE, generator=reference)
    assert torch.equal(generator.get_state(), reference.get_state())


def test_a_new_stream_of_the_run_settles_the_one_before():
    generator = torch.Generator().manual_seed(4)
    run = RunRandom(generator)
    first = run.noise(3, draw_ahead=True)
    first.next(SHAPE, "cpu")
    second = run.noise(2, draw_ahead=True)  # e.g. `set_begin_index`, or a new `set_timesteps` of the same run
    assert first._ahead is None
    drawn = [second.next(SHAPE, "cpu") for _ in range(2)]
    expected, state = _inline(4, [SHAPE] * 3)
    assert all(torch.equal(a, b) for a, b in zip(drawn, expected[1:], strict=True))
    assert torch.equal(generator.get_state(), state)
    with pytest.raises(ValueError, match="generator of the run"):
        NoiseStream(torch.Generator(), 1, owner=run)


def test_generator_lists_and_other_devices_are_refused_with_what_to_pass():
    scheduler = ELFScheduler()
    with pytest.raises(ValueError, match="not a list"):
        scheduler.set_timesteps(8, generator=[torch.Generator(), torch.Generator()])
    with pytest.raises(TypeError, match="torch.Generator or None"):
        check_generator(0)
    with pytest.raises(ValueError, match="not a list"):
        NoiseStream([torch.Generator()], 1)


def _elf_pipeline(untied: bool, draw_ahead: bool | None) -> ELFPipeline:
    golden = Golden("elf_sample_nfe8.safetensors")
    model = elf_from_golden(golden)
    pipe = ELFPipeline(model, ELFScheduler(), tiny_tokenizer())
    if untied:
        pipe.register_modules(sampler_statistics=random_statistics(model, "elf", steps=(8,)))
        pipe.scheduler = UntiedSelfConditioningScheduler.from_config(pipe.scheduler.config, coefficients="elf-b")
        pipe.scheduler.base.draw_ahead = draw_ahead
    else:
        pipe.scheduler.draw_ahead = draw_ahead
    pipe.set_progress_bar_config(disable=True)
    return pipe


@pytest.mark.parametrize("untied", [False, True], ids=["official", "untied"])
@pytest.mark.parametrize("decode_temperature", [0.0, 1.5])
def test_pipeline_with_draw_ahead_equals_inline_drawing_bit_for_bit(untied, decode_temperature):
    outputs, states = {}, {}
    for draw_ahead in (False, True):
        pipe = _elf_pipeline(untied, draw_ahead)
        generator = torch.Generator().manual_seed(5)
        outputs[draw_ahead] = pipe(
            batch_size=3, num_inference_steps=8, generator=generator, decode_temperature=decode_temperature
        )
        states[draw_ahead] = generator.get_state()
    # A draw too many before the decode would shift its uniforms (T > 0) and the final state (both T).
    assert torch.equal(outputs[True].sequences, outputs[False].sequences)
    assert torch.equal(outputs[True].latents, outputs[False].latents)
    assert torch.equal(states[True], states[False])


def test_a_shorter_loop_leaves_no_drawn_ahead_noise_in_the_generator():
    states = {}
    for draw_ahead in (False, True):
        pipe = _elf_pipeline(False, draw_ahead)
        generator = torch.Generator().manual_seed(6)
        pipe.denoise(batch_size=2, num_inference_steps=8, generator=generator, max_steps=3, progress=False)
        assert pipe.scheduler._noise_stream._ahead is None
        states[draw_ahead] = generator.get_state()
    assert torch.equal(states[True], states[False])


@pytest.mark.parametrize("nfe", [8, 32])
def test_draw_ahead_keeps_the_official_run_bit_for_bit(nfe, monkeypatch):
    golden = Golden(f"elf_sample_nfe{nfe}.safetensors")
    pipe = ELFPipeline(elf_from_golden(golden), ELFScheduler(), tiny_tokenizer())
    pipe.scheduler.draw_ahead = True
    pipe.set_progress_bar_config(disable=True)
    replay_official_network(pipe, golden, monkeypatch)
    output = pipe(**golden_call(golden), output_type="seq")
    assert torch.equal(output.latents, golden.outputs["latents"])
    assert torch.equal(output.sequences, golden.outputs["tokens"])


requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@requires_cuda
def test_cuda_generator_draws_grid_latent_and_noise_in_one_device_stream():
    scheduler = ELFScheduler()
    generator = torch.Generator("cuda").manual_seed(7)
    scheduler.set_timesteps(4, device="cuda", generator=generator)
    shape = (2, 3, 4)
    z0 = draw_normal(shape, generator, "cuda")
    noise = scheduler.scale_model_input(z0 * 2.0, scheduler.timesteps[0])
    replay = torch.Generator("cuda").manual_seed(7)
    grid = elf_time_grid(4, replay, -1.5, 0.8)  # the official CUDA order: grid, z_0, ε_0 from one stream
    assert scheduler.solver.grid == grid.tolist()
    assert torch.equal(z0, torch.randn(shape, generator=replay, device="cuda"))
    eps = torch.randn(shape, generator=replay, device="cuda")
    assert torch.equal(noise, scheduler.solver.renoise(0, z0 * 2.0, eps))
    assert noise.device.type == "cuda" and torch.equal(generator.get_state(), replay.get_state())


@requires_cuda
@pytest.mark.parametrize("generator_device", ["cpu", "cuda"])
def test_elf_pipeline_on_cuda_is_reproducible_and_a_cpu_generator_gives_the_cpu_noise(generator_device):
    pipe = _elf_pipeline(False, None).to("cuda")
    runs = [
        pipe(batch_size=2, num_inference_steps=8, generator=torch.Generator(generator_device).manual_seed(8))
        for _ in range(2)
    ]
    assert torch.equal(runs[0].sequences, runs[1].sequences) and torch.equal(runs[0].latents, runs[1].latents)
    if generator_device == "cpu":
        cpu = _elf_pipeline(False, None)(
            batch_size=2, num_inference_steps=8, generator=torch.Generator().manual_seed(8)
        )
        torch.testing.assert_close(runs[0].latents.cpu(), cpu.latents, atol=1e-4, rtol=0)


def test_cpu_grid_comes_from_a_copy_and_leaves_the_generator_alone():
    generator = torch.Generator().manual_seed(9)
    state = generator.get_state()
    scheduler = ELFScheduler()
    scheduler.set_timesteps(8, generator=generator)
    assert torch.equal(generator.get_state(), state)
    assert scheduler.solver.grid == elf_time_grid(8, copy_generator(generator), -1.5, 0.8).tolist()


def test_a_failed_draw_ahead_is_raised_on_the_next_draw_and_leaves_the_generator_as_before(monkeypatch):
    import threading

    from untied_sc.schedulers import noise

    draw = noise._draw_on_cpu

    def fail_on_the_background_thread(*args, **kwargs):
        if threading.current_thread() is not threading.main_thread():
            raise MemoryError("no pinned memory")
        return draw(*args, **kwargs)

    monkeypatch.setattr(noise, "_draw_on_cpu", fail_on_the_background_thread)
    generator = torch.Generator().manual_seed(10)
    stream = NoiseStream(generator, 3, draw_ahead=True)
    first = stream.next(SHAPE, "cpu")  # drawn inline; starts a draw ahead that fails on its thread
    with pytest.raises(MemoryError, match="no pinned memory"):
        stream.next(SHAPE, "cpu")
    expected, state = _inline(10, [SHAPE])
    assert torch.equal(first, expected[0]) and torch.equal(generator.get_state(), state)
