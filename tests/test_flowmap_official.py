"""The flow-map family against the official code (github.com/Ugness/self-conditioned-fmlm@f2472c9), on recordings.

`tests/fixtures/{fmlm_star,elf_star}_sample.safetensors` were written by `tests/fixtures/make_flowmap_fixtures.py`:
the official network on tiny random weights, its forward on fixed inputs, and every official sampler (FMLM*:
`flowmap` and `ctm` with γ 0 / 0.75 / 1, self-conditioning-free and chained; ELF*: `cdeq` with γ 0 / 1.5) at 1, 2, 4
and 8 steps; the stage-1 ELF teacher: `sde` (γ 1.5) and `ode` at 2, 4 and 8 steps), seeded as the official
evaluation, with every network call, latent and token id.

- the network: each recorded call within `NETWORK_TOLERANCE` (float32 sums in a CPU-dependent order);
- each sampler given the official draws, grid and network outputs (replayed, ours checked first): every network
  input (latent, SC input, times), every latent, the final latent, bit for bit;
- the pipeline's normal draws from the run's seed: the official ones, every one in order (to the bit with the
  vectorised kernels the fixtures were recorded with, within `DRAW_TOLERANCE` with the scalar ones);
- the pipeline free-running with our network on the official draws: the official token ids, and the final latent
  within a loose bound.

The recorded draws (`run.<name>.draw.<i>`: the grid normals, z_0 before the noise scale, each step's noise) are what
lets the sampler be compared bit for bit under every kernel set: torch's normal kernel rounds otherwise without AVX2
(`ATEN_CPU_CAPABILITY=default`), so a draw from the same seed is equal to the bit only with the vectorised kernels.
"""

import json

import pytest
import torch
from safetensors import safe_open

from untied_sc.models.flowmap_transformer import _RENAMES, FlowMapTransformerModel, flowmap_config_from_state_dict
from untied_sc.pipelines.pipeline_flowmap import FlowMapPipeline
from untied_sc.schedulers import scheduling_elf, scheduling_flowmap
from untied_sc.schedulers.scheduling_elf import ELFScheduler
from untied_sc.schedulers.scheduling_flowmap import CDEQScheduler, FlowMapLMScheduler

from .conftest import (
    FIXTURES,
    NETWORK_TOLERANCE,
    assert_official_draw,
    assert_within,
    replay_official_grid,
    watch_draws,
)


FILES = {"fmlm_star": "fmlm-star", "elf_star": "elf-star", "elf_teacher": "elf"}
# A free-running trajectory (on the official draws) carries each call's rounding (≤ NETWORK_TOLERANCE) through at most
# 8 steps (ELF's SDE with w = 3 amplifies it, conftest.py); our network sums in another order than the official one.
# The worst final-latent drift measured on the AVX-512 EPYC that wrote the fixtures, under ATEN_CPU_CAPABILITY
# default / avx2 / avx512: 2.2e-6 / 2.3e-6 / 2.9e-6 (FMLM*), 2.4e-6 / 2.2e-6 / 2.3e-6 (ELF*), 6.4e-6 / 6.9e-6 /
# 5.4e-6 (the teacher's SDE). About 15x that, as conftest.py's ELF bound at 8 steps.
FREE_RUNNING_BOUND = 1e-4


class Recording:
    def __init__(self, name: str):
        with safe_open(FIXTURES / f"{name}_sample.safetensors", "pt") as handle:
            meta = handle.metadata()
            self.tensors = {key: handle.get_tensor(key) for key in handle.keys()}
        self.runs = json.loads(meta["runs"])
        self.variant = FILES[name]
        self.official_config = json.loads(meta["config"])

    def run(self, name: str) -> dict[str, torch.Tensor]:
        prefix = f"run.{name}."
        return {k.removeprefix(prefix): v for k, v in self.tensors.items() if k.startswith(prefix)}

    def draws(self, name: str) -> list[torch.Tensor]:
        """Every normal the official run drew from its generator, in order."""
        run = self.run(name)
        return [run[f"draw.{i}"] for i in range(self.runs[name]["draws"])]

    def model(self) -> FlowMapTransformerModel:
        weights = {_RENAMES.get(k[7:], k[7:]): v for k, v in self.tensors.items() if k.startswith("weight.")}
        config = flowmap_config_from_state_dict(weights, self.official_config["max_length"], self.variant)
        model = FlowMapTransformerModel(**config).eval()
        model.load_state_dict(weights)
        return model


