"""The untied SC transform on a flow map (docs/algorithm.md "Self-conditioned flow maps"), on the recorded tiny model.

- η_R = 0 is the official sampler bit for bit (replayed official network outputs, and free-running tokens);
- a self-conditioning-free model (the released FMLM*) is left as it is at any η_R: its SC input is zero;
- the overlap basis, the calibrated cosine distances and the transformed SC input, each against a float64 reference
  written here (projectors, eigen-decomposition, explicit recursions) that shares no code with the package.
"""

import functools
import math

import pytest
import torch

from untied_sc.calibration.flowmap import chained_predictions, flowmap_statistics
from untied_sc.pipelines.pipeline_flowmap import FlowMapPipeline
from untied_sc.schedulers.flowmap_statistics import FlowMapStatistics
from untied_sc.schedulers.scheduling_flowmap import FlowMapLMScheduler, UntiedFlowMapLMScheduler

from .test_flowmap_official import RECORDINGS


CHAINED = [name for name, meta in RECORDINGS["fmlm_star"].runs.items() if not meta["sc_free"]]


def untied_for(meta, eta_r=0.0):
    return UntiedFlowMapLMScheduler(
        sampler="flow_map" if meta["method"] == "flowmap" else "ctm",
        gamma=meta["gamma"],
        self_conditioning="free" if meta["sc_free"] else "chained",
        eta_r=eta_r,
    )


def given_statistics(scheduler, statistics):
    """`scheduler` whose every `set_timesteps` gets `statistics` (a direct caller's keyword), for a loop that calls
    it without them."""
    scheduler.set_timesteps = functools.partial(scheduler.set_timesteps, flowmap_statistics=statistics)
    return scheduler


@pytest.fixture(scope="module")
def model():
    return RECORDINGS["fmlm_star"].model()


@pytest.fixture(scope="module")
def statistics(model):
    torch.set_num_threads(1)
    scheduler = FlowMapLMScheduler(sampler="ctm", gamma=0.75, self_conditioning="chained")
    return flowmap_statistics(model, scheduler, [2, 4, 8], sc_cfg_scale=5.0, num_trajectories=4, batch_size=2)


@pytest.mark.parametrize("run_name", CHAINED)
def test_zero_strength_is_the_official_sampler_bit_for_bit(run_name, monkeypatch, statistics):
    rec = RECORDINGS["fmlm_star"]
    run = rec.run(run_name)
    import tests.test_flowmap_official as official_tests

    monkeypatch.setattr(official_tests, "scheduler_for", lambda m: given_statistics(untied_for(m, 0.0), statistics))
    latents = official_tests.replay(rec, run_name, monkeypatch)
    assert torch.equal(latents, run["latents"])


def _sample(model, scheduler, steps, seed=42, statistics=None):
    pipe = FlowMapPipeline(model, scheduler, flowmap_statistics=statistics)
    pipe.set_progress_bar_config(disable=True)
    generator = torch.Generator().manual_seed(seed)
    return pipe(batch_size=2, num_inference_steps=steps, generator=generator, sc_cfg_scale=5.0, output_type="seq")


def test_self_conditioning_free_model_is_unchanged_at_any_strength(model, statistics, one_thread):
    run = RECORDINGS["fmlm_star"].run("ctm_g0.75_n4")
    meta = RECORDINGS["fmlm_star"].runs["ctm_g0.75_n4"]
    out = _sample(model, untied_for(meta, eta_r=2.0), 4, statistics=statistics)
    assert torch.equal(out.sequences, run["ids"])


def test_positive_strength_changes_a_chained_run(model, statistics, one_thread):
    meta = RECORDINGS["fmlm_star"].runs["ctm_hybrid_g0.75_n4"]
    official = _sample(model, untied_for(meta), 4)
    untied = _sample(model, untied_for(meta, eta_r=3.0), 4, statistics=statistics)
    assert torch.equal(official.sequences, RECORDINGS["fmlm_star"].run("ctm_hybrid_g0.75_n4")["ids"])
    assert (untied.latents - official.latents).abs().max() > 1e-4


