"""Shared helpers: golden fixtures of the official code, and tiny models."""

import importlib.util
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
        self.name = name.removesuffix(".safetensors")
        with safe_open(FIXTURES / name, "pt") as handle:
            self.metadata = handle.metadata()
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        self.config = json.loads(self.metadata["config"])
        self.weights = {k.removeprefix("weight."): v for k, v in tensors.items() if k.startswith("weight.")}
        self.inputs = {k.removeprefix("input."): v for k, v in tensors.items() if k.startswith("input.")}
        self.outputs = {k.removeprefix("output."): v for k, v in tensors.items() if k.startswith("output.")}


def benchmark_script(name: str):
    """The module of `benchmarks/<name>.py` (the scripts are not a package)."""
    spec = importlib.util.spec_from_file_location(
        name, Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


# What x86 CPUs round differently, and the bound the golden tests allow for it; everything else is compared bit for
# bit, the samplers given the same draws, grid and network outputs above all. torch picks its kernels by the CPU's
# capability: AVX2 and AVX-512 CPUs run the same vectorised code where it matters here, CPUs without AVX2 (and
# ATEN_CPU_CAPABILITY=default) scalar code. The fixtures were recorded with the vectorised kernels.
VECTORISED = torch.backends.cpu.get_cpu_capability() != "DEFAULT"
# Normal draws (z_0, ELF's grid normals and noise): torch's Box-Muller over 16 numbers or more is the same AVX2 code in
# the AVX2 and AVX-512 builds, so equal to the bit; the scalar build rounds log/sin/cos otherwise (2M draws: at most
# 2.1e-6 apart).
DRAW_TOLERANCE = 0.0 if VECTORISED else 1e-5
# A time grid: vectorised transcendentals (ELF's sigmoid, LangFlow's Gumbel icdf logs) differ by 1 ulp in a few
# entries between AVX2 and AVX-512 (ELF: 1 of 31; LangFlow: entry 25 of 64, 5.1138935 vs 5.1138940); the scalar
# build by up to 19 ulp (sigmoid, 200k values) and 10 (the icdf, 100k values).
GRID_ULPS = 2 if VECTORISED else 32
# One network call on the official inputs: float32 matmuls and reductions sum in an order of their own on each CPU,
# and ours in another order than the official code's (largest seen: 1.9e-6 on an AVX2 EPYC, 2.9e-6 with its scalar
# build, 6e-6 on an AVX-512 Xeon; test_models_official.py's forward fixtures use the same bound).
NETWORK_TOLERANCE = 1e-5
# One step with our network from the official state (`run_from_official_latents`): the solvers move the latent
# toward the prediction by a fraction of at most 1 (ELF's SDE and ODE steps, LangFlow's convex combination), so a step
# is off by at most one call's error, at any number of steps (seen: at most 9.5e-7 on an AVX-512 EPYC under each of
# default, avx2 and avx512). This is the tight check of the whole pipeline against the official run.
STEP_TOLERANCE = NETWORK_TOLERANCE
# A whole free-running float32 trajectory with our network (on the official draws), max |Δ| of every latent: a loose
# check only, since each call's rounding is carried down the trajectory and, in ELF's SDE steps with SC-CFG (scale 3),
# amplified step after step: the drift grows with the number of steps and moves with every CPU class. The worst drift
# measured, by family and NFE (ATEN_CPU_CAPABILITY runs of the golden tests, 1 and 2 threads alike):
# - ELF, 8 steps: 1.4e-5 (Intel AMX Xeon, avx512); 9.4e-6 (same, default); 7.9e-6 (same, avx2); 6.2e-6 (AVX-512
#   EPYC, avx2); 3.9e-6 (same, default); 0 (same, avx512: the fixtures' own kernels).
# - ELF, 32 steps: 1.7e-4 (AVX-512 EPYC, default); 1.2e-4 (Intel AMX Xeon, avx2); 5.3e-5 and 4.4e-5 (same, default
#   and avx512); 3.0e-5 (AVX-512 EPYC, avx2); 4.2e-5 (AVX2 EPYC).
# - LangFlow (8 and 64 steps): at most 4.8e-7 anywhere; its convex steps do not amplify.
# Each bound is about 6x the worst drift at its NFE (each new CPU class so far moved the worst by up to 4x).
TRAJECTORY_BOUNDS = {("elf", 8): 1e-4, ("elf", 32): 1e-3, ("langflow", 8): 1e-5, ("langflow", 64): 1e-5}

SIMD_FLAGS = ("avx", "avx2", "fma", "f16c", "avx512", "amx", "avx_vnni")


def cpu_description() -> str:
    """The CPU's vector flags and torch's kernel set, for failure messages about CPU rounding."""
    try:
        with open("/proc/cpuinfo") as handle:
            flags = next((line.split(":", 1)[1].split() for line in handle if line.startswith("flags")), [])
    except OSError:
        flags = []
    simd = sorted(flag for flag in flags if flag.startswith(SIMD_FLAGS))
    return (
        f"torch kernels {torch.backends.cpu.get_cpu_capability()}, {torch.get_num_threads()} threads, "
        f"CPU flags: {' '.join(simd) or 'unknown'}"
    )


def assert_within(error: float, bound: float, what: str) -> None:
    """`error` ≤ `bound`, else a message with both values and the CPU it ran on."""
    assert error <= bound, f"{what}: max |ours - official| = {error:.3e} > the bound {bound:.1e} ({cpu_description()})"


def ulp_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Elementwise, how many float32 steps apart `a` and `b` are (0: equal, 1: neighbours; ±0 count as equal)."""

    def ordered(x: torch.Tensor) -> torch.Tensor:
        bits = x.to(torch.float32).contiguous().view(torch.int32).to(torch.int64)
        return torch.where(bits < 0, -(bits & 0x7FFFFFFF), bits)  # monotone in the value, across the sign too

    return (ordered(a) - ordered(b)).abs()


def assert_official_grid(grid: torch.Tensor, official: torch.Tensor, what: str) -> None:
    """`grid` is the official one up to the documented rounding of the CPU's vectorised transcendentals."""
    assert grid.shape == official.shape, f"{what}: {len(grid)} entries, the official run has {len(official)}"
    ulps = ulp_distance(grid, official)
    assert ulps.max() <= GRID_ULPS, (
        f"{what} differs from the official one by {ulps.max().item()} ulp at entry {ulps.argmax().item()} "
        f"({grid[ulps.argmax()].item()!r} vs {official[ulps.argmax()].item()!r}); CPUs differ by at most {GRID_ULPS}"
    )


DRAWS = FIXTURES / "sampler_draws.safetensors"  # written by tests/fixtures/make_draw_fixtures.py


def watch_draws(monkeypatch: pytest.MonkeyPatch, on_draw) -> None:
    """
    Routes every normal draw the samplers make from a CPU generator through `on_draw(drawn) -> tensor`: `torch.randn`
    with a CPU generator (grids, z_0, the flow-map samplers' noise) and `noise._draw_on_cpu` (ELF's noise stream). The
    draw is made first, so the generator advances as in the run; the sampler gets what `on_draw` returns.
    """
    from untied_sc.schedulers import noise

    randn, draw_on_cpu = torch.randn, noise._draw_on_cpu

    def watched_randn(*args, generator=None, **kwargs):
        drawn = randn(*args, generator=generator, **kwargs)
        return on_draw(drawn) if generator is not None and generator.device.type == "cpu" else drawn

    monkeypatch.setattr(torch, "randn", watched_randn)
    monkeypatch.setattr(noise, "_draw_on_cpu", lambda *args, **kwargs: on_draw(draw_on_cpu(*args, **kwargs)))


def assert_official_draw(drawn: torch.Tensor, official: torch.Tensor, what: str) -> None:
    """`drawn` is the official run's draw: same shape, equal to the bit with the vectorised kernels, else within
    `DRAW_TOLERANCE` (a wrong, reordered or missing draw is off by O(1))."""
    assert drawn.shape == official.shape, f"{what}: shape {tuple(drawn.shape)} ≠ {tuple(official.shape)}"
    error = (drawn - official).abs().max().item() if drawn.numel() else 0.0
    assert error <= DRAW_TOLERANCE, (
        f"{what} is {error:.1e} from the official one (at most {DRAW_TOLERANCE}; {cpu_description()})"
    )


def replay_draws(recorded: list[torch.Tensor], monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """
    Makes the sampler's normal draws `recorded`, the official run's, in order. Each draw is still made, so the
    generator advances as in the run, and checked against the recorded one (`assert_official_draw`) before the
    recorded one is used: on a CPU without AVX2 the draws round otherwise, and the sampler is still compared bit for
    bit. Returns the list of replayed draw indices (the caller checks that the run made them all).
    """
    draws = []

    def replayed(drawn: torch.Tensor) -> torch.Tensor:
        i = len(draws)
        assert i < len(recorded), f"draw {i + 1}: the official run made {len(recorded)}"
        assert_official_draw(drawn, recorded[i], f"draw {i}")
        draws.append(i)
        return recorded[i].clone()

    watch_draws(monkeypatch, replayed)
    return draws


def replay_official_draws(golden: Golden, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """`replay_draws` with the draws of `golden`'s official run (`DRAWS`)."""
    with safe_open(DRAWS, "pt") as handle:
        recorded = [handle.get_tensor(f"{golden.name}.{i}") for i in range(int(handle.metadata()[golden.name]))]
    return replay_draws(recorded, monkeypatch)


def replay_official_grid(module, name: str, official: torch.Tensor, monkeypatch: pytest.MonkeyPatch) -> None:
    """
    Makes the grid function `module.name` return `official`, the official run's grid, after computing ours as the
    sampler does and checking it to `GRID_ULPS` (`assert_official_grid`): its transcendentals round by CPU.
    """
    draw = getattr(module, name)

    def official_rounding(*args, **kwargs):
        assert_official_grid(draw(*args, **kwargs), official, "the time grid")
        return official.clone()

    monkeypatch.setattr(module, name, official_rounding)


def replay_official_network(
    pipe, golden: Golden, monkeypatch: pytest.MonkeyPatch, network_errors: list[float] | None = None
) -> list[int]:
    """
    Makes `pipe` take the official run's recorded network outputs instead of calling its network.

    Comparing two samplers bit for bit only makes sense given bitwise-equal network outputs, and float32 matmuls are
    not bitwise-equal across CPUs (AVX2 and AVX-512 kernels sum in different orders: ~1e-6 apart). Replaying the
    recorded outputs tests the sampler alone (updates, self-conditioning routing, decode) bit for bit on any machine.
    Each replayed call first checks what the sampler hands the network (its time and self-conditioning input)
    against the official run. Returns the list of replayed evaluation indices.

    The sampler's other CPU-dependent inputs are replayed likewise, each computed as the sampler computes it and
    checked first: the normal draws (`replay_official_draws`), and the time grid, a vectorised transcendental (ELF:
    sigmoid of normals; LangFlow: the logs of the Gumbel icdf) checked to `GRID_ULPS`; the sampler then runs on the
    fixture's rounding of it.

    With `network_errors` (a list), each replayed call also runs our network on the very inputs the official
    network got and appends max |ours − official| of its output: one network call, apart from any drift.
    """
    sampler = json.loads(golden.metadata["sampler"])
    outputs, calls = golden.outputs, []
    replay_official_draws(golden, monkeypatch)
    if "eval_times" in outputs:
        from untied_sc.schedulers import scheduling_elf as module

        name = "elf_time_grid"
    else:
        from untied_sc.schedulers import scheduling_langflow as module

        name = "gumbel_gamma_grid"
    replay_official_grid(module, name, outputs["grid"], monkeypatch)

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

    def compare(ours: torch.Tensor, official: torch.Tensor) -> None:
        if network_errors is not None:
            network_errors.append((ours.float() - official).abs().max().item())

    if "eval_times" in outputs:  # ELF: the network output is the prediction; the decode pass gives the logits
        from untied_sc.models.elf_transformer import ELFTransformerOutput

        network = pipe.transformer.forward

        def forward(sample, timestep, self_conditioning=None, sc_cfg_scale=None, decoder_step_active=None, **_):
            assert sc_cfg_scale == sampler["sc_cfg_scale"]
            if decoder_step_active:
                if network_errors is not None:
                    ours = network(sample, timestep, self_conditioning, sc_cfg_scale, decoder_step_active=True)
                    compare(ours.logits, outputs["decode_logits"])
                return ELFTransformerOutput(sample=sample, logits=outputs["decode_logits"])
            k = check(timestep, outputs["eval_times"], self_conditioning)
            if network_errors is not None:
                compare(network(sample, timestep, self_conditioning, sc_cfg_scale).sample, outputs["predictions"][k])
            return ELFTransformerOutput(sample=outputs["predictions"][k])

        pipe.transformer.forward = forward
    else:  # LangFlow: the recorded prediction is x̂ = softmax(logits)·E_norm, past the network and the softmax
        network = pipe._predict
        rows = outputs["trajectory_rows"]

        def predict(model_input, timestep, self_conditioning):
            k = check(timestep, outputs["grid"], self_conditioning)
            ours = network(model_input, timestep, self_conditioning) if network_errors is not None else None
            if k < len(outputs["predictions"]):
                if ours is not None:
                    compare(ours[0], outputs["predictions"][k])
                return outputs["predictions"][k], None
            logits = outputs["final_logits"][rows]  # the final evaluation: its argmax, the tokens
            if ours is not None:
                compare(ours[1], logits)
            return pipe.transformer.clean_prediction(logits), logits

        pipe._predict = predict
    return calls


def run_from_official_latents(pipe, golden: Golden, monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """
    The pipeline run one step at a time from the official trajectory: every step starts from the official latent
    z_k and gives the network the official self-conditioning input (the official prediction of step k − 1), on the
    official draws. So each z_{k+1} is one call of our network and one step of our sampler from the official state,
    with no error carried over from earlier steps: the comparison cannot drift, whatever the number of steps.
    Returns max |ours − official| of z_{k+1} for every step that updates the latent.
    """
    outputs = golden.outputs
    official_latents, predictions = outputs["trajectory"], outputs["predictions"]
    replay_official_draws(golden, monkeypatch)
    calls = []

    def official_self_conditioning(self_conditioning):
        k = len(calls)
        calls.append(k)
        return self_conditioning if k == 0 else predictions[k - 1].to(self_conditioning.dtype)

    if "eval_times" in outputs:  # ELF: the self-conditioning input goes to the network; the decode pass is not a step
        network = pipe.transformer.forward

        def forward(sample, timestep, self_conditioning=None, sc_cfg_scale=None, decoder_step_active=None, **kwargs):
            if not decoder_step_active:
                self_conditioning = official_self_conditioning(self_conditioning)
            return network(sample, timestep, self_conditioning, sc_cfg_scale, decoder_step_active, **kwargs)

        monkeypatch.setattr(pipe.transformer, "forward", forward)
    else:  # LangFlow: through the pipeline's prediction, which takes the self-conditioning input
        predict = pipe._predict

        def predict_from_official(model_input, timestep, self_conditioning, **kwargs):
            return predict(model_input, timestep, official_self_conditioning(self_conditioning), **kwargs)

        monkeypatch.setattr(pipe, "_predict", predict_from_official)
    errors = []

    def step_from_official(pipe, step, timestep, tensors):
        if step >= len(official_latents):  # LangFlow's final evaluation updates nothing
            return {}
        errors.append((tensors["latents"] - official_latents[step]).abs().max().item())
        return {"latents": official_latents[step].clone()}

    pipe.set_progress_bar_config(disable=True)
    pipe(**golden_call(golden), output_type="latent", callback_on_step_end=step_from_official)
    assert len(errors) == len(official_latents), (
        f"{len(errors)} steps compared, the official run has {len(official_latents)}"
    )
    return errors


@pytest.fixture
def one_thread():
    """Torch on one thread for the test: tiny tensors run as fast, and a second thread only contends on a machine
    whose cores are busy (a small matmul then waits ~15 ms, a 6x slowdown of a whole module measured there)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


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