RECORDINGS = {name: Recording(name) for name in FILES}
RUNS = [(name, run) for name, rec in RECORDINGS.items() for run in rec.runs]


def zero_weight_draws(meta: dict) -> int:
    """
    Draws our scheduler makes that the official run does not: the teacher's `ode` runs on `ELFScheduler` with γ = 0,
    whose every non-final step still draws its noise (as ELF's official SDE does at any γ, solvers.py) and weights it
    by 1 − α = 0, where the official `ode_step` draws none. They come after all the official draws and change no
    latent (the latents are compared bit for bit), only the generator's state after the run.
    """
    return meta["steps"] - 1 if meta["method"] == "ode" else 0


class RunDraws:
    """
    The official run's draws replayed in order (each of ours checked first, `assert_official_draw`, as
    conftest's `replay_draws`), then its `zero_weight_draws` let through as drawn; `check()` after the run: all of
    the official draws were made, and exactly the zero-weight ones beside, of the latent's shape.
    """

    def __init__(self, rec: Recording, run_name: str, monkeypatch):
        self.name, self.meta, self.official = run_name, rec.runs[run_name], rec.draws(run_name)
        self.replayed, self.extra = [], []
        watch_draws(monkeypatch, self._replay)

    def _replay(self, drawn: torch.Tensor) -> torch.Tensor:
        i = len(self.replayed)
        if i < len(self.official):
            assert_official_draw(drawn, self.official[i], f"{self.name}: draw {i}")
            self.replayed.append(i)
            return self.official[i].clone()
        self.extra.append(drawn)
        return drawn

    def check(self) -> None:
        made, official = len(self.replayed), len(self.official)
        assert made == official, f"{self.name}: {made} draws, the official run made {official}"
        shapes = [tuple(draw.shape) for draw in self.extra]
        latent = tuple(self.official[-1].shape)
        assert shapes == [latent] * zero_weight_draws(self.meta), (
            f"{self.name}: draws {shapes} beyond the official run's; only {zero_weight_draws(self.meta)} zero-weight "
            f"ones of shape {latent}"
        )


def scheduler_for(meta: dict):
    if meta["method"] in ("sde", "ode"):  # the teacher: ELF's sampler (an ODE is the SDE without churn)
        return ELFScheduler(sde_gamma=meta["gamma"])
    if meta["method"] == "cdeq":
        return CDEQScheduler(gamma=meta["gamma"])
    sampler = "flow_map" if meta["method"] == "flowmap" else "ctm"
    return FlowMapLMScheduler(
        sampler=sampler, gamma=meta["gamma"], self_conditioning="free" if meta["sc_free"] else "chained"
    )


@pytest.mark.parametrize("name", FILES)
def test_forward_matches_official(name, one_thread):
    rec = RECORDINGS[name]
    model = rec.model()
    for i in range(4):
        f = {k.split(".", 2)[2]: v for k, v in rec.tensors.items() if k.startswith(f"forward.{i}.")}
        decode = "logits" in f
        with torch.no_grad():
            out = model(f["sample"], f["t"], f["s"], f["sc"], f["w"], f.get("phase"), decoder_step_active=decode)
        assert_within((out.sample - f["output"]).abs().max().item(), NETWORK_TOLERANCE, f"{name} forward {i}")
        if decode:
            assert_within((out.logits - f["logits"]).abs().max().item(), NETWORK_TOLERANCE, f"{name} logits")
            assert torch.equal(out.logits.argmax(-1), f["logits"].argmax(-1))