def reference_overlap_operator(weights):
    """K = P_m P_z P_m in float64 from projectors P = Wᵀ(W Wᵀ)⁺W onto the rows of each effective input map."""
    w_sc = weights["self_cond_proj.weight"].double()
    w_b = weights["text_proj.proj1.weight"].double()
    d = w_sc.shape[0]
    w_z, w_m = w_b @ w_sc[:, :d], w_b @ w_sc[:, d:]

    def projector(w):
        return w.T @ torch.linalg.pinv(w @ w.T) @ w

    p_z, p_m = projector(w_z), projector(w_m)
    return p_m @ p_z @ p_m, p_m


def test_overlap_basis_against_a_float64_reference(statistics):
    weights = {k.removeprefix("weight."): v for k, v in RECORDINGS["fmlm_star"].tensors.items() if "weight." in k}
    k_ref, p_m = reference_overlap_operator(weights)
    eigenvalues = torch.linalg.eigvalsh(k_ref).flip(0)
    q, rho_sq = statistics.basis.double(), statistics.rho_sq.double()
    rank = q.shape[1]
    assert rank == round(torch.trace(p_m).item())  # r = rank W_m (8: the bottleneck)
    torch.testing.assert_close(q.T @ q, torch.eye(rank, dtype=torch.float64), atol=1e-6, rtol=0)
    torch.testing.assert_close(rho_sq, eigenvalues[:rank], atol=1e-6, rtol=0)
    torch.testing.assert_close(q @ torch.diag(rho_sq) @ q.T, k_ref, atol=1e-6, rtol=0)
    assert 0 < rho_sq.min() and rho_sq.max() < 1  # a partial overlap: the transform has something to act on


def reference_cosine_distances(predictions, kappa, alpha):
    """δ̄_k per sample, float64, from the definitions: H = p − E, G = ‖H‖(p − O)/‖p − O‖, token cosines."""
    out = []
    e = o = torch.zeros_like(predictions[0])
    for k, p in enumerate(predictions):
        h = p - e
        d = p - o
        nh, nd, np_ = (x.flatten(1).norm(dim=1).view(-1, 1, 1) for x in (h, d, p))
        ok = (nh > 1e-12 * np_) & (nd > 1e-12 * np_)
        g = torch.where(ok, d * nh / torch.where(ok, nd, 1.0), 0.0)
        dot = (h * g).sum(-1)
        norms = h.norm(dim=-1) * g.norm(dim=-1)
        cos = torch.where(norms > 0, dot / torch.where(norms > 0, norms, 1.0), 1.0)
        out.append((1 - cos).clamp(0, 1).mean(-1))
        e = (1 - alpha) * e + alpha * p
        o = (1 - kappa[k]) * o + kappa[k] * p
    return torch.stack(out, 1)


def reference_kappa(t0, t1, gamma):
    """ctm: z' = t1 x̂ + (1 − t1)(c (z − t0 x̂)/(1 − t0) + g ε): the x̂ coefficient over t1 (1 on the last step)."""
    if t1 >= 1:
        return 1.0
    c = math.sqrt(1 - min(gamma, 1.0) ** 2)
    return (t1 - c * (1 - t1) * t0 / (1 - t0)) / t1


def test_cosine_distances_against_a_float64_reference(model, statistics, one_thread):
    for steps in (2, 4, 8):
        rows = []
        for batch in range(2):  # the calibration's batches: seeds 0 and 1, two trajectories each
            scheduler = FlowMapLMScheduler(sampler="ctm", gamma=0.75, self_conditioning="chained")
            generator = torch.Generator().manual_seed(batch)
            predictions = chained_predictions(model, scheduler, steps, 2, 5.0, generator)
            grid = scheduler.timesteps.tolist() + [1.0]
            kappa = [reference_kappa(grid[k], grid[k + 1], 0.75) for k in range(steps)]
            rows.append(reference_cosine_distances([p.double() for p in predictions], kappa, 0.8))
        expected = torch.cat(rows).mean(0)
        torch.testing.assert_close(statistics.cosine_distance[steps].double(), expected, atol=1e-6, rtol=0)
        assert statistics.cosine_distance[steps][0] < 1e-12  # E_0 = O_0 = 0: H_0 ∥ G_0
        assert statistics.cosine_distance[steps][1:].max() > 1e-3  # the statistic is not trivially zero