def test_recordings_depend_on_times_phase_and_self_conditioning():
    """The recordings can catch a wrong s, t, phase or SC input: the official outputs move with each."""
    rec = RECORDINGS["fmlm_star"]
    model = rec.model()
    f = {k.split(".", 2)[2]: v for k, v in rec.tensors.items() if k.startswith("forward.0.")}
    base = model(f["sample"], f["t"], f["s"], f["sc"], f["w"]).sample
    for change in ({"source_timestep": f["t"]}, {"phase": 0.5}, {"self_conditioning": None}, {"timestep": f["s"]}):
        kwargs = {"timestep": f["t"], "source_timestep": f["s"], "self_conditioning": f["sc"], "sc_cfg_scale": f["w"]}
        kwargs.update(change)
        assert (model(f["sample"], **kwargs).sample - base).abs().max() > 1e-3, change


# Where each scheduler computes its grid: the official run's grid is replayed there (ours checked to `GRID_ULPS`).
GRID_FUNCTIONS = {
    FlowMapLMScheduler: (scheduling_flowmap, "flowmap_time_grid"),
    CDEQScheduler: (scheduling_flowmap, "cdeq_time_grid"),
    ELFScheduler: (scheduling_elf, "elf_time_grid"),
}


def replay(rec: Recording, run_name: str, monkeypatch):
    """Runs our scheduler on the official draws, grid and network outputs (each of ours checked first), checking
    every network input on the way; returns the latents after each step."""
    meta, run = rec.runs[run_name], rec.run(run_name)
    scheduler = scheduler_for(meta)
    draws = RunDraws(rec, run_name, monkeypatch)
    grid_function = next(where for cls, where in GRID_FUNCTIONS.items() if isinstance(scheduler, cls))
    replay_official_grid(*grid_function, run["t_steps"], monkeypatch)
    generator = torch.Generator().manual_seed(meta["seed"])
    if isinstance(scheduler, CDEQScheduler):
        scheduler.set_timesteps(meta["steps"], generator=generator)
    elif isinstance(scheduler, ELFScheduler):
        scheduler.set_timesteps(meta["steps"], generator=generator, grid_generator=generator)
    else:
        scheduler.set_timesteps(meta["steps"])
    grid = torch.tensor(scheduler.solver.grid if isinstance(scheduler, ELFScheduler) else scheduler._grid)
    assert torch.equal(grid, run["t_steps"]), "time grid"
    z = torch.randn(run["z0"].shape, generator=generator) * scheduler.config.noise_scale
    assert torch.equal(z, run["z0"]), "z_0"
    calls, latents = iter(range(len(run["call_output"]))), []

    def official_call(sample, sc, target, source):
        i = next(calls)
        assert torch.equal(sample, run["call_sample"][i]), f"call {i}: latent input"
        assert torch.equal(sc, run["call_sc"][i]), f"call {i}: self-conditioning input"
        assert torch.equal(torch.full_like(run["call_t"][i], float(target)), run["call_t"][i]), f"call {i}: t"
        assert torch.equal(torch.full_like(run["call_s"][i], float(source)), run["call_s"][i]), f"call {i}: s"
        return run["call_output"][i]

    for k, t in enumerate(scheduler.timesteps):
        t = float(t)
        if isinstance(scheduler, ELFScheduler):
            model_input = scheduler.scale_model_input(z, t)
            sc = scheduler.self_conditioning
            prediction = official_call(model_input, torch.zeros_like(z) if sc is None else sc, t, t)
            z = scheduler.step(prediction, t, z).prev_sample
        elif isinstance(scheduler, CDEQScheduler):
            model_input = scheduler.scale_model_input(z)
            t_b = scheduler.model_timestep()
            prediction = official_call(model_input, torch.zeros_like(z), t_b, t_b)
            z = scheduler.step(prediction, t, z).prev_sample
        else:
            if scheduler.needs_prepass:
                scheduler.set_prepass(official_call(z, torch.zeros_like(z), t, t))
            target = scheduler.prediction_timesteps[k]
            prediction = official_call(z, scheduler.self_conditioning_input(z), target, t)
            z = scheduler.step(prediction, t, z, generator=generator).prev_sample
        latents.append(z)
    assert next(calls, None) is None, "fewer network calls than the official sampler"
    draws.check()
    return torch.stack(latents)