def test_transformed_input_against_a_float64_reference(model, statistics, one_thread):
    """Step 1 of a chained ctm run at η_R = 2: m̃_1 = (I − Q(I − diag ℓ)Qᵀ) m_1, ℓ from â_1 = κ_0 (1 − δ̄_0)."""
    eta_r, steps = 2.0, 4
    scheduler = untied_for({"method": "ctm", "gamma": 0.75, "sc_free": False}, eta_r)
    scheduler.set_timesteps(steps, flowmap_statistics=statistics)
    z = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(3)) * 2.0
    prediction = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(4))
    scheduler.set_prepass(torch.zeros_like(z))
    scheduler.step(prediction, scheduler.timesteps[0], z, generator=torch.Generator().manual_seed(5))
    ours = scheduler.self_conditioning_input(z).double()

    grid = scheduler.timesteps.tolist() + [1.0]
    a_hat = reference_kappa(grid[0], grid[1], 0.75) * (1 - float(statistics.cosine_distance[steps][0]))
    rho_sq, q = statistics.rho_sq.double(), statistics.basis.double()
    b = torch.clamp(1 - a_hat * rho_sq, min=0.01)
    ell = (b.prod() ** (1 / len(b)) * b) ** eta_r
    expected = prediction.double() @ (torch.eye(16, dtype=torch.float64) - q @ torch.diag(1 - ell) @ q.T)
    torch.testing.assert_close(ours, expected, atol=1e-5, rtol=0)
    assert (ours - prediction.double()).abs().max() > 1e-2


def test_strength_needs_statistics_for_the_step_count(statistics):
    scheduler = untied_for({"method": "ctm", "gamma": 1.0, "sc_free": False}, 1.0)
    with pytest.raises(ValueError, match=r"flowmap_statistics.*set_timesteps\(N, flowmap_statistics=\.\.\.\)"):
        scheduler.set_timesteps(4)
    with pytest.raises(ValueError, match="calibrate at that N"):
        scheduler.set_timesteps(3, flowmap_statistics=statistics)
    scheduler.set_timesteps(4, flowmap_statistics=statistics)
    with pytest.raises(ValueError, match="flowmap_statistics"):  # a run's statistics are its own: none carried over
        scheduler.set_timesteps(4)
    assert isinstance(statistics, FlowMapStatistics)


def test_config_and_statistics_round_trip(tmp_path, statistics):
    untied = UntiedFlowMapLMScheduler(sampler="flow_map", self_conditioning="chained", eta_r=1.5)
    untied.save_config(tmp_path / "scheduler")
    loaded = UntiedFlowMapLMScheduler.from_pretrained(tmp_path / "scheduler")
    assert (loaded.config.sampler, loaded.config.self_conditioning, loaded.config.eta_r) == (
        "flow_map",
        "chained",
        1.5,
    )
    official = FlowMapLMScheduler.from_config(untied.config)  # the official sampler of the same run
    assert (official.config.sampler, official.config.self_conditioning) == ("flow_map", "chained")
    statistics.save_pretrained(tmp_path / "statistics")
    again = FlowMapStatistics.from_pretrained(tmp_path / "statistics")
    assert torch.equal(again.basis, statistics.basis) and torch.equal(again.rho_sq, statistics.rho_sq)
    assert again.cosine_distance.keys() == statistics.cosine_distance.keys()
    assert all(torch.equal(again.cosine_distance[n], d) for n, d in statistics.cosine_distance.items())