@pytest.mark.parametrize(("name", "run_name"), RUNS)
def test_sampler_bit_for_bit_given_official_outputs(name, run_name, monkeypatch):
    rec = RECORDINGS[name]
    run = rec.run(run_name)
    latents = replay(rec, run_name, monkeypatch)
    assert torch.equal(latents, run["latents"]), f"{run_name}: max diff {(latents - run['latents']).abs().max()}"
    assert torch.equal(latents[-1], run["final"])


def run_pipeline(rec: Recording, run_name: str):
    """Our pipeline with our network, as the official run: its batch, steps, seed and SC-CFG scale."""
    meta, run = rec.runs[run_name], rec.run(run_name)
    pipe = FlowMapPipeline(rec.model(), scheduler_for(meta))
    pipe.set_progress_bar_config(disable=True)
    return pipe(
        batch_size=run["z0"].shape[0],
        num_inference_steps=meta["steps"],
        generator=torch.Generator().manual_seed(meta["seed"]),
        sc_cfg_scale=meta["w"],
        output_type="seq",
    )


@pytest.mark.parametrize(("name", "run_name"), RUNS)
def test_pipeline_draws_the_official_normals_from_the_seed(name, run_name, monkeypatch, one_thread):
    """
    The pipeline draws from the run's seed what the official run drew: every normal, in order, of its shape. Equal to
    the bit with the vectorised kernels the fixtures were recorded with (avx2, avx512); within `DRAW_TOLERANCE` with
    the scalar ones (`ATEN_CPU_CAPABILITY=default`), whose Box-Muller rounds log/sin/cos otherwise. Not skipped there:
    a wrong, reordered, missing or extra draw is off by O(1) or changes the count, on every kernel set.
    """
    rec = RECORDINGS[name]
    drawn = []
    watch_draws(monkeypatch, lambda draw: drawn.append(draw.clone()) or draw)
    run_pipeline(rec, run_name)
    official, extra = rec.draws(run_name), zero_weight_draws(rec.runs[run_name])
    assert len(drawn) == len(official) + extra, (
        f"{run_name}: {len(drawn)} draws, the official run made {len(official)} (and {extra} zero-weight ones beside)"
    )
    for i, (ours, theirs) in enumerate(zip(drawn[: len(official)], official, strict=True)):
        assert_official_draw(ours, theirs, f"{run_name}: draw {i}")


@pytest.mark.parametrize(("name", "run_name"), RUNS)
def test_pipeline_free_running_gives_official_tokens(name, run_name, monkeypatch, one_thread):
    rec = RECORDINGS[name]
    run = rec.run(run_name)
    draws = RunDraws(rec, run_name, monkeypatch)  # our network, the official draws
    out = run_pipeline(rec, run_name)
    draws.check()
    assert torch.equal(out.sequences, run["ids"]), f"{run_name}: tokens differ"
    assert_within((out.latents - run["final"]).abs().max().item(), FREE_RUNNING_BOUND, f"{run_name} final latent")


def test_recorded_samplers_differ():
    """The runs are not one trajectory under many names: γ, the regime and the step count change the tokens."""
    rec = RECORDINGS["fmlm_star"]
    ids = {name: rec.run(name)["ids"] for name in rec.runs}
    assert not torch.equal(ids["ctm_g0.0_n4"], ids["ctm_g1.0_n4"])
    assert not torch.equal(ids["flowmap_scfree_n4"], ids["flowmap_hybrid_n4"])
    assert not torch.equal(ids["ctm_g0.0_n1"], ids["ctm_g0.0_n4"])
    # ctm with γ = 0 is the flow map step (its re-placement with ε_old is the same affine map); the latents agree to
    # float rounding, not to the bit.
    a, b = rec.run("ctm_g0.0_n4")["final"], rec.run("flowmap_scfree_n4")["final"]
    assert (a - b).abs().max() < 1e-4
